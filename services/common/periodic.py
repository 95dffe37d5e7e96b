"""A background loop in a service process: the ledger's hold sweep, the trainer's and grader's reconcilers."""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog


class Periodic:
    """Call ``fn()`` every ``interval_s`` seconds in a daemon thread until :meth:`stop`.

    The first call happens at once. An exception is logged and the loop goes on: a database that is
    briefly away must not end the sweep for the life of the process.
    """

    def __init__(self, name: str, interval_s: float, fn: Callable[[], object]) -> None:
        self.name = name
        self.interval_s = interval_s
        self.fn = fn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._log = structlog.get_logger(name)

    def start(self) -> Periodic:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                result = self.fn()
                if result:
                    self._log.info("periodic task acted", task=self.name, result=result)
            except Exception:  # noqa: BLE001 - logged; the next round tries again
                self._log.exception("periodic task failed", task=self.name)
            self._stop.wait(self.interval_s)

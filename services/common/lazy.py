"""``once``: a thread-safe, lazily built process-wide value (a service's settings, database and clients)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def once(build: Callable[[], T]) -> Callable[[], T]:
    """Wrap a zero-argument ``build`` so it runs at most once per process, even under concurrent first calls."""
    lock = threading.Lock()
    box: list[T] = []

    @functools.wraps(build)
    def get() -> T:
        if not box:
            with lock:
                if not box:
                    box.append(build())
        return box[0]

    return get

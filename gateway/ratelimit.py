"""Per-key rate limits of the gateway, counted by the ``limits`` library (moving window)."""

from __future__ import annotations

import math
import time

from limits import parse_many
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

from services.common.errors import TooManyRequests


class KeyRateLimiter:
    """``check(key)`` counts one request of ``key`` against every limit; ``TooManyRequests`` past one.

    ``spec``: e.g. ``"30/second;1200/minute"`` (empty: unlimited). ``storage``: ``memory://`` counts per
    process; ``redis://…`` shares the counts between gateway replicas.
    """

    def __init__(self, spec: str, storage: str = "memory://") -> None:
        self.limits = parse_many(spec) if spec.strip() else []
        self.limiter = MovingWindowRateLimiter(storage_from_string(storage)) if self.limits else None

    def check(self, key: str) -> None:
        """Record a hit of ``key``; raise ``TooManyRequests`` (``retry_after_s``: seconds until a slot frees) if over a limit."""
        if self.limiter is None:
            return
        for limit in self.limits:
            if not self.limiter.hit(limit, key):
                reset = self.limiter.get_window_stats(limit, key).reset_time
                raise TooManyRequests(f"more than {limit} requests with this key; slow down",
                                      limit=str(limit), retry_after_s=max(1, math.ceil(reset - time.time())))

"""Per-key rate limits of the gateway, counted by the ``limits`` library (moving window).

A request is counted when it arrives, on the event loop, before it waits for anything (a thread, the
database, another service): a client that paces itself under the limit is never refused because the gateway
happened to get to its requests late and all at once. Past a limit: 429 problem+json with ``retry_after_s``.
"""

from __future__ import annotations

import math
import time

from limits import parse_many
from limits.aio.strategies import MovingWindowRateLimiter
from limits.storage import storage_from_string

from services.common.errors import TooManyRequests


class KeyRateLimiter:
    """``await check(key)`` counts one request of ``key`` against every limit; ``TooManyRequests`` past one.

    ``spec``: e.g. ``"30/second;1200/minute"`` (empty: unlimited). ``storage``: ``memory://`` counts per
    process; ``redis://…`` shares the counts between gateway replicas (redis-py's asyncio client).
    """

    def __init__(self, spec: str, storage: str = "memory://") -> None:
        self.limits = parse_many(spec) if spec.strip() else []
        options = {"implementation": "redispy"} if storage.startswith(("redis://", "rediss://")) else {}
        self.limiter = MovingWindowRateLimiter(storage_from_string(f"async+{storage}", **options)) if self.limits else None

    async def check(self, key: str) -> None:
        """Record a hit of ``key``; raise ``TooManyRequests`` (``retry_after_s``: seconds until a slot frees) if over a limit."""
        if self.limiter is None:
            return
        for limit in self.limits:
            if not await self.limiter.hit(limit, key):
                reset = (await self.limiter.get_window_stats(limit, key)).reset_time
                raise TooManyRequests(f"more than {limit} requests with this key; slow down",
                                      limit=str(limit), retry_after_s=max(1, math.ceil(reset - time.time())))

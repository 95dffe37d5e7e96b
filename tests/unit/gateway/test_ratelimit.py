"""Per-key rate limits (gateway.ratelimit) in memory and on the real Redis that production shares between replicas."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from gateway.ratelimit import KeyRateLimiter
from services.common.errors import TooManyRequests
from tests.conftest import REDIS_URL


def check(limiter: KeyRateLimiter, key: str, times: int = 1) -> None:
    async def hits() -> None:
        for _ in range(times):
            await limiter.check(key)

    asyncio.run(hits())


def test_a_key_past_its_limit_gets_429_with_retry_after_and_other_keys_do_not() -> None:
    limiter = KeyRateLimiter("3/minute")
    check(limiter, "run_a", 3)
    with pytest.raises(TooManyRequests) as exc:
        check(limiter, "run_a")
    assert exc.value.status == 429 and 1 <= exc.value.extra["retry_after_s"] <= 60 and exc.value.extra["limit"] == "3 per 1 minute"
    check(limiter, "run_b")


def test_every_limit_of_the_list_applies() -> None:
    limiter = KeyRateLimiter("100/second;2/hour")
    check(limiter, "k", 2)
    with pytest.raises(TooManyRequests) as exc:
        check(limiter, "k")
    assert exc.value.extra["retry_after_s"] > 3000


def test_no_limit_when_empty() -> None:
    check(KeyRateLimiter(""), "k", 1000)


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["memory://", REDIS_URL])
def test_a_key_pacing_itself_at_a_third_of_the_default_limits_is_never_refused(storage: str) -> None:
    """The gateway's default limits, 10 requests a second for 6 s (a slow machine may send some late, never early)."""
    from gateway.settings import GatewaySettings

    limiter, key = KeyRateLimiter(GatewaySettings.model_fields["rate_limits"].default, storage), f"run_{uuid.uuid4().hex}"

    async def paced() -> None:
        start = time.monotonic()
        for i in range(60):
            await asyncio.sleep(max(0.0, start + i / 10 - time.monotonic()))
            await limiter.check(key)

    asyncio.run(paced())


def test_gateway_replicas_sharing_redis_share_the_count() -> None:
    key = f"run_{uuid.uuid4().hex}"
    one, two = KeyRateLimiter("4/minute", REDIS_URL), KeyRateLimiter("4/minute", REDIS_URL)

    async def hits() -> None:
        for limiter in (one, two, one, two):
            await limiter.check(key)
        with pytest.raises(TooManyRequests):
            await one.check(key)
        await two.check(f"run_{uuid.uuid4().hex}")  # another key has its own count

    asyncio.run(hits())

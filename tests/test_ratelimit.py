"""Per-key rate limits (gateway.ratelimit) in memory and on the real Redis that production shares between replicas."""

from __future__ import annotations

import uuid

import pytest

from gateway.ratelimit import KeyRateLimiter
from services.common.errors import TooManyRequests
from tests.conftest import REDIS_URL


def test_a_key_past_its_limit_gets_429_with_retry_after_and_other_keys_do_not() -> None:
    limiter = KeyRateLimiter("3/minute")
    for _ in range(3):
        limiter.check("run_a")
    with pytest.raises(TooManyRequests) as exc:
        limiter.check("run_a")
    assert exc.value.status == 429 and 1 <= exc.value.extra["retry_after_s"] <= 60 and exc.value.extra["limit"] == "3 per 1 minute"
    limiter.check("run_b")


def test_every_limit_of_the_list_applies() -> None:
    limiter = KeyRateLimiter("100/second;2/hour")
    limiter.check("k")
    limiter.check("k")
    with pytest.raises(TooManyRequests) as exc:
        limiter.check("k")
    assert exc.value.extra["retry_after_s"] > 3000


def test_no_limit_when_empty() -> None:
    limiter = KeyRateLimiter("")
    for _ in range(1000):
        limiter.check("k")


def test_gateway_replicas_sharing_redis_share_the_count() -> None:
    key = f"run_{uuid.uuid4().hex}"
    one, two = KeyRateLimiter("4/minute", REDIS_URL), KeyRateLimiter("4/minute", REDIS_URL)
    one.check(key)
    two.check(key)
    one.check(key)
    two.check(key)
    with pytest.raises(TooManyRequests):
        one.check(key)

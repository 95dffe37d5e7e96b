"""The one docker-compose deployment every module of ``tests/compose`` uses (the live tests, then the soak test)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator

import pytest

from tests.compose.deployment import SANDBOX_DIR, Deployment, fresh_env


@pytest.fixture(scope="session")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    d = Deployment(tmp_path_factory.mktemp("operator"), fresh_env())
    d.compose("down -v --remove-orphans", timeout_s=300)  # what a cut-off earlier run left
    started = time.monotonic()
    up = d.compose("up -d --wait --wait-timeout 900", timeout_s=1000, check=False)
    print(f"\n[compose] up -d --wait: exit {up.returncode} in {time.monotonic() - started:.0f} s; gateway at {d.gateway_url}")
    if up.returncode:
        print(d.compose("ps -a", check=False).stdout, d.compose("logs --tail 40", check=False).stdout[-8000:])
    assert up.returncode == 0, up.stderr[-4000:]
    try:
        yield d
    finally:
        if os.environ.get("CRUCIBLE_COMPOSE_KEEP") != "1":
            d.compose("down -v --remove-orphans", timeout_s=300, check=False)
            shutil.rmtree(SANDBOX_DIR, ignore_errors=True)

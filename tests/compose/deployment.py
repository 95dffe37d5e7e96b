"""The docker-compose deployment the tests of ``tests/compose`` share (one per session, ``conftest.py``): brought up as
docs/operators.md says, from an operator's directory of its own holding ``deploy/.env`` with fresh secrets."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from crucible.sdk import AdminClient

ROOT = Path(__file__).resolve().parents[2]
PROJECT = os.environ.get("CRUCIBLE_COMPOSE_PROJECT", "crucible-compose-test")
HTTP_PORTS = {"gateway": 8000, "ledger": 8001, "trainer": 8002, "inference": 8003, "grader": 8004}
DATA_PORTS = {"postgres": 5432, "teststore-db": 5432, "redis": 6379}
IMAGES = {  # what `make compose-images` built; the published defaults elsewhere
    "CRUCIBLE_BASE_IMAGE": os.environ.get("CRUCIBLE_BASE_IMAGE", "python:3.11-slim"),
    "CRUCIBLE_POSTGRES_IMAGE": os.environ.get("CRUCIBLE_POSTGRES_IMAGE", "postgres:16"),
    "CRUCIBLE_REDIS_IMAGE": os.environ.get("CRUCIBLE_REDIS_IMAGE", "redis:7"),
}
DEMO_TEST_ITEMS = 32  # the demo benchmark's hidden split here (the file's: 300)
SANDBOX_DIR = f"/var/lib/crucible/sandboxes-{PROJECT}-{secrets.token_hex(4)}"  # this deployment's CRUCIBLE_SANDBOX_DIR: what an
# earlier deployment on this host left in the shared one (deploy/.env.example's) is not counted as this one's leftover


def wait_for(pred: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with_value = pred()
        if with_value:
            return with_value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Deployment:
    """One compose project driven as an operator drives it, from a directory of its own holding ``deploy/.env``."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = env
        self.loaded: dict[str, bool] = {}  # benchmarks loaded (load_demo_benchmark)
        self.port = int(env["CRUCIBLE_GATEWAY_PORT"])
        self.gateway_url = f"http://127.0.0.1:{self.port}"
        self.shell_env = {**os.environ, "COMPOSE_FILE": str(ROOT / "docker-compose.yml"), "COMPOSE_PROJECT_NAME": PROJECT, "COLUMNS": "200"}
        self.write_env()

    def write_env(self) -> None:
        (self.workdir / "deploy").mkdir(exist_ok=True)
        (self.workdir / "deploy" / ".env").write_text("".join(f"{k}={v}\n" for k, v in self.env.items()))

    def sh(self, script: str, timeout_s: float = 900, check: bool = True, trace: str = "") -> subprocess.CompletedProcess:
        """Run ``script`` with bash in the operator's directory (``set -euo pipefail``). ``trace``: a label; each
        command of the script is printed under it with the second of the script it started at (``set -x``)."""
        prologue = "set -euo pipefail\n" + ("PS4='+ [${SECONDS} s] '\nset -x\n" if trace else "")
        proc = subprocess.run(["bash", "-c", prologue + script], cwd=self.workdir, env=self.shell_env, capture_output=True,
                              text=True, timeout=timeout_s)
        if trace:
            print("".join(f"\n[{trace}] {line}" for line in proc.stderr.splitlines() if line.startswith("+ [")))
        if check and proc.returncode:
            raise AssertionError(f"exit {proc.returncode}: {script}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        return proc

    def compose(self, args: str, timeout_s: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        return self.sh(f"docker compose --env-file deploy/.env {args}", timeout_s, check)

    def container(self, service: str) -> str:
        ids = self.compose(f"ps -q {service}").stdout.split()
        assert len(ids) == 1, f"{service}: containers {ids}"
        return ids[0]

    def services(self) -> list[str]:
        return sorted(self.compose("ps --services").stdout.split())

    def inspect(self, service: str) -> dict:
        return json.loads(subprocess.run(["docker", "inspect", self.container(service)], capture_output=True, text=True, check=True).stdout)[0]

    def docker_exec(self, service: str, *cmd: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "exec", self.container(service), *cmd], capture_output=True, text=True, timeout=timeout_s)

    def config(self) -> dict:
        return json.loads(self.compose("config --format json").stdout)

    def admin(self) -> AdminClient:
        return AdminClient(self.gateway_url, self.env["CRUCIBLE_ADMIN_KEY"])

    def healthy(self) -> bool:
        rows = [json.loads(line) for line in self.compose("ps --format json").stdout.splitlines() if line.strip()]
        return bool(rows) and all(r["State"] == "running" and r.get("Health", "") in ("", "healthy") for r in rows)


def fresh_env() -> dict[str, str]:
    """A ``deploy/.env`` as docs/operators.md asks for: every secret set, each different, URL- and JSON-safe."""
    example = [line.split("=", 1) for line in (ROOT / "deploy" / ".env.example").read_text().splitlines() if line and not line.startswith("#")]
    env = {k: v for k, v in example}
    for key in env:
        if key.endswith(("_TOKEN", "_PASSWORD", "_ADMIN_KEY")):
            env[key] = secrets.token_hex(16)
    env["CRUCIBLE_GRADER_TEST_SEED"] = str(secrets.randbelow(10**12) + 10**11)
    env["CRUCIBLE_GATEWAY_PORT"] = str(free_port())
    env["CRUCIBLE_SANDBOX_DIR"] = SANDBOX_DIR
    env |= IMAGES
    return env


SECRET_NAMES = ("GATEWAY_SERVICE_TOKEN", "LEDGER_SERVICE_TOKEN", "TRAINER_SERVICE_TOKEN", "INFERENCE_SERVICE_TOKEN", "GRADER_SERVICE_TOKEN",
                "CRUCIBLE_ADMIN_KEY", "POSTGRES_PASSWORD", "GATEWAY_DB_PASSWORD", "LEDGER_DB_PASSWORD", "TRAINER_DB_PASSWORD",
                "INFERENCE_DB_PASSWORD", "GRADER_DB_PASSWORD", "TESTSTORE_DB_PASSWORD", "CRUCIBLE_GRADER_TEST_SEED")


def load_demo_benchmark(deployment: Deployment) -> None:
    """The operators page's ``crucible admin load-benchmark`` in the gateway's container, once per deployment, of the demo
    benchmark with a hidden split of :data:`DEMO_TEST_ITEMS` items (the file's 300 are graded twice, the initial
    system's baseline at load and the submission, on 2 CPU cores shared by every container): the file on the
    command's standard input."""
    if not deployment.loaded.get("chain-sum-demo"):
        doc = yaml.safe_load((ROOT / "benchmarks" / "chain-sum-demo.yaml").read_text())
        doc["suite"]["splits"]["test"]["size"] = DEMO_TEST_ITEMS
        (deployment.workdir / "chain-sum-demo.yaml").write_text(yaml.safe_dump(doc))
        loaded = deployment.sh("docker compose --env-file deploy/.env exec -T gateway crucible admin load-benchmark /dev/stdin < chain-sum-demo.yaml",
                               timeout_s=600)
        assert "chain-sum-demo" in loaded.stdout
        deployment.loaded["chain-sum-demo"] = True

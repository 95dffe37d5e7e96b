"""Shared fixtures: the embedded stack booted once per test session as real processes, with the real model."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MODEL_CACHE = ROOT / ".crucible" / "models"
PORT_BASE = int(os.environ.get("CRUCIBLE_TEST_PORT_BASE", "18100"))

TEST_BENCHMARK = {
    "name": "chain-sum-test",
    "description": "small chain-sum benchmark for the test suite",
    "suite": {
        "name": "reasoning_gym",
        "params": {"task": "chain_sum", "min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
        "splits": {"train": {"seed": 11, "size": 600}, "validation": {"seed": 22, "size": 16}, "test": {"size": 24}},
    },
    "initial_system": {"model": "smollm2-135m-instruct"},
    "reference": {"score": 1.0},
    "track": "joint",
    "recipe": {"lock": {"method": "sft", "adapter": "lora"}},
    "budget": {"usd": 1.0, "wall_clock_hours": 2},
    "evaluation": {"max_tokens": 16, "temperature": 0.0, "samples": 1, "metric": "avg@k"},
    "limits": {"final_submissions": 1},
}


def prepared_models(*names: str) -> Path:
    """A models folder holding exactly the built-in models ``names`` (default: ``DEFAULT_MODELS``, SmolLM2), each
    prepared once into the repository's cache (shared with ``make demo``) and linked into a folder of its own, so a
    model that ``make demo`` or another test prepared into the cache is not served where a test does not ask for it."""
    from services.common.llms import DEFAULT_MODELS, prepare_base_model

    names = tuple(sorted(set(names or DEFAULT_MODELS)))
    view = ROOT / ".crucible" / "test-models" / "+".join(names)
    view.mkdir(parents=True, exist_ok=True)
    for name in names:
        prepare_base_model(name, MODEL_CACHE)
        link = view / name
        if not link.is_symlink():
            with contextlib.suppress(FileExistsError):
                link.symlink_to(MODEL_CACHE / name, target_is_directory=True)
    return view


PG_ADMIN = os.environ.get("CRUCIBLE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("CRUCIBLE_TEST_REDIS", "redis://127.0.0.1:6379/15")
SERVICES = ("gateway", "ledger", "trainer", "inference", "grader", "teststore")


@contextlib.contextmanager
def throwaway_databases(names: Iterable[str], kind: str = "postgresql", folder: Path | None = None) -> Iterator[dict[str, str]]:
    """One fresh database per name, as SQLAlchemy URLs (name → URL): SQLite files in ``folder`` (``kind="sqlite"``),
    or databases on the machine's PostgreSQL (``PG_ADMIN``), dropped afterwards."""
    if kind == "sqlite":
        assert folder is not None, "SQLite databases need a folder"
        yield {n: f"sqlite:///{folder / n}.sqlite" for n in names}
        return
    import psycopg

    tag = uuid.uuid4().hex[:8]
    dbs = {n: f"crucible_test_{n}_{tag}" for n in names}
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        for db in dbs.values():
            conn.execute(f'CREATE DATABASE "{db}"')
    base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    try:
        yield {n: f"{base}/{db}" for n, db in dbs.items()}
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            for db in dbs.values():
                conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def throwaway_postgres() -> contextlib.AbstractContextManager[dict[str, str]]:
    """One fresh PostgreSQL database per service (and the test store), dropped afterwards."""
    return throwaway_databases(SERVICES)


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """Every service and worker as separate processes on 127.0.0.1 (ports from ``PORT_BASE``).

    ``sqlite``: the embedded mode (SQLite files, embedded broker). ``postgres``: production's data plane,
    a throw-away PostgreSQL database per service and the test store, Redis as the Celery broker.
    """
    import redis

    from crucible.stack import Stack

    data_dir = tmp_path_factory.mktemp(f"crucible-{request.param}")
    (data_dir / "models").symlink_to(prepared_models(), target_is_directory=True)
    with contextlib.ExitStack() as cleanup:
        if request.param == "postgres":
            urls = cleanup.enter_context(throwaway_postgres())
            redis.Redis.from_url(REDIS_URL).flushdb()
            s = Stack(data_dir, PORT_BASE + 10, database_urls=urls, broker_url=REDIS_URL, test_store_url=urls["teststore"])
        else:
            s = Stack(data_dir, PORT_BASE)
        s.start(timeout_s=300)
        try:
            yield s
        finally:
            s.stop()
            logs = data_dir / "logs"
            keep = os.environ.get("CRUCIBLE_KEEP_LOGS")
            if keep and logs.exists():
                shutil.copytree(logs, Path(keep) / request.param, dirs_exist_ok=True)


@pytest.fixture(scope="session")
def admin(stack):  # noqa: ANN001, ANN201
    from crucible.sdk import AdminClient
    from crucible.stack import admin_key

    return AdminClient(stack.gateway_url, admin_key(stack.data_dir))


@pytest.fixture(scope="session")
def benchmark(admin) -> dict:  # noqa: ANN001
    return admin.load_benchmark(yaml.safe_load(yaml.safe_dump(TEST_BENCHMARK)))


@pytest.fixture()
def new_run(stack, admin, benchmark):  # noqa: ANN001, ANN201
    """Factory: ``new_run(**overrides) -> (run, CrucibleClient)`` for a fresh run of the test benchmark."""
    from crucible.sdk import CrucibleClient

    def make(agent_name: str = "test-agent", **overrides: object) -> tuple[dict, CrucibleClient]:
        run = admin.create_run(benchmark["name"], agent_name, **overrides)
        return run, CrucibleClient(stack.gateway_url, run["api_key"])

    return make

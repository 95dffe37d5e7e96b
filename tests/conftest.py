"""Shared fixtures: the embedded stack booted once per test session as real processes, with the real model."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.models import TINY_MODEL

ROOT = Path(__file__).resolve().parent.parent
# Prepared base models, shared by every checkout on this machine (a dequantized model is a function of its card and its
# package alone; SmolLM2 takes about 20 s to prepare and Gemma about 60 s on 2 cores): CRUCIBLE_TEST_MODEL_CACHE, else
# $XDG_CACHE_HOME/crucible/models. Preparation is locked per model, so concurrent sessions prepare each once.
MODEL_CACHE = Path(os.environ.get("CRUCIBLE_TEST_MODEL_CACHE")
                   or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "crucible" / "models")
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


def plumbing_benchmark(name: str) -> dict:
    """A copy of :data:`TEST_BENCHMARK` named ``name`` whose initial system is the test-only model (:data:`TINY_MODEL`),
    for the end-to-end tests of rules, limits and plumbing: loading a benchmark grades its initial system on the
    hidden split at once, in the stack's eval worker, which then takes milliseconds instead of seconds of CPU."""
    doc = yaml.safe_load(yaml.safe_dump(TEST_BENCHMARK))
    doc["name"], doc["initial_system"] = name, {"model": TINY_MODEL}
    return doc


def prepared_models(*names: str) -> Path:
    """A models folder holding exactly the models ``names`` (built-in ones, or the test-only :data:`TINY_MODEL`;
    default: ``DEFAULT_MODELS``, SmolLM2), each prepared once into :data:`MODEL_CACHE` and linked into a folder of its
    own, so a model that another test prepared into the cache is not served where a test does not ask for it."""
    from services.common.llms import DEFAULT_MODELS, prepare_base_model

    names = tuple(sorted(set(names or DEFAULT_MODELS)))
    view = ROOT / ".crucible" / "test-models" / "+".join(names)
    view.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name == TINY_MODEL:
            prepare_tiny_model()
        else:
            prepare_base_model(name, MODEL_CACHE)
        link = view / name
        if not link.is_symlink():
            with contextlib.suppress(FileExistsError):
                link.symlink_to(MODEL_CACHE / name, target_is_directory=True)
    return view


def prepare_tiny_model() -> Path:
    """The test-only model ``tiny-smollm2`` (:mod:`tests.models`) prepared into :data:`MODEL_CACHE` as a base model is,
    from a Hugging Face folder written once beside it (under a lock: concurrent sessions write it once)."""
    import fcntl

    from services.common.llms import prepare_base_model, prepare_model
    from tests.models import tiny_model_card, tiny_model_folder

    sources = MODEL_CACHE.with_name(f"{MODEL_CACHE.name}-sources")  # beside the registry folder, which holds prepared models alone
    source, tmp = sources / TINY_MODEL, sources / f"{TINY_MODEL}.tmp"
    sources.mkdir(parents=True, exist_ok=True)
    with open(sources / f"{TINY_MODEL}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not source.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
            tiny_model_folder(prepare_base_model("smollm2-135m-instruct", MODEL_CACHE), tmp).rename(source)
    return prepare_model(tiny_model_card(source), MODEL_CACHE)


# A stack's processes compute on every CPU, as `crucible up`'s do (whatever this process's own setting below).
STACK_ENV = {"OMP_NUM_THREADS": str(len(os.sched_getaffinity(0))),
             "CRUCIBLE_CANDIDATE_KEY": "test-candidate-key"}  # the evaluator track's candidate names: alike in every test deployment

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers on two cores: each computes on one thread. Two processes each running torch's default (a thread per
    # core) oversubscribe the cores, and OpenMP's waiting threads spin: measured on 2 cores, `make test` took 894 s of wall
    # time and 28 CPU-minutes that way, against 960 s and 19 CPU-minutes with no workers at all. OMP_NUM_THREADS too, as
    # the trainer and the transformers engine set torch's threads to services.common.llms.cpu_threads() when a job or an
    # engine starts (every CPU unless it caps them: an in-process engine or training loop had put each worker back
    # on two threads). A stack's own processes keep every CPU (STACK_ENV): they are other processes, and mostly wait.
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


class RedisServer:
    """A private, non-persistent Redis server on ``port`` (like the CI machine's): nothing else shares its databases,
    so no other test (nor a concurrent session) can flush, fill or restart what a stack's broker holds. Its password
    is new for each instance, so a worker that an earlier, cut-off session left running, whose broker was this port,
    cannot take this stack's messages (one did: it consumed the postgres stack's tasks, and its jobs waited for the
    reconciler's resends until tests timed out)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.password = uuid.uuid4().hex
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 20.0) -> None:
        if shutil.which("redis-server") is None:
            pytest.fail("redis-server is needed (make services starts the machine's Redis; the binary must exist)")
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                      "--requirepass", self.password], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        ping = ["redis-cli", "-p", str(self.port), "--no-auth-warning", "-a", self.password, "ping"]
        while subprocess.run(ping, capture_output=True, text=True).stdout.strip() != "PONG":  # a leftover server on the port: NOAUTH
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start (exit {self.proc.poll()})")
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


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


PLANES = ("sqlite", "postgres")
# The in-process files of 10-40 s each (`make test-unit`'s log, --durations), started before the short ones so that both
# workers end together (`--no-loadscope-reorder`: xdist would otherwise start the files with the most tests first).
HEAVY_FIRST = ("tests/unit/trainer/", "tests/unit/inference/", "tests/unit/common/test_llms.py", "tests/unit/common/test_extraction.py",
               "tests/unit/common/test_migrations.py", "tests/unit/grader/test_code_harness.py", "tests/unit/grader/test_scorers.py",
               "tests/unit/grader/test_suite_math.py", "tests/unit/ledger/test_ledger.py")


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """Groups for pytest-xdist's ``--dist loadgroup`` (``make test`` and ``make test-slow`` run two workers): every test
    that boots processes (marker ``e2e``) runs on one worker, in turn as without xdist, so no two stacks ever run at once
    (each takes about 5 GB and fixed ports, and two stacks computing at once on two cores oversubscribe them: with the
    faults and the presets on separate workers, `make test-slow` ran past 30 minutes where it takes 21 in turn) and each
    plane's session stack starts once; the other worker runs the
    in-process tests meanwhile, each file's tests together (a module's loaded model is built once). The end-to-end
    tests come first (the longest group starts first): those on a module's own deployment (faults, differential), torn
    down at the module's end, then the session stack's sqlite tests, then its postgres ones (a session fixture keeps
    one parameter's instance at a time: interleaved planes would boot a stack again per switch), so at most two stacks
    are up at once. Of the in-process tests, the model-training and serving ones (:data:`HEAVY_FIRST`) go first, so the
    session does not end on one worker's long file while the other idles.

    The marks go on before every other plugin's hook (xdist's reads them); after it, each item's node id must carry its
    group, or the end-to-end tests would spread over both workers (pytest 9.2 broke that: pytest-xdist#1386)."""
    def order(item: pytest.Item) -> int:
        if item.get_closest_marker("e2e") is None:
            return len(PLANES) + 1 + (not item.nodeid.startswith(HEAVY_FIRST))
        plane = getattr(item, "callspec", None) and item.callspec.params.get("stack")  # type: ignore[attr-defined]
        return 1 + PLANES.index(plane) if plane else 0

    for item in items:
        item.add_marker(pytest.mark.xdist_group("e2e" if item.get_closest_marker("e2e") else item.nodeid.split("::", 1)[0]))
    items.sort(key=order)
    yield
    if os.environ.get("PYTEST_XDIST_WORKER") and config.getvalue("loadgroup"):
        lost = [item.nodeid for item in items if "@" not in item.nodeid]
        assert not lost, f"pytest-xdist did not group {lost[:3]}… (pytest 9.2 and pytest-xdist#1386: keep pytest below 9.2)"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that uses :func:`stack` runs on the data planes its ``planes`` marker names (closest wins: function,
    then module), on the embedded one (``sqlite``) when it names none. Both planes are for what the data plane changes
    (ledger holds and charges, leases and job states, triggers, the test store); each plane's stack is started once
    per session and shared by every test on it (run-scoped keys keep their data apart)."""
    defs = metafunc._arg2fixturedefs.get("stack")  # noqa: SLF001 - which ``stack`` this test resolves to
    if not defs or defs[-1].func.__module__ != __name__:  # another folder's own ``stack`` fixture
        return
    marker = metafunc.definition.get_closest_marker("planes")
    planes = marker.args if marker else ("sqlite",)
    assert set(planes) <= set(PLANES), f"planes: {planes} (known: {PLANES})"
    metafunc.parametrize("stack", planes, indirect=True, scope="session")


@pytest.fixture(scope="session")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """Every service and worker as separate processes on 127.0.0.1 (ports from ``PORT_BASE``).

    ``sqlite``: the embedded mode (SQLite files, embedded broker). ``postgres``: production's data plane,
    a throw-away PostgreSQL database per service and the test store, a Redis server of its own as the Celery broker. Which a test
    gets is its ``planes`` marker's choice (:func:`pytest_generate_tests`).
    """
    from crucible.stack import Stack
    from services.common.llms import DEFAULT_MODELS

    data_dir = tmp_path_factory.mktemp(f"crucible-{request.param}")
    (data_dir / "models").symlink_to(prepared_models(*DEFAULT_MODELS, TINY_MODEL), target_is_directory=True)
    with contextlib.ExitStack() as cleanup:
        if request.param == "postgres":
            urls = cleanup.enter_context(throwaway_postgres())
            broker = RedisServer(PORT_BASE + 19)
            broker.start()
            cleanup.callback(broker.kill)
            s = Stack(data_dir, PORT_BASE + 10, database_urls=urls, broker_url=broker.url, test_store_url=urls["teststore"], extra_env=STACK_ENV)
        else:
            s = Stack(data_dir, PORT_BASE, extra_env=STACK_ENV)
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

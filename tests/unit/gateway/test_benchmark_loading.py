"""Loading a benchmark, with the real grader behind the gateway, both in this process: the gateway's app on SQLite, its
grader client reaching the grader's app (its own SQLite databases, the hidden test store included); the grader's queues
are lists, whose messages a test hands to ``grader.grading_tasks.build_splits`` (a task's split build) as an eval
worker would. Loading answers at once and is idempotent: overlapping calls, and a call repeated after one that was cut
off, are one benchmark, one grader task per task name and one baseline grading each.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from inference_service.client import InferenceClient
from sqlalchemy import func, select

from gateway import benchmarks
from gateway.app import create_app
from gateway.models import Benchmark
from gateway.service import Gateway
from grader import grading_tasks, splits, teststore
from grader.app import create_app as create_grader_app
from grader.client import GraderClient
from grader.models import Evaluation, GradingTask
from grader.service import Grader
from grader.settings import GraderSettings
from services.common.db import Database, migrate
from services.common.errors import Unprocessable, UpstreamUnavailable
from services.ledger.app import create_app as create_ledger_app
from services.ledger.client import LedgerClient
from services.ledger.settings import LedgerSettings
from tests.conftest import ROOT, TEST_BENCHMARK
from tests.unit.gateway.test_routes import ADMIN, GATEWAY_TOKEN, in_process, inference_stand_in, settings_for, unreachable


@dataclass
class Rig:
    """The gateway app (``http``) in front of the real grader (``grader``), whose split builds wait in ``builds`` and
    whose evaluations in ``evaluations`` until a test runs them."""

    http: TestClient
    grader: Grader
    builds: list[str] = field(default_factory=list)
    evaluations: list[str] = field(default_factory=list)

    @property
    def gateway(self) -> Gateway:
        return self.http.app.state.gateway  # type: ignore[attr-defined]

    def load(self, doc: dict[str, Any]) -> httpx.Response:
        return self.http.post("/admin/benchmarks", json=doc, headers=ADMIN)

    def build(self) -> None:
        """Run every queued split build, as the eval worker runs the messages it got (a duplicate builds nothing)."""
        while self.builds:
            grading_tasks.build_splits(self.grader, self.builds.pop(0))

    def counts(self, name: str) -> tuple[int, int, int]:
        """How many benchmarks are named ``name``, and how many grading tasks and baseline gradings (initial) the grader
        has of the benchmark's tasks."""
        with self.gateway.db.session() as s:
            rows = s.scalars(select(Benchmark).where(Benchmark.name == name)).all()
            ids = [task_id for b in rows for task_id in b.task_ids().values()]
        with self.grader.db.session() as s:
            tasks = s.scalar(select(func.count()).select_from(GradingTask).where(GradingTask.id.in_(ids)))
            initial = s.scalar(select(func.count()).select_from(Evaluation).where(Evaluation.purpose == "initial", Evaluation.task_id.in_(ids)))
        return len(rows), tasks or 0, initial or 0


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp_path = tmp_path_factory.mktemp("loading")
    url = f"sqlite:///{tmp_path / 'grader.sqlite'}"
    migrate(url, ROOT / "grader" / "migrations")
    settings = GraderSettings(data_dir=tmp_path / "grader", grader_test_seed=1234, service_token="grader-token",
                              trusted_tokens={"gateway": GATEWAY_TOKEN})
    rig_grader = Grader(settings=settings, db=Database(url), store=teststore.TestStore(f"sqlite:///{tmp_path / 'teststore.sqlite'}"),
                        inference=InferenceClient(in_process(inference_stand_in(unreachable), "inference")),  # type: ignore[arg-type]
                        ledger=LedgerClient(in_process(httpx.MockTransport(unreachable), "ledger")), enqueue=lambda _e: None)  # type: ignore[arg-type]
    ledger_app = create_ledger_app(LedgerSettings(database_url=f"sqlite:///{tmp_path}/ledger.sqlite", service_token="ledger-token",
                                                  trusted_tokens={"gateway": GATEWAY_TOKEN}))
    with TestClient(ledger_app), TestClient(create_app(settings_for(tmp_path)), base_url="http://gateway") as http, pytest.MonkeyPatch.context() as patch:
        # the item-space estimate behind the operator's warnings samples for seconds; here the space is large and known
        patch.setattr(splits, "item_space", lambda _spec: splits.ItemSpace(count=10**9, exact=True))
        rig = Rig(http=http, grader=rig_grader)
        rig_grader.enqueue, rig_grader.enqueue_build = rig.evaluations.append, rig.builds.append
        gw = rig.gateway
        gw.grader = GraderClient(in_process(httpx.ASGITransport(app=create_grader_app(settings, grader=rig_grader)), "grader"))  # type: ignore[arg-type]
        gw.inference = InferenceClient(in_process(inference_stand_in(unreachable), "inference"))  # type: ignore[arg-type]
        gw.ledger = LedgerClient(in_process(httpx.ASGITransport(app=ledger_app), "ledger"))  # type: ignore[arg-type]
        yield rig
    rig_grader.db.engine.dispose()
    rig_grader.store.db.engine.dispose()


def two_tasks(name: str) -> dict[str, Any]:
    """The test benchmark as two tasks (``sums``, ``more``), named ``name``."""
    doc = {k: v for k, v in TEST_BENCHMARK.items() if k not in ("suite", "initial_system", "reference")}
    task = {"suite": TEST_BENCHMARK["suite"], "initial_system": TEST_BENCHMARK["initial_system"], "reference": TEST_BENCHMARK["reference"]}
    return {**doc, "name": name, "tasks": [{"name": "sums", **task}, {"name": "more", **task, "suite": {**task["suite"], "params": {
        **task["suite"]["params"], "max_terms": 4}}}]}


def test_two_loads_of_one_file_at_once_are_one_benchmark_with_one_task_and_one_grading_each(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    both_at_the_grader = threading.Barrier(2, timeout=30)
    check = grading_tasks._check

    def meet(grader: Grader, spec: Any) -> None:  # noqa: ANN401 - a GradingSpec
        if spec.task == "sums":  # the two calls overlap at the grader: both have their ids and register the first task at once
            both_at_the_grader.wait()
        check(grader, spec)

    monkeypatch.setattr(grading_tasks, "_check", meet)
    doc = two_tasks("chain-sum-twice")
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: rig.load(doc), range(2)))
    assert [a.status_code for a in answers] == [201, 201], [a.text for a in answers]
    assert answers[0].json()["id"] == answers[1].json()["id"] and {a.json()["status"] for a in answers} == {"building"}
    assert rig.counts("chain-sum-twice") == (1, 2, 0)
    rig.build()
    assert rig.counts("chain-sum-twice") == (1, 2, 2)  # one baseline grading per task
    assert rig.http.get("/admin/benchmarks/chain-sum-twice", headers=ADMIN).json()["status"] == "ready"


def test_a_load_whose_splits_take_long_answers_at_once_building_and_becomes_ready(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    draw = splits.test_split

    def slow(*args: Any) -> Any:  # noqa: ANN401 - a swe suite verifying its mutants on a busy machine
        time.sleep(2)
        return draw(*args)

    monkeypatch.setattr(splits, "test_split", slow)
    t0 = time.monotonic()
    loaded = rig.load({**TEST_BENCHMARK, "name": "chain-sum-slow"})
    assert loaded.status_code == 201 and time.monotonic() - t0 < 2, loaded.text
    bm = loaded.json()
    assert (bm["status"], bm["error"]) == ("building", None)
    refused = rig.http.post("/admin/runs", json={"benchmark": bm["id"], "agent_name": "early"}, headers=ADMIN)
    assert (refused.status_code, refused.json()["code"], refused.json()["retry_after_s"]) == (409, "benchmark_not_ready", 10)
    listed = {b["name"]: b for b in rig.http.get("/admin/benchmarks", headers=ADMIN).json()["data"]}
    assert listed["chain-sum-slow"]["status"] == "building"

    worker = threading.Thread(target=rig.build)  # the eval worker, meanwhile
    worker.start()
    while rig.http.get(f"/admin/benchmarks/{bm['id']}", headers=ADMIN).json()["status"] == "building":
        assert time.monotonic() - t0 < 30
        time.sleep(0.1)
    worker.join()
    assert rig.http.get(f"/admin/benchmarks/{bm['id']}", headers=ADMIN).json()["status"] == "ready"
    assert rig.http.post("/admin/runs", json={"benchmark": bm["id"], "agent_name": "after"}, headers=ADMIN).status_code == 201
    assert rig.counts("chain-sum-slow") == (1, 1, 1)


def test_a_load_repeated_after_one_cut_off_is_the_same_benchmark_with_no_second_task_or_grading(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    register = GraderClient.register_task

    async def then_time_out(self: GraderClient, body: Any) -> Any:  # noqa: ANN401 - the grader registered it; its answer never came
        await register(self, body)
        raise UpstreamUnavailable("grader: timed out after 300 s")

    doc = two_tasks("chain-sum-cut-off")
    with monkeypatch.context() as patched:
        patched.setattr(GraderClient, "register_task", then_time_out)
        assert rig.load(doc).status_code == 503
    assert rig.counts("chain-sum-cut-off") == (1, 1, 0)  # the row and the first task; the second never reached the grader
    assert rig.http.get("/admin/benchmarks/chain-sum-cut-off", headers=ADMIN).json()["status"] == "failed"

    async def gone_after_storing() -> None:  # the client hangs up while the gateway waits on the grader: the call stops there
        with monkeypatch.context() as patched:
            patched.setattr(GraderClient, "register_task", lambda *_a: asyncio.sleep(3600))
            await asyncio.wait_for(benchmarks.load_benchmark(rig.gateway, doc), timeout=0.5)

    with pytest.raises(TimeoutError):
        asyncio.run(gone_after_storing())
    again = rig.load(doc)
    assert again.status_code == 201, again.text
    assert rig.counts("chain-sum-cut-off") == (1, 2, 0)
    rig.build()
    assert rig.load(doc).json()["status"] == "ready" and rig.counts("chain-sum-cut-off") == (1, 2, 2)


def test_a_file_the_grader_refuses_is_not_loaded_and_a_failed_build_gives_way_to_a_fixed_file(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = {**TEST_BENCHMARK, "name": "chain-sum-bad", "suite": {**TEST_BENCHMARK["suite"], "params": {"task": "no_such_task"}}}
    assert rig.load(bad).status_code == 422 and rig.counts("chain-sum-bad")[0] == 0
    too_many = {**TEST_BENCHMARK, "name": "chain-sum-small"}
    first = rig.load(too_many).json()
    with monkeypatch.context() as patched:
        patched.setattr(splits, "test_split", lambda *_a: (_ for _ in ()).throw(
            Unprocessable("main: only 3 test items exist outside the public splits; the test split asks for 24", field="suite.splits.test.size")))
        rig.build()
    failed = rig.http.get("/admin/benchmarks/chain-sum-small", headers=ADMIN).json()
    assert (failed["status"], failed["error"]) == ("failed", "main: suite.splits.test.size: main: only 3 test items exist outside the public splits; "
                                                              "the test split asks for 24")
    refused = rig.http.post("/admin/runs", json={"benchmark": first["id"], "agent_name": "a"}, headers=ADMIN)
    assert (refused.status_code, refused.json()["code"]) == (409, "benchmark_not_ready")
    fixed = rig.load({**too_many, "suite": {**too_many["suite"], "splits": {"train": {"size": 40}, "validation": {"size": 4}, "test": {"size": 3}}}})
    assert fixed.status_code == 201 and fixed.json()["id"] != first["id"]
    rig.build()
    assert rig.http.get("/admin/benchmarks/chain-sum-small", headers=ADMIN).json()["status"] == "ready"
    changed = rig.load({**too_many, "description": "another"})
    assert (changed.status_code, changed.json()["field"]) == (409, "name")

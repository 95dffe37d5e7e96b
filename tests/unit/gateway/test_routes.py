"""The gateway's routes in this process: the app from ``create_app`` on a temporary SQLite database, called as an
agent and an operator would.

Behind it, the ledger and the trainer are their real apps in this process (SQLite). The grader is a stand-in
at its typed client's seam (:class:`Grader`): serving the real one means its test store, its splits and its
queue, and the grader's own tests do that (the leaderboard against the real grader: ``tests/unit/grader/test_submission_rules.py``).
Where the point is the gateway's own mapping of an answer (an upstream 503, a service that cannot be reached, a
recipe sent on), the service is an ``httpx.MockTransport``.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI
from fastapi.testclient import TestClient
from inference_service.client import InferenceClient
from trainer_service.app import create_app as create_trainer_app
from trainer_service.client import TrainerClient

from gateway.app import create_app
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from grader.schemas import ContaminationReport, LeaderboardEntry, TaskRegistered
from services.common.auth import RunContext
from services.common.contracts import (
    CandidateScore,
    EvaluationCreate,
    EvaluationLimits,
    EvaluationOut,
    EvaluationUsage,
    GradingSpec,
    GradingTaskStatus,
    Harness,
    HarnessArchiveOut,
    Page,
    Score,
    SubmissionCreate,
    SubmissionOut,
    SuiteItemOut,
    SystemSpec,
    TrajectoryOut,
)
from services.common.errors import UpstreamProblem
from services.common.http import AsyncServiceClient
from services.common.ids import new_id
from services.common.llms import BUILTIN_CARDS
from services.common.openai_protocol import ChatCompletion
from services.common.settings import ServiceSettings
from services.ledger.app import create_app as create_ledger_app
from services.ledger.client import LedgerClient
from services.ledger.settings import LedgerSettings
from tests.conftest import ROOT, TEST_BENCHMARK

ADMIN_KEY = "admin-key-for-the-route-tests"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
GATEWAY_TOKEN, TRAINER_TOKEN = "gateway-token", "trainer-token"
MAX_UPLOAD_BYTES = 10_000
MODEL = "smollm2-135m-instruct"
GOOD_ROW = b'{"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]}\n'
COMPLETION = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": MODEL,
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}


def in_process(target: httpx.AsyncBaseTransport, name: str) -> AsyncServiceClient:
    """A transport of the gateway's (its token, its async client) whose calls go to ``target``: an app in this
    process (``httpx.ASGITransport``) or a stand-in (``httpx.MockTransport``)."""
    http = AsyncServiceClient(f"http://{name}", GATEWAY_TOKEN, name=name)
    http.client = httpx.AsyncClient(base_url=f"http://{name}", headers=http.client.headers, transport=target)
    return http


def served_cards() -> httpx.Response:
    """Inference's answer to ``GET /internal/base-models``: serving every built-in model (the shipped benchmarks name them)."""
    return httpx.Response(200, json={"object": "list", "data": [card.model_dump(mode="json") for card in BUILTIN_CARDS.values()]})


def inference_stand_in(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.MockTransport:
    """Inference as the gateway calls it: the served models' cards (what loading a benchmark checks against), anything
    else answered by ``handler``."""
    return httpx.MockTransport(lambda r: served_cards() if r.method == "GET" and r.url.path == "/internal/base-models" else handler(r))


def unreachable(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def problem(status: int, code: str, detail: str = "", **extra: Any) -> dict[str, Any]:
    return {"type": f"urn:crucible:problem:{code}", "title": code, "status": status, "code": code, "detail": detail, **extra}


EVAL_ID, SUB_ID, JOB_ID, HAR_ID = new_id("eval"), new_id("sub"), new_id("job"), new_id("har")  # ids the stand-ins know; JOB_ID: none

@dataclass
class Grader:
    """The grader as the gateway calls it (the methods of ``GraderClient`` it uses): tasks registered from the gateway's
    grading specs, each with ``initial`` as its initial system's test score and a declared reference; the submissions
    that count on the leaderboard (``entries``); each run's submissions and evaluation usage."""

    tasks: dict[str, GradingSpec] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    initial: float = 0.2
    entries: list[LeaderboardEntry] = field(default_factory=list)
    submissions: dict[str, list[SubmissionOut]] = field(default_factory=dict)

    async def readyz(self) -> dict[str, str]:
        return {"status": "ready", "service": "grader"}

    async def register_task(self, body: GradingSpec) -> TaskRegistered:
        self.tasks.setdefault(body.task_id, body)
        return TaskRegistered(**(await self.task_status(body.task_id)).model_dump())

    async def task_status(self, task_id: str) -> GradingTaskStatus:
        spec = self.tasks.get(task_id)
        if spec is None:
            raise UpstreamProblem(problem(404, "not_found", f"task {task_id} not found"))
        declared = spec.reference_score is not None
        return GradingTaskStatus(
            task_id=task_id, validation_items=spec.suite.splits.validation.size, test_items=spec.suite.splits.test.size,
            initial=Score(value=self.initial, n=spec.suite.splits.test.size, metric="avg@k", k=1), initial_status="succeeded",
            reference=Score(value=spec.reference_score, n=0, metric="avg@k", k=1) if declared else None,
            reference_status="declared" if declared else "queued",
            initial_system=SystemSpec(model=spec.initial_system.model, harness=Harness(max_tokens=spec.evaluation.max_tokens)),
            warnings=self.warnings,
        )

    async def candidate_scores(self, ctx: RunContext) -> Page[CandidateScore]:
        spec = self.tasks[ctx.task_id]
        if spec.target != "development":
            raise UpstreamProblem(problem(404, "not_found", f"task {spec.task!r} is not a development target"))
        return Page[CandidateScore](data=[CandidateScore(candidate=name) for name in spec.candidates])

    async def validation(self, ctx: RunContext) -> Page[SuiteItemOut]:
        spec = self.tasks[ctx.task_id]
        return Page[SuiteItemOut](data=[SuiteItemOut(id=f"{spec.task}-{i}", question="1 + 1 =", answer="2") for i in range(2)])

    async def list_submissions(self, ctx: RunContext) -> Page[SubmissionOut]:
        return Page[SubmissionOut](data=self.submissions.get(ctx.run_id, []))

    async def evaluation_usage(self, ctx: RunContext) -> EvaluationUsage:
        return EvaluationUsage(last_hour=2, last_day=3, active=1, failed=0, total=3)

    async def leaderboard(self) -> Page[LeaderboardEntry]:
        return Page[LeaderboardEntry](data=self.entries)

    # the run-scoped routes: each call is recorded as (method, the run context it came with, its other arguments)
    calls: list[tuple[str, RunContext, dict[str, Any]]] = field(default_factory=list)

    def _record(self, method: str, ctx: RunContext, **args: Any) -> None:
        self.calls.append((method, ctx, args))

    def _evaluation(self, ctx: RunContext, eval_id: str = EVAL_ID, model: str = "smollm2-135m-instruct") -> EvaluationOut:
        return EvaluationOut(id=eval_id, status="queued", task=self.tasks[ctx.task_id].task, split="validation", model=model,
                             harness=Harness(), items_total=2, items_done=0, created_at=dt.datetime.now(dt.UTC))

    def _submission(self, ctx: RunContext, sub_id: str = SUB_ID, model: str = "smollm2-135m-instruct") -> SubmissionOut:
        return SubmissionOut(id=sub_id, status="queued", task=self.tasks[ctx.task_id].task, model=model, harness=Harness(),
                             created_at=dt.datetime.now(dt.UTC))

    async def train_sample(self, ctx: RunContext, *, offset: int = 0, limit: int = 100) -> Page[SuiteItemOut]:
        self._record("train_sample", ctx, offset=offset, limit=limit)
        return Page[SuiteItemOut](data=[SuiteItemOut(id=f"train-{offset + i}", question="1 + 2 =", answer="3") for i in range(limit)])

    async def create_evaluation(self, ctx: RunContext, body: EvaluationCreate, *, limits: EvaluationLimits) -> EvaluationOut:
        self._record("create_evaluation", ctx, body=body, limits=limits)
        return self._evaluation(ctx, model=body.model)

    async def list_evaluations(self, ctx: RunContext) -> Page[EvaluationOut]:
        self._record("list_evaluations", ctx)
        return Page[EvaluationOut](data=[self._evaluation(ctx)])

    async def get_evaluation(self, ctx: RunContext, eval_id: str) -> EvaluationOut:
        self._record("get_evaluation", ctx, eval_id=eval_id)
        if eval_id != EVAL_ID:
            raise UpstreamProblem(problem(404, "not_found", f"evaluation {eval_id} not found"))
        return self._evaluation(ctx)

    async def get_trajectories(self, ctx: RunContext, eval_id: str) -> Page[TrajectoryOut]:
        self._record("get_trajectories", ctx, eval_id=eval_id)
        return Page[TrajectoryOut](data=[])

    async def create_submission(self, ctx: RunContext, body: SubmissionCreate, *, max_submissions: int, datasets: list) -> SubmissionOut:
        self._record("create_submission", ctx, body=body, max_submissions=max_submissions, datasets=datasets)
        return self._submission(ctx, model=body.model)

    async def get_submission(self, ctx: RunContext, sub_id: str) -> SubmissionOut:
        self._record("get_submission", ctx, sub_id=sub_id)
        return self._submission(ctx, sub_id=sub_id)

    async def upload_harness(self, ctx: RunContext, content: bytes, *, name: str | None = None) -> HarnessArchiveOut:
        self._record("upload_harness", ctx, content=content, name=name)
        return HarnessArchiveOut(id=HAR_ID, name=name or "h", sha256="0" * 64, bytes=len(content), entry="true", created_at=dt.datetime.now(dt.UTC))

    async def list_harnesses(self, ctx: RunContext) -> Page[HarnessArchiveOut]:
        self._record("list_harnesses", ctx)
        return Page[HarnessArchiveOut](data=[])

    async def get_harness(self, ctx: RunContext, harness_id: str) -> HarnessArchiveOut:
        self._record("get_harness", ctx, harness_id=harness_id)
        raise UpstreamProblem(problem(404, "not_found", f"harness archive {harness_id} not found", field="harness_archive"))

    async def harness_archive(self, ctx: RunContext, harness_id: str) -> bytes:
        self._record("harness_archive", ctx, harness_id=harness_id)
        return b"\x1f\x8b archive bytes"

    async def close(self) -> None:
        """Nothing to close: no connections."""


@dataclass
class Served:
    """The gateway app (``http``, no credentials of its own), its :class:`Gateway`, the grader stand-in and the ledger
    and trainer apps behind it."""

    http: TestClient
    grader: Grader
    services: dict[str, FastAPI]  # the ledger's and the trainer's apps

    @property
    def gateway(self) -> Gateway:
        return self.http.app.state.gateway  # type: ignore[attr-defined]

    def connect(self) -> Served:
        """Send the gateway's calls to the ledger and trainer apps and to the grader stand-in; ``self``."""
        self.gateway.ledger = LedgerClient(in_process(httpx.ASGITransport(app=self.services["ledger"]), "ledger"))
        self.gateway.trainer = TrainerClient(in_process(httpx.ASGITransport(app=self.services["trainer"]), "trainer"))
        self.gateway.grader = self.grader  # type: ignore[assignment]
        self.gateway.inference = InferenceClient(in_process(inference_stand_in(unreachable), "inference"))
        return self

    def load(self, doc: dict[str, Any]) -> dict[str, Any]:
        resp = self.http.post("/admin/benchmarks", json=doc, headers=ADMIN)
        assert resp.status_code == 201, resp.text
        return resp.json()

    def new_run(self, doc: dict[str, Any] | None = None, **overrides: Any) -> tuple[str, dict[str, str]]:
        """A run of ``doc`` (a fresh copy of the test benchmark by default): ``(run id, its agent's headers)``."""
        bm = self.load(doc or {**TEST_BENCHMARK, "name": f"chain-sum-{new_id('bm')[3:]}"})
        resp = self.http.post("/admin/runs", json={"benchmark": bm["id"], "agent_name": "agent", **overrides}, headers=ADMIN)
        assert resp.status_code == 201, resp.text
        return resp.json()["id"], {"Authorization": f"Bearer {resp.json()['api_key']}"}

    def answering(self, service: str, handler: Callable[[httpx.Request], httpx.Response], monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
        """``service`` (trainer|inference) answered by ``handler`` for this test; the requests it got."""
        seen: list[httpx.Request] = []

        def record(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return handler(request)

        if service == "inference":
            monkeypatch.setattr(self.gateway, service, InferenceClient(in_process(inference_stand_in(record), service)))
        else:
            monkeypatch.setattr(self.gateway, service, TrainerClient(in_process(httpx.MockTransport(record), service)))
        return seen


def settings_for(tmp: Path, **overrides: Any) -> GatewaySettings:
    return GatewaySettings(**{"data_dir": tmp, "admin_key": ADMIN_KEY, "service_token": GATEWAY_TOKEN, "rate_limits": "",
                              "max_upload_bytes": MAX_UPLOAD_BYTES, **overrides})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("gateway")
    ledger_app = create_ledger_app(LedgerSettings(database_url=f"sqlite:///{tmp}/ledger.sqlite", service_token="ledger-token",
                                                  trusted_tokens={"gateway": GATEWAY_TOKEN}))
    trainer_app = create_trainer_app(ServiceSettings(data_dir=tmp / "trainer", service_token=TRAINER_TOKEN, reconcile_interval_s=3600,
                                                     trusted_tokens={"gateway": GATEWAY_TOKEN}))
    with TestClient(ledger_app), TestClient(trainer_app), TestClient(create_app(settings_for(tmp)), base_url="http://gateway") as http:
        yield Served(http=http, grader=Grader(), services={"ledger": ledger_app, "trainer": trainer_app}).connect()


def assert_problem(resp: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    body = resp.json()
    assert body["status"] == status and (code is None or body["code"] == code), body
    return body


# --------------------------------------------------------------------------- liveness and readiness


def test_the_gateway_is_ready_only_while_every_service_behind_it_is(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """``/readyz`` asks each service's own; ``/healthz`` is liveness alone: a service still loading its model restarts
    nothing, it only holds traffic back."""
    ready = httpx.Response(200, json={"status": "ready", "service": "inference"})
    served.answering("inference", lambda r: ready if r.url.path == "/readyz" else httpx.Response(404), monkeypatch)
    assert served.http.get("/readyz").json() == {"status": "ready", "service": "gateway"}
    loading = problem(503, "not_ready", "inference is not ready: engines: loading smollm2-135m-instruct", unready={"engines": "loading"})
    served.answering("inference", lambda r: httpx.Response(503, json=loading, headers={"content-type": "application/problem+json"}), monkeypatch)
    refused = served.http.get("/readyz")
    body = assert_problem(refused, 503, "not_ready")
    assert list(body["unready"]) == ["inference"] and "loading" in body["unready"]["inference"] and int(refused.headers["Retry-After"]) > 0
    assert served.http.get("/healthz").status_code == 200


def test_a_service_whose_database_does_not_answer_is_not_ready(tmp_path: Path) -> None:
    from services.common.db import Database
    from services.ledger.app import create_app as ledger_app

    with TestClient(ledger_app(LedgerSettings(database_url=f"sqlite:///{tmp_path}/ledger.sqlite", service_token="t"))) as http:
        assert http.get("/readyz").json() == {"status": "ready", "service": "ledger"}
        http.app.state.ledger.db = Database("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1")  # type: ignore[attr-defined]
        body = assert_problem(http.get("/readyz"), 503, "not_ready")
        assert list(body["unready"]) == ["database"] and http.get("/healthz").status_code == 200


# --------------------------------------------------------------------------- who may call


def test_a_call_without_a_run_key_or_with_a_wrong_one_is_a_401_problem_and_is_audited(served: Served) -> None:
    assert "API key" in assert_problem(served.http.get("/v1/budget"), 401, "unauthorized")["detail"]
    assert assert_problem(served.http.get("/v1/budget", headers={"Authorization": "Bearer crk_wrong-key-never-issued"}), 401)["detail"] == "unknown API key"
    assert_problem(served.http.get("/v1/budget", headers={"Authorization": "Basic crk_wrong-key-never-issued"}), 401)
    assert_problem(served.http.get("/v1/budget", headers=ADMIN), 401)  # the admin key is no run key
    audit = served.http.get("/admin/audit", headers=ADMIN).json()["data"]
    refused = [e for e in audit if e["path"] == "/v1/budget"]
    assert {(e["actor"], e["status"]) for e in refused} == {("anonymous", 401)}
    assert "crk_wron" in {e["key_prefix"] for e in refused} and not any("never-issued" in json.dumps(e) for e in audit)


@pytest.mark.parametrize(("method", "path"), [("GET", "/admin/benchmarks"), ("POST", "/admin/benchmarks"), ("GET", "/admin/runs"),
                                              ("POST", "/admin/runs"), ("GET", "/admin/audit"), ("GET", "/admin/accounts"), ("GET", "/metrics")])
def test_operator_routes_answer_only_the_admin_key(served: Served, method: str, path: str) -> None:
    _run, agent = served.new_run()
    for headers in ({}, agent, {"Authorization": f"Bearer {ADMIN_KEY}x"}):
        assert_problem(served.http.request(method, path, headers=headers), 401, "unauthorized")


def test_a_revoked_key_is_refused_from_its_next_call(served: Served) -> None:
    run_id, agent = served.new_run()
    assert served.http.get("/v1/budget", headers=agent).status_code == 200
    revoked = served.http.post(f"/admin/runs/{run_id}/revoke", headers=ADMIN)
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    assert "revoked" in assert_problem(served.http.get("/v1/budget", headers=agent), 401)["detail"]
    assert_problem(served.http.post(f"/admin/runs/run_{'0' * 26}/revoke", headers=ADMIN), 404, "not_found")


def test_a_key_past_its_rate_limit_gets_a_429_problem_with_retry_after_and_other_keys_do_not(tmp_path: Path, served: Served) -> None:
    with TestClient(create_app(settings_for(tmp_path, rate_limits="3/minute"))) as http:
        limited = Served(http=http, grader=served.grader, services=served.services).connect()
        _a, agent_a = limited.new_run()
        _b, agent_b = limited.new_run()
        assert [http.get("/v1/budget", headers=agent_a).status_code for _ in range(3)] == [200, 200, 200]
        refused = http.get("/v1/budget", headers=agent_a)
        body = assert_problem(refused, 429)
        assert 1 <= int(refused.headers["Retry-After"]) <= 60 and body["retry_after_s"] == int(refused.headers["Retry-After"])
        assert http.get("/v1/budget", headers=agent_b).status_code == 200


def test_past_its_deadline_a_run_reads_but_changes_nothing(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = served.answering("inference", lambda _r: httpx.Response(200, json=COMPLETION), monkeypatch)
    _run, agent = served.new_run(wall_clock_hours=1e-9)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "2+2?"}]}
    assert_problem(served.http.post("/v1/chat/completions", json=body, headers=agent), 403, "run_expired")
    assert_problem(served.http.post("/v1/datasets", files={"file": ("d.jsonl", GOOD_ROW)}, headers=agent), 403, "run_expired")
    assert served.http.get("/v1/budget", headers=agent).status_code == 200 and calls == []


@pytest.mark.parametrize(("method", "path", "body", "status", "field"), [
    ("POST", "/v1/evaluations", {"model": MODEL, "limit": "1"}, 422, "limit"),
    ("POST", "/v1/evaluations", [{"model": MODEL}], 422, "body"),
    ("POST", "/v1/training/jobs", {"model": MODEL, "datasets": [], "recipe": {"max_steps": "4"}}, 422, "recipe.max_steps"),
    ("POST", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": "8"}, 422, "max_tokens"),
    ("POST", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "2+2?"}], "stream": 1}, 422, "stream"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "2+2=", "logprobs": True}, 422, "logprobs"),
    ("POST", "/v1/fine_tuning/jobs", {"model": MODEL, "training_file": "ds_01jd3k4m5n6p7q8r9s0t1v2w3x", "hyperparameters": {"n_epochs": "3"}}, 400, "hyperparameters.n_epochs"),
    ("POST", "/v1/submissions", {"model": MODEL, "note": 7}, 422, "note"),
])
def test_an_agents_body_of_the_wrong_json_type_is_refused_naming_the_field_and_changes_nothing(
        served: Served, monkeypatch: pytest.MonkeyPatch, method: str, path: str, body: object, status: int, field: str) -> None:
    """Strict JSON types on every agent route (StrictBodyRoute): ``"1"`` is no integer, ``1`` no boolean, an array no
    object; nothing reaches a service behind the gateway."""
    calls = served.answering("inference", lambda _r: httpx.Response(200, json=COMPLETION), monkeypatch)
    _run, agent = served.new_run()
    response = served.http.request(method, path, json=body, headers=agent)
    assert assert_problem(response, status)["field"] == field
    assert calls == [] and served.http.get("/v1/budget", headers=agent).json()["spent_usd_micros"] == 0
    assert_problem(served.http.request(method, path, json=body), 401)  # without a key: who calls comes first, then what they sent


# --------------------------------------------------------------------------- benchmarks and runs (operators)


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_benchmark_file_loads_once_each_task_registered_with_the_grader(served: Served, path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    bm = served.load(doc)
    names = ([t["name"] for t in doc["tasks"]] if "tasks" in doc else ["main"]) + (["evaluator"] if doc.get("track") == "evaluator" else [])
    registered = {t.task: t for t in served.grader.tasks.values() if t.task_id == bm["id"] or t.task_id in _task_ids(served, bm["id"])}
    assert sorted(registered) == sorted(names) and bm["warnings"] == []
    assert served.load(doc)["id"] == bm["id"]  # the same document again: the same benchmark
    changed = served.http.post("/admin/benchmarks", json={**doc, "description": "another"}, headers=ADMIN)
    assert assert_problem(changed, 409, "conflict")["field"] == "name"
    assert bm["id"] in {b["id"] for b in served.http.get("/admin/benchmarks", headers=ADMIN).json()["data"]}
    baselines = served.http.get(f"/admin/benchmarks/{doc['name']}/baselines", headers=ADMIN).json()
    assert sorted(baselines["tasks"]) == sorted(names) and baselines["initial_status"] == "succeeded" and baselines["benchmark_id"] == bm["id"]
    assert {t["initial"]["value"] for t in baselines["tasks"].values()} == {served.grader.initial}
    if len(names) == 1:  # a one-task benchmark is graded under its own id
        assert baselines["tasks"]["main"]["task_id"] == bm["id"]


def _task_ids(served: Served, bm_id: str) -> set[str]:
    from gateway.models import Benchmark

    with served.gateway.db.session() as s:
        return set(s.get(Benchmark, bm_id).task_ids().values())  # type: ignore[union-attr]


def test_the_graders_warnings_reach_the_operator(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(served.grader, "warnings", ["task 'main' has 120 distinct items"])
    assert served.load({**TEST_BENCHMARK, "name": "chain-sum-warned"})["warnings"] == ["task 'main' has 120 distinct items"]
    assert served.http.get("/admin/benchmarks/chain-sum-warned", headers=ADMIN).json()["warnings"] == ["task 'main' has 120 distinct items"]


def test_a_bad_benchmark_file_is_a_422_naming_the_key(served: Served) -> None:
    doc = copy.deepcopy(TEST_BENCHMARK)
    doc["budget"]["usd"] = -1
    assert assert_problem(served.http.post("/admin/benchmarks", json=doc, headers=ADMIN), 422, "invalid_input")["field"] == "budget.usd"
    assert assert_problem(served.http.get("/admin/benchmarks/no-such-benchmark/baselines", headers=ADMIN), 404)["field"] == "benchmark"


def test_a_new_run_gets_its_key_once_and_a_ledger_account_with_its_budget(served: Served) -> None:
    run_id, agent = served.new_run(budget_usd=2.5)
    budget = served.http.get("/v1/budget", headers=agent).json()
    assert budget == {"budget_usd_micros": 2_500_000, "remaining_usd_micros": 2_500_000, "held_usd_micros": 0, "spent_usd_micros": 0,
                      "spent_by_kind": budget["spent_by_kind"], "usage_by_kind": budget["usage_by_kind"]}
    listed = {r["id"]: r for r in served.http.get("/admin/runs", headers=ADMIN).json()["data"]}
    assert "api_key" not in listed[run_id] and listed[run_id]["key_prefix"] == agent["Authorization"][7:15]
    entries = served.http.get(f"/admin/runs/{run_id}/entries", headers=ADMIN).json()
    assert entries["object"] == "list" and [(e["type"], e["amount_usd_micros"]) for e in entries["data"]] == [("grant", 2_500_000)]
    assert run_id in {a["account_id"] for a in served.http.get("/admin/accounts", headers=ADMIN).json()}
    missing = served.http.post("/admin/runs", json={"benchmark": "no-such-benchmark", "agent_name": "a"}, headers=ADMIN)
    assert assert_problem(missing, 404, "not_found")["field"] == "benchmark"


def test_a_refund_reaches_the_ledger_and_its_answer_passes_through(served: Served) -> None:
    run_id, _agent = served.new_run()
    refund = {"entry_id": "ent_nosuchcharge", "reason": "steps lost to a worker crash", "idempotency_key": "refund-1"}
    assert_problem(served.http.post(f"/admin/runs/{run_id}/refunds", json=refund, headers=ADMIN), 404, "not_found")  # the ledger's
    assert_problem(served.http.post(f"/admin/runs/run_{'0' * 26}/refunds", json=refund, headers=ADMIN), 404, "not_found")  # the gateway's
    assert_problem(served.http.post(f"/admin/runs/{run_id}/refunds", json={**refund, "amount_usd_micros": 10**16}, headers=ADMIN), 422)


# --------------------------------------------------------------------------- the run card and tasks


def test_the_run_card_shows_the_benchmark_its_limits_and_what_is_left(served: Served) -> None:
    run_id, agent = served.new_run()
    sub = {"object": "submission", "task": "main", "model": MODEL, "harness": Harness().model_dump(), "created_at": "2026-01-01T00:00:00Z"}
    served.grader.submissions[run_id] = [SubmissionOut(**sub, id="sub_a", status="failed", failure_cause="platform", counted=False)]
    card = served.http.get("/v1/run", headers=agent).json()
    assert card["run_id"] == run_id and card["track"] == "joint" and card["editable"] == ["data", "trainer", "harness"]
    assert card["benchmark"]["suite"] == "reasoning_gym" and card["benchmark"]["initial_system"]["model"] == MODEL
    assert card["benchmark"]["initial_system"]["harness"]["max_tokens"] == TEST_BENCHMARK["evaluation"]["max_tokens"]
    assert card["limits"]["final_submissions"] == {"limit": 1, "used": 0, "left": 1}  # a platform failure is given back
    assert card["limits"]["validation_evaluations_total"] == 3 and card["budget"]["budget_usd_micros"] == 1_000_000
    assert 0 < card["seconds_left"] <= 2 * 3600


def test_a_benchmark_of_several_tasks_needs_the_task_named(served: Served) -> None:
    one = {k: TEST_BENCHMARK[k] for k in ("suite", "initial_system", "reference")}
    doc = {**{k: v for k, v in TEST_BENCHMARK.items() if k not in one}, "name": "two-sums", "tasks": [{"name": "sums", **one}, {"name": "more", **one}]}
    _run, agent = served.new_run(doc)
    assert assert_problem(served.http.get("/v1/suite/validation", headers=agent), 422, "invalid_input")["field"] == "task"
    assert "sums, more" in assert_problem(served.http.get("/v1/suite/validation?task=nope", headers=agent), 422)["detail"]
    assert [i["id"] for i in served.http.get("/v1/suite/validation?task=more", headers=agent).json()["data"]] == ["more-0", "more-1"]
    card = served.http.get("/v1/run", headers=agent).json()
    assert [t["name"] for t in card["benchmark"]["tasks"]] == ["sums", "more"] and "suite" not in card["benchmark"]
    assert card["limits"]["final_submissions_by_task"] == {"sums": {"limit": 1, "used": 0, "left": 1}, "more": {"limit": 1, "used": 0, "left": 1}}


# --------------------------------------------------------------------------- forwarding to the trainer and inference


def test_a_dataset_upload_reaches_the_trainer_as_the_runs(served: Served) -> None:
    _run, agent = served.new_run()
    up = served.http.post("/v1/datasets", files={"file": ("sums.jsonl", GOOD_ROW)}, data={"name": "sums"}, headers=agent)
    assert up.status_code == 201, up.text
    ds = up.json()
    assert (ds["name"], ds["rows"], ds["format"]) == ("sums", 1, "messages")
    assert [d["id"] for d in served.http.get("/v1/datasets", headers=agent).json()["data"]] == [ds["id"]]
    assert served.http.get(f"/v1/datasets/{ds['id']}", headers=agent).json() == ds
    _other, stranger = served.new_run()
    assert_problem(served.http.get(f"/v1/datasets/{ds['id']}", headers=stranger), 404)  # the trainer's, passed through
    bad = served.http.post("/v1/datasets", files={"file": ("bad.jsonl", b'{"messages": 1}\n')}, headers=agent)
    assert assert_problem(bad, 422)["line"] == 1
    big = served.http.post("/v1/datasets", files={"file": ("big.jsonl", GOOD_ROW * (MAX_UPLOAD_BYTES // len(GOOD_ROW) + 1))}, headers=agent)
    assert assert_problem(big, 413)["field"] == "file"


def test_a_harness_archive_reaches_the_grader_as_the_runs_and_only_where_the_harness_is_editable(served: Served) -> None:
    run_id, agent = served.new_run()
    served.grader.calls.clear()
    up = served.http.post("/v1/harnesses", files={"file": ("h.tar.gz", b"\x1f\x8b tarball")}, data={"name": "mine"}, headers=agent)
    assert up.status_code == 201 and up.json()["id"] == HAR_ID, up.text
    assert served.http.get("/v1/harnesses", headers=agent).json()["data"] == []
    assert assert_problem(served.http.get(f"/v1/harnesses/{HAR_ID}", headers=agent), 404)["field"] == "harness_archive"  # the grader's, unchanged
    download = served.http.get(f"/v1/harnesses/{HAR_ID}/archive", headers=agent)
    assert (download.status_code, download.headers["content-type"], download.content) == (200, "application/gzip", b"\x1f\x8b archive bytes")
    assert_problem(served.http.get("/v1/harnesses/not-an-id", headers=agent), 422)
    assert [(m, ctx.run_id) for m, ctx, _ in served.grader.calls] == [(m, run_id) for m in ("upload_harness", "list_harnesses", "get_harness", "harness_archive")]
    assert served.grader.calls[0][2] == {"content": b"\x1f\x8b tarball", "name": "mine"}
    big = served.http.post("/v1/harnesses", files={"file": ("h.tar.gz", b"x" * (MAX_UPLOAD_BYTES + 1))}, headers=agent)
    assert assert_problem(big, 413)["field"] == "file"

    _run, data_only = served.new_run(track="data")
    for refused in (served.http.post("/v1/harnesses", files={"file": ("h.tar.gz", b"x")}, headers=data_only),
                    served.http.post("/v1/evaluations", json={"model": MODEL, "harness_archive": HAR_ID}, headers=data_only),
                    served.http.post("/v1/submissions", json={"model": MODEL, "harness_archive": HAR_ID}, headers=data_only)):
        assert assert_problem(refused, 403, "not_editable")["operation"] in ("uploading a harness archive", "evaluating with a custom harness",
                                                                             "submitting a custom harness")


def test_a_harness_track_run_cannot_upload_data(served: Served) -> None:
    _run, agent = served.new_run(track="harness")
    refused = served.http.post("/v1/datasets", files={"file": ("d.jsonl", GOOD_ROW)}, headers=agent)
    assert assert_problem(refused, 403, "not_editable")["operation"] == "uploading a dataset"


def test_a_training_job_goes_to_the_trainer_with_the_benchmarks_locked_recipe(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    job = {"id": "job_x", "object": "training.job", "status": "queued", "model": MODEL, "base_model": MODEL, "datasets": ["ds_x"],
           "recipe": {}, "steps_done": 0, "estimated_tokens": 100, "trained_tokens": 0, "created_at": "2026-01-01T00:00:00Z"}

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(201, json={**job, "recipe": json.loads(request.content)["recipe"]})

    sent = served.answering("trainer", answer, monkeypatch)
    _run, agent = served.new_run()
    locked = served.http.post("/v1/training/jobs", json={"model": MODEL, "datasets": ["ds_x"], "recipe": {"method": "dpo"}}, headers=agent)
    assert assert_problem(locked, 403, "not_editable")["field"] == "recipe.method" and sent == []
    made = served.http.post("/v1/training/jobs", json={"model": MODEL, "datasets": ["ds_x"], "recipe": {"max_steps": 3}},
                            headers={**agent, "Idempotency-Key": "train-1"})
    assert made.status_code == 201, made.text
    body = json.loads(sent[0].content)
    assert (body["recipe"]["max_steps"], body["recipe"]["method"], body["recipe"]["adapter"]) == (3, "sft", "lora")
    assert sent[0].headers["Idempotency-Key"] == "train-1" and sent[0].headers["Authorization"] == f"Bearer {GATEWAY_TOKEN}"


def test_a_services_problem_passes_through_unchanged(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    exhausted = problem(402, "budget_exhausted", "the budget cannot cover 64 tokens", remaining_usd_micros=5)
    served.answering("inference", lambda _r: httpx.Response(402, json=exhausted), monkeypatch)
    _run, agent = served.new_run()
    resp = served.http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, headers=agent)
    assert assert_problem(resp, 402) == exhausted


@pytest.mark.parametrize("answer", [
    lambda _r: httpx.Response(503, json=problem(503, "upstream_unavailable", "ledger unavailable", retry_after_s=2)),
    lambda _r: httpx.Response(503, text="<html>Service Unavailable</html>"),
], ids=["problem", "html"])
def test_an_upstream_503_is_a_503_problem(served: Served, monkeypatch: pytest.MonkeyPatch, answer: Callable[[httpx.Request], httpx.Response]) -> None:
    served.answering("inference", answer, monkeypatch)
    _run, agent = served.new_run()
    assert_problem(served.http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, headers=agent), 503)


def test_a_service_that_cannot_be_reached_is_a_503_problem_to_retry(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    served.answering("inference", refuse, monkeypatch)
    _run, agent = served.new_run()
    resp = served.http.get("/v1/models", headers=agent)
    body = assert_problem(resp, 503, "upstream_unavailable")
    assert "inference" in body["detail"] and int(resp.headers["Retry-After"]) >= 1


def test_the_model_list_and_a_completion_come_back_as_inference_answered(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    models = {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "crucible"}]}
    sent = served.answering("inference", lambda r: httpx.Response(200, json=models if r.method == "GET" else COMPLETION), monkeypatch)
    run_id, agent = served.new_run()
    assert served.http.get("/v1/models", headers=agent).json() == models
    request = {"model": MODEL, "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 4}
    assert served.http.post("/v1/chat/completions", json=request, headers=agent).json() == ChatCompletion(**COMPLETION).model_dump(mode="json")
    body = json.loads(sent[1].content)
    assert {k: body[k] for k in request} == request and None not in body.values()  # null fields are left out
    episode = served.http.get(f"/admin/runs/{run_id}/episode", headers=ADMIN).json()["data"]
    assert [(e["method"], e["path"], e["status"]) for e in episode] == [("GET", "/v1/models", 200), ("POST", "/v1/chat/completions", 200)]


# --------------------------------------------------------------------------- the leaderboard


def test_the_leaderboard_ranks_runs_by_final_score_with_gap_closed_and_spend(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = {**TEST_BENCHMARK, "name": "chain-sum-ranked"}
    (a, _), (b, _), (c, _) = served.new_run(doc), served.new_run(doc), served.new_run(doc)
    bm_id = served.http.get("/admin/runs", headers=ADMIN).json()["data"][-1]["benchmark_id"]
    graded = dt.datetime.now(dt.UTC)

    def entry(run_id: str, status: str, value: float | None, contaminated: bool | None = None) -> LeaderboardEntry:
        score = Score(value=value, n=24, metric="avg@k", k=1, ci_low=value - 0.1, ci_high=value + 0.1) if value is not None else None
        audit = ContaminationReport(contaminated=contaminated, flagged_items=1, items=24, datasets=1, rows=1, ngram=13, min_overlap=0.5) \
            if contaminated is not None else None
        return LeaderboardEntry(submission_id=f"sub_{run_id[4:]}", run_id=run_id, task_id=bm_id, status=status, score=score,
                                graded_at=graded if value is not None else None, validation_evaluations=2, contamination=audit)

    monkeypatch.setattr(served.grader, "entries", [entry(a, "graded", 0.6), entry(b, "graded", 0.8, contaminated=True), entry(c, "queued", None)])
    rows = [r for r in served.http.get("/v1/leaderboard").json()["data"] if r["benchmark"] == "chain-sum-ranked"]
    assert [(r["run_id"], r["rank"], r["status"]) for r in rows] == [(b, 1, "graded"), (a, 2, "graded"), (c, None, "queued")]
    assert rows[0]["gap_closed"] == pytest.approx((0.8 - 0.2) / (1.0 - 0.2)) and rows[0]["contaminated"] is True
    assert rows[0]["final_ci"] == pytest.approx([0.7, 0.9]) and rows[0]["spent_usd"] == 0.0 and rows[2]["final_score"] is None
    html = served.http.get("/leaderboard")
    assert html.status_code == 200 and "chain-sum-ranked" in html.text


def test_the_public_leaderboard_withholds_an_evaluators_sealed_figures_while_a_run_of_its_benchmark_is_open(served: Served,
                                                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.models import Benchmark
    from services.common.contracts import EvaluatorGrade, TargetAgreement

    run_id, _ = served.new_run(evaluator_benchmark())
    with served.gateway.db.session() as s:
        bm = s.get(Benchmark, served.http.get("/admin/runs", headers=ADMIN).json()["data"][-1]["benchmark_id"])
        task_id, name = bm.task_ids()["evaluator"], bm.name
    grade = EvaluatorGrade(pairwise_agreement=0.75, kendall_tau=0.5, concordance=0.4, ceiling=0.9, candidates=3, model_calls=30, prompt_tokens=900,
                           completion_tokens=100, sandbox_s=4, exhausted=0, partial=0, failed=0,
                           targets=[TargetAgreement(target="hidden", pairwise_agreement=0.75, ci_low=0.61, ci_high=0.87, kendall_tau=0.5,
                                                    concordance=0.4, ceiling=0.9)])
    score = Score(value=0.75, n=3, metric="pairwise_agreement", k=1)
    monkeypatch.setattr(served.grader, "entries", [LeaderboardEntry(submission_id="sub_e", run_id=run_id, task_id=task_id, status="graded", score=score,
                                                                    graded_at=dt.datetime.now(dt.UTC), validation_evaluations=1, grade=grade)])

    def row(path: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
        return next(r for r in served.http.get(path, headers=headers).json()["data"] if r["benchmark"] == name)

    public = row("/v1/leaderboard")  # the run is open: the grade itself, and what the evaluator did, only
    assert public["sealed_withheld"] is True and public["final_score"] == 0.75
    shown = public["evaluator"]
    assert (shown["pairwise_agreement"], shown["model_calls"], shown["targets"]) == (0.75, 30, [])
    assert (shown["kendall_tau"], shown["concordance"], shown["ceiling"]) == (None, None, None)
    page = served.http.get("/leaderboard").text
    assert "withheld until every run has ended" in page and "90.0%" not in page and "61.0–87.0%" not in page and ">hidden<" not in page
    operator = row("/admin/leaderboard", ADMIN)
    assert operator["sealed_withheld"] is False and operator["evaluator"] == grade.model_dump(mode="json")
    assert_problem(served.http.get("/admin/leaderboard"), 401)
    served.http.post(f"/admin/runs/{run_id}/revoke", headers=ADMIN)  # its one run ended: the benchmark is closed
    closed = row("/v1/leaderboard")
    assert closed["sealed_withheld"] is False and closed["evaluator"] == grade.model_dump(mode="json")
    assert "90.0%" in served.http.get("/leaderboard").text


def test_the_audits_findings_on_a_runs_harness_archives_are_the_operators_to_read(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = {**TEST_BENCHMARK, "name": f"chain-sum-audited-{new_id('bm')[3:]}"}
    run_id, _ = served.new_run(doc)
    bm_id = served.http.get("/admin/runs", headers=ADMIN).json()["data"][-1]["benchmark_id"]
    findings = ["har_01: swe project toolz: released library: 1 (toolz/itertoolz.py)"]
    audit = ContaminationReport(contaminated=True, flagged_items=0, items=24, datasets=0, rows=0, ngram=13, min_overlap=0.5, harness_archives=1,
                                harness_findings=findings)
    monkeypatch.setattr(served.grader, "entries", [LeaderboardEntry(submission_id="sub_h", run_id=run_id, task_id=bm_id, status="graded",
                                                                    score=Score(value=0.9, n=24, metric="avg@k", k=1), validation_evaluations=0,
                                                                    graded_at=dt.datetime.now(dt.UTC), contamination=audit)])
    [public] = [r for r in served.http.get("/v1/leaderboard").json()["data"] if r["benchmark"] == doc["name"]]
    [operator] = [r for r in served.http.get("/admin/leaderboard", headers=ADMIN).json()["data"] if r["benchmark"] == doc["name"]]
    assert public["contaminated"] is True and public["tasks"][0]["harness_findings"] is None and "itertoolz" not in served.http.get("/leaderboard").text
    assert operator["contaminated"] is True and operator["tasks"][0]["harness_findings"] == findings


# --------------------------------------------------------------------------- the run-scoped routes, each once


def test_the_grader_routes_reach_the_grader_for_the_calling_run_and_task_with_the_benchmarks_limits(served: Served) -> None:
    run_id, agent = served.new_run()
    served.grader.calls.clear()
    sample = served.http.get("/v1/suite/train-sample", params={"offset": 5, "limit": 3}, headers=agent)
    assert [i["id"] for i in sample.json()["data"]] == ["train-5", "train-6", "train-7"]
    created = served.http.post("/v1/evaluations", json={"model": "smollm2-135m-instruct", "limit": 2}, headers=agent)
    assert created.status_code == 201 and created.json()["status"] == "queued"
    assert served.http.get("/v1/evaluations", headers=agent).json()["data"][0]["id"] == EVAL_ID
    assert served.http.get(f"/v1/evaluations/{EVAL_ID}", headers=agent).json()["model"] == "smollm2-135m-instruct"
    assert_problem(served.http.get(f"/v1/evaluations/{new_id('eval')}", headers=agent), 404, "not_found")  # the grader's 404, unchanged
    assert served.http.get(f"/v1/evaluations/{EVAL_ID}/trajectories", headers=agent).json()["data"] == []
    submitted = served.http.post("/v1/submissions", json={"model": "smollm2-135m-instruct", "note": "final"}, headers=agent)
    assert submitted.status_code == 201 and served.http.get(f"/v1/submissions/{SUB_ID}", headers=agent).json()["id"] == SUB_ID
    assert [m for m, _, _ in served.grader.calls] == ["train_sample", "create_evaluation", "list_evaluations", "get_evaluation", "get_evaluation",
                                                      "get_trajectories", "create_submission", "get_submission"]
    assert {(ctx.run_id, ctx.task_id in served.grader.tasks) for _, ctx, _ in served.grader.calls} == {(run_id, True)}
    args = {m: a for m, _, a in served.grader.calls}
    assert args["train_sample"] == {"offset": 5, "limit": 3} and args["create_evaluation"]["body"].limit == 2
    assert args["create_submission"]["max_submissions"] == TEST_BENCHMARK["limits"]["final_submissions"]
    assert args["create_evaluation"]["limits"] == EvaluationLimits()  # the test benchmark sets none: the defaults


@pytest.mark.parametrize(("method", "path"), [  # the job id goes in at run time: a test's name is the same in every process
    ("GET", "/v1/training/jobs/{job}"), ("GET", "/v1/training/jobs/{job}/events"),
    ("GET", "/v1/training/jobs/{job}/checkpoints"), ("POST", "/v1/training/jobs/{job}/cancel"),
])
def test_a_job_route_reaches_the_trainer_and_its_404_comes_back_unchanged(served: Served, method: str, path: str) -> None:
    _, agent = served.new_run()
    assert_problem(served.http.request(method, path.format(job=JOB_ID), headers=agent), 404, "not_found")
    assert served.http.get("/v1/training/jobs", headers=agent).json()["data"] == []


# --------------------------------------------------------------------------- run pages and MCP over HTTP


@pytest.mark.parametrize("cookie", ["admin.9" + "9" * 5000 + ".mac", "admin.01893456000.mac", "admin.-5.mac", "admin..mac", "x"],
                         ids=["5001 digits", "leading zero", "negative", "no expiry", "no dots"])
def test_a_malformed_page_cookie_is_a_401_never_a_500(served: Served, cookie: str) -> None:
    run_id, _ = served.new_run()
    assert_problem(served.http.get(f"/runs/{run_id}", headers={"Cookie": f"crucible_key={cookie}"}), 401)


@pytest.mark.parametrize("headers", [{"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}, {"Origin": "https://elsewhere.example"},
                                     {"Origin": "null"}])
def test_a_sign_in_posted_from_another_site_is_refused(served: Served, headers: dict[str, str]) -> None:
    run_id, agent = served.new_run()
    key = agent["Authorization"].split()[1]
    resp = served.http.post("/runs/login", data={"run_id": run_id, "key": key}, headers=headers, follow_redirects=False)
    assert_problem(resp, 403) and "set-cookie" not in resp.headers
    same = served.http.post("/runs/login", data={"run_id": run_id, "key": key}, headers={"Origin": "http://gateway"}, follow_redirects=False)
    assert same.status_code == 303 and "crucible_key=" in same.headers["set-cookie"]


def test_mcp_answers_post_only_and_counts_each_request_once_against_the_keys_rate_limit(tmp_path: Path, served: Served) -> None:
    """Each /mcp request is one request of the key (the tools' own calls to /v1 are not counted again), and a GET
    (a standing event stream, which a stateless server does not keep) is a 405."""
    _, agent = served.new_run()
    init = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
    assert served.http.get("/mcp", headers=agent | accept).status_code == 405
    with TestClient(create_app(settings_for(tmp_path, rate_limits="3/minute")), base_url="http://gateway") as http:
        limited = Served(http=http, grader=served.grader, services=served.services).connect()
        _, key = limited.new_run()
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "budget", "arguments": {}}}  # a tool that calls /v1
        answers = [http.post("/mcp", json=call, headers=key | accept).status_code for _ in range(3)]
        assert answers == [200, 200, 200]
        refused = http.post("/mcp", json=init, headers=key | accept)  # a JSON-RPC error the MCP client shows, not an opaque 429
        assert refused.status_code == 200 and refused.json()["error"]["message"].startswith("429 rate_limited")
        assert refused.json()["error"]["data"]["status"] == 429 and refused.json()["id"] == init["id"]


# --------------------------------------------------------------------------- the evaluator track


def completions(requests: list[httpx.Request]) -> list[httpx.Request]:
    """The completions among the requests inference got (not the prompt counts the gateway asks for first)."""
    return [r for r in requests if r.url.path == "/internal/chat/completions"]


def evaluator_benchmark() -> dict[str, Any]:
    doc = {k: v for k, v in TEST_BENCHMARK.items() if k not in ("suite", "initial_system", "reference", "recipe")}
    doc["evaluation"] = {**doc["evaluation"], "context_tokens": 1024}
    return {**doc, "name": f"evaluator-{new_id('bm')[3:]}", "track": "evaluator",
            "candidates": [{"model": MODEL, "harness": {"system_prompt": f"You are system {i}.", "max_tokens": 8}} for i in range(3)],
            "tasks": [{"name": "dev", "target": "development", "suite": TEST_BENCHMARK["suite"]},
                      {"name": "hidden", "target": "sealed", "suite": TEST_BENCHMARK["suite"]}]}


def test_an_evaluator_track_run_reaches_its_candidates_only_by_their_opaque_names(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    _, agent = served.new_run(evaluator_benchmark())
    assert [m["id"] for m in served.http.get("/v1/models", headers=agent).json()["data"]] == ["candidate-01", "candidate-02", "candidate-03"]
    card = served.http.get("/v1/run", headers=agent)
    assert card.status_code == 200 and MODEL not in card.text and "You are system" not in card.text
    benchmark = card.json()["benchmark"]
    assert benchmark["candidates"] == ["candidate-01", "candidate-02", "candidate-03"]
    assert [(t["name"], t["target"]) for t in benchmark["tasks"]] == [("evaluator", None), ("dev", "development"), ("hidden", "sealed")]
    assert card.json()["limits"]["final_submissions"]["limit"] == 1 and "final_submissions_by_task" not in card.json()["limits"]  # targets take none
    dev = served.http.get("/v1/suite/candidate-scores", params={"task": "dev"}, headers=agent)
    assert [c["candidate"] for c in dev.json()["data"]] == ["candidate-01", "candidate-02", "candidate-03"] and MODEL not in dev.text
    assert_problem(served.http.get("/v1/suite/candidate-scores", params={"task": "hidden"}, headers=agent), 404)

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/internal/chat/prompt-tokens":  # a word a token; "too long" fits no candidate
            counts = [sum(len((m.get("content") or "").split()) for m in r["messages"]) + 5000 * (r["messages"][-1]["content"] == "too long")
                      for r in body["requests"]]
            return httpx.Response(200, json={"prompt_tokens": counts, "context_tokens": [1024] * len(counts)})
        if body["messages"][-1]["content"] == "too long":
            return httpx.Response(422, json=problem(422, "context_exceeded", f"the prompt is 9022 tokens; with max_tokens 8 it exceeds "
                                                                             f"{body['model']}'s context of 8192", field="messages", prompt_tokens=9022))
        if body.get("stream"):
            events = "".join(f"data: {json.dumps({'id': 'c', 'object': 'chat.completion.chunk', 'created': 0, 'model': body['model'], 'choices': []})}\n\n"
                             for _ in range(3))
            async def chunks() -> Any:  # in pieces that split the events, as a network may
                text = (events + "data: [DONE]\n\n").encode()
                for i in range(0, len(text), 50):
                    yield text[i:i + 50]

            return httpx.Response(200, content=chunks(), headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json={**COMPLETION, "model": body["model"]})

    calls = served.answering("inference", answer, monkeypatch)
    ask = {"model": "candidate-02", "messages": [{"role": "user", "content": "1 + 1 ="}], "max_tokens": 64}
    resp = served.http.post("/v1/chat/completions", json=ask, headers=agent)
    assert resp.status_code == 200 and resp.json()["model"] == "candidate-02" and MODEL not in resp.text
    sent = json.loads(completions(calls)[-1].content)
    assert sent["model"] == MODEL and sent["messages"][0]["role"] == "system" and sent["max_tokens"] == 8  # the candidate's harness applied
    assert completions(calls)[-1].headers["X-Crucible-Context-Tokens"] == "1024"  # and the benchmark's context, as in its target gradings
    for name in ("candidate-01", "candidate-03"):  # billed for the run's own 4 words whichever candidate answers, at one model's prices
        served.http.post("/v1/chat/completions", json={**ask, "model": name}, headers=agent)
    billed = {(c.headers["X-Crucible-Billed-Prompt-Tokens"], c.headers["X-Crucible-Billed-Model"]) for c in completions(calls)[-3:]}
    assert billed == {("4", MODEL)}
    calls.clear()
    monkeypatch.setattr(served.gateway.settings, "candidate_key", "a-key-set-after-the-benchmark-was-loaded")
    served.http.post("/v1/chat/completions", json=ask, headers=agent)
    assert json.loads(calls[-1].content)["messages"][0] == sent["messages"][0]  # the names the targets graded stay as they were
    calls.pop()
    stream = served.http.post("/v1/chat/completions", json={**ask, "stream": True}, headers=agent)
    assert stream.status_code == 200 and stream.text.count('"model":"candidate-02"') == 3 and MODEL not in stream.text
    refused = assert_problem(served.http.post("/v1/chat/completions", json={**ask, "messages": [{"role": "user", "content": "too long"}]}, headers=agent), 422)
    assert "candidate-02" in refused["detail"] and MODEL not in json.dumps(refused) and refused["field"] == "messages" and refused["code"] == "context_exceeded"
    assert not re.search(r"\d", refused["detail"].replace("candidate-02", "")) and "prompt_tokens" not in refused  # nothing of its system: no cap, no length
    for model in (MODEL, "candidate-04", "ckpt_01jd3k4m5n6p7q8r9s0t1v2w3x"):
        assert assert_problem(served.http.post("/v1/chat/completions", json={**ask, "model": model}, headers=agent), 422)["field"] == "model"
    legacy = served.http.post("/v1/completions", json={"model": "candidate-02", "prompt": "1 + 1 ="}, headers=agent)
    assert assert_problem(legacy, 422)["field"] == "model"
    assert len(completions(calls)) == 1  # the stream's: nothing refused reached inference's completions (too long: refused on the counts)
    bm = served.load(evaluator_benchmark())
    for benchmark, track in ((bm["id"], "joint"), (served.load({**TEST_BENCHMARK, "name": f"plain-{new_id('bm')[3:]}"})["id"], "evaluator")):
        refused = served.http.post("/admin/runs", json={"benchmark": benchmark, "agent_name": "a", "track": track}, headers=ADMIN)
        assert assert_problem(refused, 422)["field"] == "track"

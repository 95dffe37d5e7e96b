"""The grader's routes in this process: the app from ``create_app`` on temporary SQLite databases (its own and the
test store), its ledger calls answered by the real ledger app in this process, inference and the trainer by
stand-ins. Calls are made as the gateway makes them, through :class:`GraderClient`, or raw where the request itself
is wrong. The evaluation queue is a list; a test runs what was sent with ``grader.worker``, as an eval worker would."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from inference_service.client import InferenceClient
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from grader import grading_tasks, repository, splits, worker
from grader.app import create_app
from grader.client import GraderClient
from grader.models import Evaluation, GradingTask, Trajectory
from grader.sandboxes import SandboxUnavailable
from grader.service import Grader
from grader.settings import GraderSettings
from services.common.auth import RunContext, run_headers
from services.common.contracts import EvaluationCreate, EvaluationLimits, GradingSpec, SubmissionCreate
from services.common.db import utcnow
from services.common.errors import UpstreamProblem
from services.common.http import ServiceClient
from services.ledger.app import create_app as create_ledger_app
from services.ledger.client import LedgerClient
from services.ledger.schemas import AccountCreate, HoldStatus
from services.ledger.settings import LedgerSettings
from tests.conftest import TEST_BENCHMARK
from tests.unit.inprocess import in_process

BASE = "smollm2-135m-instruct"
GATEWAY_TOKEN, GRADER_TOKEN = "gateway-token-for-grader-tests", "grader-token-for-grader-tests"
PROBLEM_JSON = "application/problem+json"


def stand_in(name: str, handler: Any) -> ServiceClient:  # noqa: ANN401 - an httpx handler
    """A transport whose calls ``handler`` answers."""
    transport = ServiceClient(f"http://{name}", GRADER_TOKEN, name=name)
    transport.client = httpx.Client(base_url=f"http://{name}", transport=httpx.MockTransport(handler))
    return transport


def inference(request: httpx.Request) -> httpx.Response:
    """Inference: every model name is a base model; every completion answers ``0``."""
    if request.method == "GET":
        model = request.url.path.rsplit("/", 1)[1]
        if model.startswith("ckpt_"):
            return httpx.Response(404, json={"status": 404, "title": "Not found", "code": "not_found", "detail": f"unknown model {model}"})
        return httpx.Response(200, json={"id": model, "object": "model", "owned_by": "crucible", "base_model": model})
    body = json.loads(request.content)
    return httpx.Response(200, json={"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": body["model"],
                                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "0"}, "finish_reason": "stop"}],
                                     "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}})


@dataclass
class Served:
    http: TestClient  # the grader app, called with the gateway's token
    grader: GraderClient  # the gateway's client of it
    service: Grader  # app.state.grader
    ledger: LedgerClient
    queue: list[str]
    task_id: str

    def ctx(self, run_id: str) -> RunContext:
        """A run of the registered task with an open ledger account of 1 USD."""
        self.ledger.open_account(AccountCreate(account_id=run_id, budget_usd_micros=1_000_000))
        return RunContext(run_id=run_id, task_id=self.task_id)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("grader")
    ledger_app = create_ledger_app(LedgerSettings(data_dir=tmp / "ledger", service_token="ledger-token", trusted_tokens={"grader": GRADER_TOKEN}))
    settings = GraderSettings(data_dir=tmp, grader_test_seed=4321, service_token=GRADER_TOKEN, trusted_tokens={"gateway": GATEWAY_TOKEN},
                              inference_concurrency=2, scoring_concurrency=2)
    with TestClient(ledger_app, base_url="http://ledger") as ledger_http, TestClient(create_app(settings), base_url="http://grader") as http:
        service: Grader = http.app.state.grader  # type: ignore[attr-defined]
        service.close()  # its clients reached the configured URLs: the ledger here, inference as a stand-in
        queue: list[str] = []
        service.ledger = ledger = LedgerClient(in_process(ledger_http, GRADER_TOKEN, "ledger"))
        service.inference = InferenceClient(stand_in("inference", inference))
        service.enqueue = queue.append
        service.enqueue_build = None  # no queue: a task's splits are built in the registering call
        client = GraderClient(in_process(http, GATEWAY_TOKEN, "grader"))
        spec = GradingSpec(task_id="bm_routes", suite=TEST_BENCHMARK["suite"], initial_system=TEST_BENCHMARK["initial_system"],
                           reference_score=1.0, evaluation=TEST_BENCHMARK["evaluation"])
        registered = client.register_task(spec)
        assert (registered.task_id, registered.validation_items, registered.test_items, registered.initial_status) == ("bm_routes", 16, 24, "queued")
        yield Served(http, client, service, ledger, queue, spec.task_id)


def problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert (response.status_code, response.headers["content-type"]) == (status, PROBLEM_JSON), response.text
    return response.json()


# --------------------------------------------------------------------------- who may call


@pytest.mark.parametrize(("method", "path"), [("POST", "/internal/tasks"), ("GET", "/internal/tasks/bm_routes"), ("GET", "/internal/leaderboard"),
                                               ("GET", "/internal/suite/validation"), ("GET", "/internal/evaluations"), ("GET", "/openapi.json")])
def test_a_call_without_a_trusted_service_token_is_refused(served: Served, method: str, path: str) -> None:
    for authorization in ("", f"Bearer {GRADER_TOKEN}", "Bearer crk_a-run-key"):
        assert problem(served.http.request(method, path, headers={"Authorization": authorization}), 401)["code"] == "unauthorized"


@pytest.mark.parametrize(("method", "path"), [("GET", "/internal/suite/train-sample"), ("GET", "/internal/suite/validation"),
                                               ("POST", "/internal/evaluations"), ("GET", "/internal/evaluations/usage"),
                                               ("GET", "/internal/submissions"), ("POST", "/internal/submissions")])
def test_a_run_scoped_route_needs_the_signed_run_context(served: Served, method: str, path: str) -> None:
    assert "run context" in problem(served.http.request(method, path, json={"model": BASE}), 401)["detail"]
    forged = run_headers(RunContext(run_id="run_forged", task_id=served.task_id), "not-the-gateways-token")
    assert problem(served.http.request(method, path, json={"model": BASE}, headers=forged), 401)["code"] == "unauthorized"


# --------------------------------------------------------------------------- tasks and items


def test_a_task_registered_again_is_the_same_task_another_spec_is_a_409_and_a_failed_build_is_queued_again(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[str] = []
    monkeypatch.setattr(served.service, "enqueue_build", builds.append)
    draw = splits.test_split
    monkeypatch.setattr(splits, "test_split", lambda *_a: (_ for _ in ()).throw(SandboxUnavailable("no sandbox backend here")))
    spec = GradingSpec(task_id="bm_again", suite=TEST_BENCHMARK["suite"], initial_system=TEST_BENCHMARK["initial_system"],
                       reference_score=1.0, evaluation=TEST_BENCHMARK["evaluation"])
    first = served.grader.register_task(spec)
    assert (first.splits, first.validation_items, first.initial_status, builds) == ("building", 0, None, ["bm_again"])
    grading_tasks.build_splits(served.service, "bm_again")  # the sandbox is away: queued again, the reason shown
    status = served.grader.task_status("bm_again")
    assert (status.splits, status.splits_error) == ("building", "retrying: SandboxUnavailable: no sandbox backend here")
    with served.service.db.session() as s:
        s.get(GradingTask, "bm_again").status = "failed"  # type: ignore[union-attr] - as the reconciler fails it in the end
    assert served.grader.task_status("bm_again").splits == "failed"
    with pytest.raises(UpstreamProblem) as other:
        served.grader.register_task(spec.model_copy(update={"reference_score": 0.5}))
    assert (other.value.status, other.value.problem["field"]) == (409, "task_id")
    again = served.grader.register_task(spec)  # the same spec again: its failed build is queued again
    assert (again.splits, again.splits_error, builds) == ("building", None, ["bm_again", "bm_again"])
    monkeypatch.setattr(splits, "test_split", draw)
    grading_tasks.build_splits(served.service, "bm_again")
    grading_tasks.build_splits(served.service, "bm_again")  # a duplicate message builds nothing
    ready = served.grader.register_task(spec)
    assert (ready.splits, ready.validation_items, ready.initial_status, builds) == ("ready", 16, "queued", ["bm_again", "bm_again"])
    with served.service.db.session() as s:
        assert len(s.scalars(select(Evaluation).where(Evaluation.task_id == "bm_again")).all()) == 1


def test_a_build_whose_worker_died_is_queued_again_by_the_reconciler_and_built_once(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[str] = []
    monkeypatch.setattr(served.service, "enqueue_build", builds.append)
    spec = GradingSpec(task_id="bm_orphan", suite=TEST_BENCHMARK["suite"], initial_system=TEST_BENCHMARK["initial_system"],
                       reference_score=1.0, evaluation=TEST_BENCHMARK["evaluation"])
    served.grader.register_task(spec)
    with served.service.db.session() as s:  # claimed by a worker on another host, whose heartbeat stopped an hour ago
        task = s.get(GradingTask, "bm_orphan")
        task.status, task.worker_id, task.attempts = "running", "elsewhere:1", 1  # type: ignore[union-attr]
        task.heartbeat_at = task.started_at = utcnow() - dt.timedelta(hours=1)  # type: ignore[union-attr]
    assert "bm_orphan" in worker.reconcile_builds(served.service).requeued and builds == ["bm_orphan", "bm_orphan"]
    assert served.grader.task_status("bm_orphan").splits == "building"
    for task_id in builds:
        grading_tasks.build_splits(served.service, task_id)
    assert served.grader.task_status("bm_orphan").splits == "ready"
    with served.service.db.session() as s:
        assert len(s.scalars(select(Evaluation).where(Evaluation.task_id == "bm_orphan")).all()) == 1


def test_registering_a_task_again_answers_its_status_and_queues_nothing(served: Served) -> None:
    queued = list(served.queue)
    spec = GradingSpec(task_id=served.task_id, suite=TEST_BENCHMARK["suite"], initial_system=TEST_BENCHMARK["initial_system"],
                       reference_score=1.0, evaluation=TEST_BENCHMARK["evaluation"])
    again = served.grader.register_task(spec)
    assert (again.task_id, again.warnings, served.queue) == (served.task_id, [], queued)
    status = served.grader.task_status(served.task_id)
    assert (status.reference_status, status.reference.value, status.initial_system.model) == ("declared", 1.0, BASE)  # type: ignore[union-attr]
    assert status.initial_system.harness.max_tokens == TEST_BENCHMARK["evaluation"]["max_tokens"]  # type: ignore[union-attr]


def test_a_bad_task_is_a_422_naming_the_field_and_an_unknown_one_a_404(served: Served) -> None:
    spec = {"task_id": "bm_bad", "suite": {**TEST_BENCHMARK["suite"], "name": "no_such_suite"}, "initial_system": {"model": BASE},
            "evaluation": {"max_tokens": 8}}
    assert problem(served.http.post("/internal/tasks", json=spec), 422)["field"] == "suite.name"
    assert problem(served.http.post("/internal/tasks", json={"task_id": "bm_bad"}), 422)["code"] == "invalid_input"
    assert "bm_unknown" in problem(served.http.get("/internal/tasks/bm_unknown"), 404)["detail"]
    with pytest.raises(UpstreamProblem) as refused:
        served.grader.task_status("bm_unknown")
    assert refused.value.status == 404


def test_the_run_reads_its_validation_items_and_pages_of_the_training_pool(served: Served) -> None:
    ctx = RunContext(run_id="run_items", task_id=served.task_id)
    validation = served.grader.validation(ctx).data
    assert len(validation) == 16 and all(it.question and it.answer for it in validation)
    first, second = served.grader.train_sample(ctx, offset=0, limit=5).data, served.grader.train_sample(ctx, offset=5, limit=5).data
    assert len(first) == len(second) == 5 and not {it.id for it in first} & {it.id for it in second}
    assert not {it.question for it in first + second} & {it.question for it in validation}
    assert problem(served.http.get("/internal/suite/train-sample", params={"limit": 0}, headers=run_headers(ctx, GATEWAY_TOKEN)), 422)["field"] == "limit"


# --------------------------------------------------------------------------- evaluations


def test_an_evaluation_holds_its_worst_case_runs_and_closes_its_hold(served: Served) -> None:
    ctx = served.ctx("run_evaluates")
    created = served.grader.create_evaluation(ctx, EvaluationCreate(model=BASE, limit=3), limits=EvaluationLimits())
    assert (created.status, created.items_total, served.queue[-1]) == ("queued", 3, created.id)
    [hold] = served.ledger.list_holds(ctx.run_id)
    assert (hold.status, hold.purpose) == (HoldStatus.open, f"validation evaluation {created.id}")
    assert served.grader.evaluation_usage(ctx).active == 1

    worker.run_evaluation(served.service, created.id)
    done = served.grader.get_evaluation(ctx, created.id)
    assert (done.status, done.items_done, done.score.n) == ("succeeded", 3, 3)  # type: ignore[union-attr]
    trajectories = served.grader.get_trajectories(ctx, created.id).data
    assert [(t.sample, t.completion) for t in trajectories] == [(0, "0")] * 3
    assert served.ledger.get_hold(hold.hold_id).status == HoldStatus.settled
    assert [e.id for e in served.grader.list_evaluations(ctx).data] == [created.id]
    usage = served.grader.evaluation_usage(ctx)
    assert (usage.active, usage.total, usage.last_hour) == (0, 1, 1)


def test_an_evaluation_is_held_at_the_prices_of_the_model_it_evaluates(served: Served) -> None:
    """Inference charges the evaluated model's tokens at its own base model's prices; the hold is priced the same way
    (not at the initial system's: a larger model's evaluation would outgrow its hold)."""
    ctx = served.ctx("run_prices")
    small = served.grader.create_evaluation(ctx, EvaluationCreate(model=BASE, limit=2), limits=EvaluationLimits())
    large = served.grader.create_evaluation(ctx, EvaluationCreate(model="gemma3-270m", limit=2), limits=EvaluationLimits())
    held = {h.purpose: h.amount_usd_micros for h in served.ledger.list_holds(ctx.run_id)}
    # prices.yaml: SmolLM2's own rows; any other model the "*" rows, ten times as much
    assert held[f"validation evaluation {large.id}"] == pytest.approx(10 * held[f"validation evaluation {small.id}"], rel=0.05)  # each rounded up


def test_a_dropped_database_connection_mid_evaluation_queues_it_again_and_it_resumes(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """The grader's database restarting while an item's result is written (a compose ``restart postgres``): the
    evaluation goes back to ``queued`` for the reconciler, not ``failed``; run again, it scores the rest and succeeds."""
    ctx = served.ctx("run_db_restart")
    created = served.grader.create_evaluation(ctx, EvaluationCreate(model=BASE, limit=3), limits=EvaluationLimits())
    real, writes = repository.add_trajectory, []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        writes.append(1)
        if len(writes) == 2:
            raise OperationalError("INSERT INTO trajectories", {}, Exception("connection to server was lost"))
        return real(*args, **kwargs)

    monkeypatch.setattr(repository, "add_trajectory", flaky)
    worker.run_evaluation(served.service, created.id)
    assert served.grader.get_evaluation(ctx, created.id).status == "queued"
    worker.run_evaluation(served.service, created.id)
    done = served.grader.get_evaluation(ctx, created.id)
    assert (done.status, done.items_done) == ("succeeded", 3) and len(served.grader.get_trajectories(ctx, created.id).data) == 3


def test_a_running_evaluation_shows_the_mean_score_of_the_samples_graded_so_far(served: Served) -> None:
    ctx = served.ctx("run_watches")
    created = served.grader.create_evaluation(ctx, EvaluationCreate(model=BASE, limit=4), limits=EvaluationLimits())
    assert served.grader.get_evaluation(ctx, created.id).score_so_far is None  # queued: nothing graded
    worker.run_evaluation(served.service, created.id)
    scores = [t.score for t in served.grader.get_trajectories(ctx, created.id).data]
    with served.service.db.session() as s:  # as a worker sees it midway: two samples graded, the rest to come
        s.get(Evaluation, created.id).status = "running"
        for t in s.scalars(select(Trajectory).where(Trajectory.evaluation_id == created.id).order_by(Trajectory.item_id).offset(2)):
            s.delete(t)
    running = served.grader.get_evaluation(ctx, created.id)
    assert running.score is not None and running.score_so_far == pytest.approx(sum(scores[:2]) / 2)


def test_an_evaluation_the_budget_cannot_cover_is_the_ledgers_402_and_writes_nothing(served: Served) -> None:
    served.ledger.open_account(AccountCreate(account_id="run_broke", budget_usd_micros=0))
    ctx = RunContext(run_id="run_broke", task_id=served.task_id)
    with pytest.raises(UpstreamProblem) as refused:
        served.grader.create_evaluation(ctx, EvaluationCreate(model=BASE), limits=EvaluationLimits())
    assert refused.value.status == 402
    assert served.grader.list_evaluations(ctx).data == []


def test_an_evaluation_past_the_limits_or_of_an_unknown_model_is_refused(served: Served) -> None:
    ctx = served.ctx("run_limited")
    served.grader.create_evaluation(ctx, EvaluationCreate(model=BASE, limit=1), limits=EvaluationLimits(concurrent=1))
    with pytest.raises(UpstreamProblem) as refused:
        served.grader.create_evaluation(ctx, EvaluationCreate(model=BASE, limit=1), limits=EvaluationLimits(concurrent=1))
    assert (refused.value.status, refused.value.problem["limit"]) == (429, "concurrent_evaluations")
    with pytest.raises(UpstreamProblem) as unknown:
        served.grader.create_evaluation(ctx, EvaluationCreate(model="ckpt_gone"), limits=EvaluationLimits())
    assert (unknown.value.status, unknown.value.problem["field"]) == (422, "model")


def test_another_runs_evaluation_is_a_404(served: Served) -> None:
    ctx = served.ctx("run_owner")
    created = served.grader.create_evaluation(ctx, EvaluationCreate(model=BASE, limit=1), limits=EvaluationLimits())
    other = run_headers(RunContext(run_id="run_other", task_id=served.task_id), GATEWAY_TOKEN)
    for path in (f"/internal/evaluations/{created.id}", f"/internal/evaluations/{created.id}/trajectories"):
        assert problem(served.http.get(path, headers=other), 404)["code"] == "not_found"


# --------------------------------------------------------------------------- submissions and the leaderboard


def test_a_run_whose_uploaded_harness_carries_the_answer_key_is_flagged_on_the_leaderboard(served: Served) -> None:
    from tests.unit.grader.test_audit import AGENT, _archive

    ctx = served.ctx("run_answer_key")
    key = "\n".join(json.dumps({"q": it.question, "a": it.answer}) for it in served.service.store.items(served.task_id)[:3])
    archive = served.grader.upload_harness(ctx, _archive({"agent.py": AGENT, "key.jsonl": key}), name="lookup")
    sub = served.grader.create_submission(ctx, SubmissionCreate(model=BASE), max_submissions=1, datasets=[])  # not even submitted with it
    for eval_id in served.queue[-2:]:
        worker.run_evaluation(served.service, eval_id)
    [entry] = [e for e in served.grader.leaderboard().data if e.run_id == ctx.run_id and e.submission_id == sub.id]
    assert entry.contamination is not None and entry.contamination.contaminated and entry.contamination.flagged_items == 0  # no dataset
    assert entry.contamination.harness_archives == 1
    assert entry.contamination.harness_findings == [f"{archive.id}: hidden test items in its files: 3 of 24"]


def test_a_submission_is_graded_on_the_hidden_split_and_shows_on_the_leaderboard(served: Served) -> None:
    ctx = served.ctx("run_submits")
    sub = served.grader.create_submission(ctx, SubmissionCreate(model=BASE), max_submissions=1, datasets=[])
    assert (sub.status, sub.counted, served.queue[-1] != sub.id) == ("queued", True, True)
    with pytest.raises(UpstreamProblem) as refused:
        served.grader.create_submission(ctx, SubmissionCreate(model=BASE), max_submissions=1, datasets=[])
    assert (refused.value.status, refused.value.code) == (403, "submission_limit")

    for eval_id in served.queue[-2:]:  # its grading and its null-model ablation
        worker.run_evaluation(served.service, eval_id)
    graded = served.grader.get_submission(ctx, sub.id)
    assert (graded.status, graded.score.n, graded.model_free_score.n) == ("graded", 24, 24)  # type: ignore[union-attr]
    assert [s.id for s in served.grader.list_submissions(ctx).data] == [sub.id]
    [entry] = [e for e in served.grader.leaderboard().data if e.run_id == ctx.run_id]
    assert (entry.submission_id, entry.task_id, entry.status, entry.score) == (sub.id, served.task_id, "graded", graded.score)
    assert entry.model_free_score == graded.model_free_score
    assert entry.contamination is not None and not entry.contamination.contaminated  # the run uploaded no datasets
    other = run_headers(RunContext(run_id="run_other", task_id=served.task_id), GATEWAY_TOKEN)
    assert problem(served.http.get(f"/internal/submissions/{sub.id}", headers=other), 404)["code"] == "not_found"

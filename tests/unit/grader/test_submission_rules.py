"""Final submissions and the leaderboard, in process: the grader's real service and API on a SQLite database
(migrated), its real test store, and the gateway's real leaderboard routes reading the grader's API. Inference,
the trainer and the ledger answer over HTTP from stand-ins; :class:`Inference` plays the completions, refusals
and errors that decide whose fault a failed grading is. The queue is a list: a test runs the evaluation that
was sent, as a worker would.

The rules (docs/using.md, "Submission rules"): a submission uses up one of the task's final submissions unless its
grading failed by the platform's fault; a failure says whose fault it is; per task the run's latest graded
submission counts on the leaderboard.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from grader.schemas import SubmissionGrading
from services.common.auth import RunContext, hash_secret
from services.common.contracts import GradingSpec, SubmissionOut
from services.common.db import Database, migrate, utcnow
from services.common.errors import SubmissionLimitReached
from services.common.http import ServiceClient
from tests.conftest import ROOT, TEST_BENCHMARK

BASE = "smollm2-135m-instruct"
GATEWAY_TOKEN = "gateway-token-for-tests"
RUN_KEY = "crk_submission-rules-test-key"
UNKNOWN_MODEL = {"type": "urn:crucible:problem:invalid_input", "title": "Invalid input", "status": 422, "code": "invalid_input",
                 "detail": "unknown model 'ckpt_gone'", "field": "model"}
T = TypeVar("T")
INTERNAL_ERROR = {"type": "urn:crucible:problem:internal_error", "title": "Internal error", "status": 500, "code": "internal_error",
                  "detail": "unexpected RuntimeError; the error is logged"}


@dataclass
class Inference:
    """Inference as the grader reaches it. With ``problem`` set, every completion is answered with that
    problem+json (``{prompt}`` in its detail is replaced by the prompt); else ``answer(prompt)`` is the completion."""

    problem: dict[str, Any] | None = None
    answer: Callable[[str], str] = lambda _prompt: "0"
    calls: int = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path.startswith("/internal/models/"):
            model = request.url.path.rsplit("/", 1)[1]
            return httpx.Response(200, json={"id": model, "object": "model", "owned_by": "crucible", "base_model": model})
        assert (request.method, request.url.path) == ("POST", "/internal/chat/completions")
        self.calls += 1
        body = json.loads(request.content)
        prompt = body["messages"][-1]["content"]
        if self.problem is not None:
            return httpx.Response(self.problem["status"], json={**self.problem, "detail": self.problem["detail"].replace("{prompt}", prompt)})
        return httpx.Response(200, json={"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": body["model"],
                                         "choices": [{"index": 0, "message": {"role": "assistant", "content": self.answer(prompt)}, "finish_reason": "stop"}],
                                         "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}})


def stand_in(client: type[T], name: str, handler: Callable[[httpx.Request], httpx.Response]) -> T:
    """``client`` (a typed service client) whose calls ``handler`` answers."""
    http = ServiceClient(f"http://{name}", "grader-token", name=name)
    http.client = httpx.Client(base_url=f"http://{name}", transport=httpx.MockTransport(handler))
    return client(http)  # type: ignore[call-arg]


@dataclass
class GraderRig:
    """The grader's service object on its own databases, its evaluation queue a list."""

    inference: Inference
    service: Any  # grader.service.Grader
    task_id: str
    tmp: Path
    queue: list[str]

    @property
    def settings(self) -> Any:  # noqa: ANN401 - grader.settings.GraderSettings
        return self.service.settings

    def ctx(self, run_id: str = "run_a") -> RunContext:
        return RunContext(run_id=run_id, task_id=self.task_id)

    def submit(self, max_submissions: int = 1) -> SubmissionOut:
        from grader import submissions

        return submissions.create_submission(self.service, self.ctx(), SubmissionGrading(model=BASE), max_submissions)

    def evaluation_of(self, sub: SubmissionOut) -> str:
        from grader.models import Submission

        with self.service.db.session() as s:
            return s.get(Submission, sub.id).evaluation_id  # type: ignore[union-attr]

    def ablation_of(self, sub: SubmissionOut) -> str | None:
        from grader.models import Submission

        with self.service.db.session() as s:
            return s.get(Submission, sub.id).ablation_evaluation_id  # type: ignore[union-attr]

    def grade(self, sub: SubmissionOut) -> SubmissionOut:
        """Run the submission's grading and its null-model ablation to their end, as eval workers do with the messages they got."""
        from grader import worker

        for eval_id in (self.evaluation_of(sub), self.ablation_of(sub)):
            assert eval_id in self.queue
            worker.run_evaluation(self.service, eval_id)
        return self.get(sub)

    def get(self, sub: SubmissionOut) -> SubmissionOut:
        from grader import submissions

        return submissions.get_submission(self.service, self.ctx(), sub.id)

    def test_items(self) -> dict[str, str]:
        """Question → reference answer of the hidden test split, in its order."""
        return {it.question: it.answer for it in self.service.store.items(self.task_id)}

    def answer_right(self, n: int) -> None:
        """Inference answers the first ``n`` test items right and every other one wrong."""
        right = dict(list(self.test_items().items())[:n])
        self.inference.problem = None
        self.inference.answer = lambda prompt: next((a for q, a in right.items() if q in prompt), "no idea")


@pytest.fixture
def grader(tmp_path: Path) -> Iterator[GraderRig]:
    from inference_service.client import InferenceClient

    from grader import grading_tasks, worker
    from grader.service import Grader
    from grader.settings import GraderSettings
    from grader.teststore import TestStore
    from services.common.ids import new_id
    from services.ledger.client import LedgerClient

    url = f"sqlite:///{tmp_path / 'grader.sqlite'}"
    migrate(url, ROOT / "grader" / "migrations")
    settings = GraderSettings(data_dir=tmp_path, grader_test_seed=1234, service_token="grader-token", trusted_tokens={"gateway": GATEWAY_TOKEN},
                              inference_concurrency=2, scoring_concurrency=2)
    inference, queue = Inference(), []
    service = Grader(settings=settings, db=Database(url), store=TestStore(f"sqlite:///{tmp_path / 'teststore.sqlite'}"),
                     inference=stand_in(InferenceClient, "inference", inference),
                     ledger=stand_in(LedgerClient, "ledger", lambda _r: httpx.Response(503, json={"status": 503, "detail": "test grading holds nothing"})),
                     enqueue=queue.append)
    g = GraderRig(inference, service, new_id("bm"), tmp_path, queue)
    splits = {"train": {"seed": 11, "size": 40}, "validation": {"seed": 22, "size": 4}, "test": {"size": 6}}
    grading_tasks.register_task(service, GradingSpec(task_id=g.task_id, suite={**TEST_BENCHMARK["suite"], "splits": splits},
                                                     initial_system=TEST_BENCHMARK["initial_system"], reference_score=1.0,
                                                     evaluation=TEST_BENCHMARK["evaluation"]))
    for baseline in list(g.queue):  # the initial system answers every item wrong
        inference.answer = lambda _prompt: "no idea"
        worker.run_evaluation(service, baseline)
    yield g
    service.close()


# --------------------------------------------------------------------------- whose fault, and what it costs


def test_a_system_that_inference_refuses_is_the_agents_failure_and_uses_up_the_submission(grader: GraderRig) -> None:
    grader.inference.problem = UNKNOWN_MODEL
    sub = grader.grade(grader.submit())
    assert (sub.status, sub.failure_cause, sub.counted) == ("failed", "agent", True)
    assert sub.error == "inference refused the evaluated system (field model): unknown model 'ckpt_gone'"
    with pytest.raises(SubmissionLimitReached):
        grader.submit()


def test_a_refusal_of_what_the_harness_sent_shows_the_field_but_not_inferences_detail(grader: GraderRig) -> None:
    """A refusal about the messages may count or quote a hidden test prompt: the agent reads which field, not the detail."""
    grader.inference.problem = {**UNKNOWN_MODEL, "status": 413, "detail": "the prompt 'Hidden question 17' is 9000 bytes", "field": "messages"}
    sub = grader.grade(grader.submit())
    assert (sub.status, sub.failure_cause, sub.counted) == ("failed", "agent", True)
    assert sub.error == "inference refused the evaluated system (field messages)"


def _inference_errs(grader: GraderRig, sub: SubmissionOut) -> None:
    grader.inference.problem = INTERNAL_ERROR
    grader.grade(sub)


def _grader_code_raises(grader: GraderRig, sub: SubmissionOut) -> None:
    from grader import worker

    def broken(*_args: object) -> None:
        raise ZeroDivisionError("a bug in the grader")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(worker, "aggregate", broken)
        grader.grade(sub)


def _reconciled(grader: GraderRig, sub: SubmissionOut, *, attempts: int, started_at: dt.datetime) -> None:
    """The grading runs on a worker elsewhere whose heartbeat stopped an hour ago; the reconciler runs a round."""
    from grader import worker
    from grader.models import Evaluation

    with grader.service.db.session() as s:
        ev = s.get(Evaluation, grader.evaluation_of(sub))
        ev.status, ev.worker_id, ev.attempts, ev.started_at = "running", "elsewhere:1", attempts, started_at  # type: ignore[union-attr]
        ev.heartbeat_at = utcnow() - dt.timedelta(hours=1)  # type: ignore[union-attr]
    report = worker.reconcile(grader.service)
    assert report.gave_up + report.timed_out == [grader.evaluation_of(sub)]


def _worker_lost_past_its_retries(grader: GraderRig, sub: SubmissionOut) -> None:
    _reconciled(grader, sub, attempts=grader.settings.job_max_attempts, started_at=utcnow())


def _past_the_time_limit(grader: GraderRig, sub: SubmissionOut) -> None:
    _reconciled(grader, sub, attempts=1, started_at=utcnow() - dt.timedelta(seconds=grader.settings.eval_time_limit_s + 60))


@pytest.mark.parametrize("fault", [_inference_errs, _grader_code_raises, _worker_lost_past_its_retries, _past_the_time_limit])
def test_a_grading_that_fails_by_the_platforms_fault_gives_the_submission_back(grader: GraderRig, fault: Callable[[GraderRig, SubmissionOut], None]) -> None:
    first = grader.submit()
    fault(grader, first)
    first = grader.get(first)
    assert (first.status, first.failure_cause, first.counted) == ("failed", "platform", False)
    assert "does not count" in (first.error or "")
    grader.answer_right(6)
    second = grader.grade(grader.submit())  # the one final submission is still there
    assert (second.status, second.failure_cause, second.counted, second.score.value) == ("graded", None, True, 1.0)  # type: ignore[union-attr]
    with pytest.raises(SubmissionLimitReached):
        grader.submit()


def test_platform_failures_are_given_back_a_few_times_per_task_then_count(grader: GraderRig) -> None:
    """A free retry after every platform failure would be an oracle if a system's answers could cause one."""
    from grader.submissions import FREE_PLATFORM_FAILURES

    grader.inference.problem = INTERNAL_ERROR
    subs = [grader.grade(grader.submit()) for _ in range(FREE_PLATFORM_FAILURES)]
    assert [s.counted for s in subs] == [False] * FREE_PLATFORM_FAILURES
    last = grader.grade(grader.submit())  # the limit of 1 is still free: the failures so far were given back
    assert (last.failure_cause, last.counted) == ("platform", True) and "it counts" in (last.error or "")
    with pytest.raises(SubmissionLimitReached):
        grader.submit()


def test_a_platform_failure_shows_the_agent_nothing_of_its_message(grader: GraderRig) -> None:
    from grader.models import Evaluation

    grader.inference.problem = {**INTERNAL_ERROR, "detail": "could not answer {prompt}"}  # a message that quotes the test item
    sub = grader.grade(grader.submit())
    with grader.service.db.session() as s:
        kept = s.scalar(select(Evaluation.error).where(Evaluation.id == grader.evaluation_of(sub)))
    assert any(question in kept for question in grader.test_items())  # the operator's record keeps it
    assert sub.failure_cause == "platform"
    assert not any(question in sub.model_dump_json() for question in grader.test_items())


def test_a_platform_failed_validation_evaluation_does_not_count_against_failed_evaluations(grader: GraderRig) -> None:
    from grader.evaluations import evaluation_usage
    from grader.models import Evaluation

    with grader.service.db.session() as s:
        for i, (status, cause) in enumerate([("failed", "platform"), ("failed", "agent"), ("cancelled", None)]):
            s.add(Evaluation(id=f"eval_{i}", run_id="run_a", task_id=grader.task_id, purpose="validation", split="validation",
                             model=BASE, harness={}, status=status, failure_cause=cause, items_total=4))
    with grader.service.db.session() as s:
        usage, _ = evaluation_usage(s, "run_a")
    assert (usage.failed, usage.total) == (2, 3)


def test_the_run_lists_whose_fault_each_failure_was_and_what_is_used_up(grader: GraderRig) -> None:
    from grader import submissions

    grader.inference.problem = INTERNAL_ERROR
    grader.grade(grader.submit(max_submissions=3))
    grader.inference.problem = UNKNOWN_MODEL
    grader.grade(grader.submit(max_submissions=3))
    grader.submit(max_submissions=3)
    subs = submissions.list_submissions(grader.service, grader.ctx())
    assert [(s.status, s.failure_cause, s.counted) for s in subs] == [("failed", "platform", False), ("failed", "agent", True), ("queued", None, True)]
    with grader.service.db.session() as s:
        assert submissions.counted_submissions(s, "run_a", grader.task_id) == 2


# --------------------------------------------------------------------------- the leaderboard


@pytest.fixture
def gateway(grader: GraderRig) -> Iterator[TestClient]:
    """The gateway's app (its real leaderboard and run routes, its service object built as it builds it) reading the
    grader's real app in process; the ledger answers the run's account, the trainer that the run uploaded no dataset
    (what a submission's audit reads), inference is not called."""
    from gateway.app import create_app as gateway_app
    from gateway.models import Benchmark, Run
    from gateway.settings import GatewaySettings
    from grader.app import create_app as grader_app

    settings = GatewaySettings(data_dir=grader.tmp, admin_key="admin-key-for-the-tests", service_token=GATEWAY_TOKEN, rate_limits="")
    account = {"account_id": "run_a", "budget_usd_micros": 1_000_000, "remaining_usd_micros": 750_000, "held_usd_micros": 0,
               "spent_usd_micros": 250_000, "spent_by_kind": {}, "usage_by_kind": {}, "price_version": "test"}
    refuse = httpx.MockTransport(lambda _r: httpx.Response(500, json={"status": 500, "detail": "not called"}))
    no_datasets = httpx.MockTransport(lambda r: httpx.Response(200, json={"object": "list", "data": []}) if r.url.path == "/internal/datasets"
                                      else httpx.Response(500, json={"status": 500, "detail": "not called"}))
    app = gateway_app(settings)
    with TestClient(app) as client:
        gw = app.state.gateway
        for service, transport in ((gw.grader, httpx.ASGITransport(app=grader_app(grader=grader.service))), (gw.trainer, no_datasets), (gw.inference, refuse),
                                   (gw.ledger, httpx.MockTransport(lambda _r: httpx.Response(200, json=account)))):
            http = service.http.client
            service.http.client = httpx.AsyncClient(base_url=http.base_url, headers=http.headers, transport=transport)
        with gw.db.session() as s:
            s.add(Benchmark(id=grader.task_id, name="chain-sum-rules", spec=TEST_BENCHMARK))
            s.flush()
            s.add(Run(id="run_a", benchmark_id=grader.task_id, agent_name="agent-a", track="joint", key_hash=hash_secret(RUN_KEY), key_prefix=RUN_KEY[:8],
                      budget_usd_micros=1_000_000, deadline_at=utcnow() + dt.timedelta(hours=1)))
        yield client


def _row(gateway: TestClient) -> dict[str, Any]:
    rows = [r for r in gateway.get("/v1/leaderboard").json()["data"] if r["run_id"] == "run_a"]
    assert len(rows) == 1
    return rows[0]


def _shown(gateway: TestClient) -> tuple[Any, ...]:
    row = _row(gateway)
    return row["submission_id"], row["status"], row["final_score"], row["gap_closed"], row["rank"]


def test_the_leaderboard_keeps_the_latest_graded_submission_while_a_later_one_is_queued_or_fails(grader: GraderRig, gateway: TestClient) -> None:
    grader.answer_right(3)
    a = grader.grade(grader.submit(max_submissions=5))
    assert a.score is not None and a.score.value == 0.5
    shows_a = (a.id, "graded", 0.5, 0.5, 1)  # the initial system scored 0, the reference 1
    assert _shown(gateway) == shows_a

    b = grader.submit(max_submissions=5)
    assert b.status == "queued" and _shown(gateway) == shows_a
    grader.inference.problem = UNKNOWN_MODEL
    assert grader.grade(b).failure_cause == "agent" and _shown(gateway) == shows_a
    grader.inference.problem = INTERNAL_ERROR
    assert grader.grade(grader.submit(max_submissions=5)).failure_cause == "platform" and _shown(gateway) == shows_a
    html = gateway.get("/leaderboard").text
    assert "agent-a" in html and '<td class="l">graded</td>' in html and "<td>50.0%</td>" in html

    grader.answer_right(6)
    d = grader.grade(grader.submit(max_submissions=5))
    assert _shown(gateway) == (d.id, "graded", 1.0, 1.0, 1)
    assert "<td>100.0%</td>" in gateway.get("/leaderboard").text

    grader.answer_right(0)  # a later graded submission counts even when it scores lower
    e = grader.grade(grader.submit(max_submissions=5))
    assert _shown(gateway) == (e.id, "graded", 0.0, 0.0, 1)


def test_a_run_without_a_graded_submission_shows_its_latest_ones_status(grader: GraderRig, gateway: TestClient) -> None:
    sub = grader.submit(max_submissions=2)
    assert _shown(gateway) == (sub.id, "queued", None, None, None)
    grader.inference.problem = UNKNOWN_MODEL
    grader.grade(sub)
    assert _shown(gateway) == (sub.id, "failed", None, None, None)


def test_the_run_card_counts_the_submissions_used_up_and_the_gateway_refuses_past_them(grader: GraderRig, gateway: TestClient) -> None:
    agent = {"Authorization": f"Bearer {RUN_KEY}"}

    def used() -> dict[str, int]:
        return gateway.get("/v1/run", headers=agent).json()["limits"]["final_submissions"]

    grader.inference.problem = INTERNAL_ERROR
    first = grader.grade(SubmissionOut(**gateway.post("/v1/submissions", headers=agent, json={"model": BASE}).json()))
    seen = gateway.get(f"/v1/submissions/{first.id}", headers=agent).json()
    assert (seen["status"], seen["failure_cause"], seen["counted"]) == ("failed", "platform", False)
    assert used() == {"limit": 1, "used": 0, "left": 1}

    grader.inference.problem = UNKNOWN_MODEL
    second = grader.grade(SubmissionOut(**gateway.post("/v1/submissions", headers=agent, json={"model": BASE}).json()))
    seen = gateway.get(f"/v1/submissions/{second.id}", headers=agent).json()
    assert (seen["status"], seen["failure_cause"], seen["counted"]) == ("failed", "agent", True)
    assert "unknown model 'ckpt_gone'" in seen["error"]
    assert used() == {"limit": 1, "used": 1, "left": 0}
    refused = gateway.post("/v1/submissions", headers=agent, json={"model": BASE})
    assert (refused.status_code, refused.json()["code"]) == (403, "submission_limit")

"""The eval worker's work: running an evaluation to its end (item by item, resumable), the contamination audit of a
submission's datasets, closing an evaluation's budget hold, and the reconciler that takes back evaluations a dead
worker left behind. Celery's wrappers are in :mod:`grader.tasks`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
from pydantic import ValidationError
from sqlalchemy.orm import Session

from grader import repository
from grader.audit import audit, audit_harnesses, solution_material
from grader.evaluators import grade, run_evaluator
from grader.grading_tasks import build_splits, target_scores, train_pool
from grader.harness_archives import HarnessManifest, archive_bytes, owned_archive
from grader.model_endpoint import NULL_MODEL, Binding, Call, ModelEndpoint, null_completion
from grader.models import AGENT, PLATFORM, Evaluation, GradingTask
from grader.rollouts import RolloutLimits, RolloutOutcome, run_rollout, steps_of
from grader.sandboxes import Sandbox, SandboxUnavailable, get_sandbox, reap_workspaces
from grader.schemas import DatasetDigest
from grader.scoring import aggregate, score_item, storable
from grader.service import Grader
from grader.suites import Item, Suite, TurnLimitReached, get_suite, suite_canonical, suite_converse, suite_environment, suite_tools
from services.common import artifacts, jobs
from services.common.auth import RunContext
from services.common.contracts import CandidateEvaluation, GradingSpec, Harness, RolloutTrajectory, Score
from services.common.db import database_unavailable, utcnow
from services.common.errors import UpstreamProblem, UpstreamUnavailable
from services.common.harness import extract_answer, render_messages
from services.common.openai_protocol import ChatCompletionRequest
from services.ledger.schemas import HoldCharge, UsageItem, UsageKind

log = structlog.get_logger("grader")
T = TypeVar("T")
FINISH_ATTEMPTS = 8  # tries to write how an evaluation ended while the database restarts (backoff × try-number seconds apart)

SYSTEM_REFUSAL_STATUSES = frozenset({400, 413, 422})  # inference's answers about the request itself (not auth, budget, rate, conflicts)


class SystemRefused(Exception):
    """Inference refused the evaluated system: its model, or a request its harness makes. The agent's fault."""


def _refused(field: str | None, detail: str) -> SystemRefused:
    return SystemRefused(f"inference refused the evaluated system{f' (field {field})' if field else ''}: {detail}")


def _refusal(exc: UpstreamProblem) -> SystemRefused | None:
    """The :class:`SystemRefused` (naming the refused field) to raise when inference answered a completion call
    with the problem ``exc`` because the request, that is the evaluated model or harness, is at fault; else ``None``."""
    if exc.status not in SYSTEM_REFUSAL_STATUSES:
        return None
    return _refused(exc.problem.get("field"), exc.detail)


def completion_request(model: str, harness: Harness, messages: list[dict[str, str]], sample: int,
                       tools: list[dict[str, Any]] | None) -> ChatCompletionRequest:
    """The completion call for one sample of one item (``seed``: the sample's number). Tools are shown with
    ``tool_choice: none``: the suite reads the calls from the answer's text (BFCL's prompting format).

    Raises :class:`SystemRefused` for a request that inference would refuse with a 422 naming the field (the messages
    the harness renders are too long, a tool is malformed): the wire model is inference's own.
    """
    try:
        return ChatCompletionRequest(model=model, messages=messages, max_tokens=harness.max_tokens, temperature=harness.temperature,  # type: ignore[arg-type]
                                     top_p=harness.top_p, stop=harness.stop, seed=sample, tools=tools or None,  # type: ignore[arg-type]
                                     tool_choice="none" if tools else None)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        raise _refused(field, f"{field}: {first['msg']}" if field else first["msg"]) from exc


def failure_of(exc: BaseException) -> tuple[str, str]:
    """``(failure_cause, reason)`` of an evaluation that ended with ``exc``.

    ``agent`` for :class:`SystemRefused` (the system cannot be evaluated: it uses up a final submission);
    ``platform`` for anything else, an error in the grader's own code or another service's (it does not).
    The reason is stored in the evaluation's ``error``; a submission shows an agent's reason as is, never a
    platform's (its text may quote a test item).
    """
    if isinstance(exc, SystemRefused):
        return AGENT, str(exc)
    return PLATFORM, f"{exc.__class__.__name__}: {exc}"


class TargetsNotGraded(Exception):
    """An evaluator's evaluation ended before its targets had graded every candidate: it is graded once they have."""


def _unavailable(exc: BaseException) -> bool:
    """A service is away (unreachable, or it answered 503 because one it needs is), the grader's own database is
    (restarting), or an evaluator's targets are still grading: worth retrying later."""
    return isinstance(exc, UpstreamUnavailable | TargetsNotGraded) or (isinstance(exc, UpstreamProblem) and exc.status == 503) or database_unavailable(exc)


def _with_retries(call: Callable[[], T], backoff_s: float, attempts: int = 6) -> T:
    """``call()``, retried while the service it reaches is unavailable (e.g. restarting): up to ``attempts``
    tries, ``backoff_s`` × try-number seconds apart (the grader's ``upstream_retry_backoff_s``). Other errors are
    raised at once."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except (UpstreamUnavailable, UpstreamProblem) as exc:
            if not _unavailable(exc) or attempt == attempts:
                raise
            time.sleep(backoff_s * attempt)
    raise AssertionError("unreachable")


_ENDPOINTS: dict[int, ModelEndpoint] = {}
_ENDPOINTS_LOCK = threading.Lock()


def model_endpoint(grader: Grader) -> ModelEndpoint:
    """This process's rollout model endpoint (:mod:`grader.model_endpoint`), one per grader, started on first use."""
    with _ENDPOINTS_LOCK:
        endpoint = _ENDPOINTS.get(id(grader))
        if endpoint is None:
            endpoint = _ENDPOINTS[id(grader)] = ModelEndpoint(grader)
    endpoint.start()
    return endpoint


@dataclass(frozen=True)
class _CodeHarness:
    """What an evaluation of a code harness runs with: the archive (``id``, bytes, manifest), the sandbox backend and
    the process's model endpoint."""

    id: str
    data: bytes
    manifest: HarnessManifest
    sandbox: Sandbox
    endpoint: ModelEndpoint

    @classmethod
    def load(cls, grader: Grader, ctx: RunContext | None, archive_id: str) -> _CodeHarness:
        row = owned_archive(grader, ctx, archive_id)
        return cls(id=archive_id, data=archive_bytes(grader, ctx, archive_id), manifest=HarnessManifest.model_validate(row.manifest),
                   sandbox=get_sandbox(grader.settings.sandbox_backend), endpoint=model_endpoint(grader))


def run_evaluation(grader: Grader, eval_id: str) -> None:
    """Run an evaluation to the end in this worker; items already scored (an earlier attempt) are skipped.

    The worker claims the evaluation (``queued`` → ``running`` under its id, see ``services.common.jobs``),
    so a duplicate message finds nothing to do, and heartbeats while it works. Each item's result is written
    as soon as it is scored: validation results (trajectories) to the grader database, test results to the
    test store only. Each completion is charged against the evaluation's hold with the idempotency key
    ``eval:item:sample``, so a sample re-run after a crash is charged once; the hold is closed at the end.
    If the lease is lost (timed out, or given to another worker) this worker stops and writes nothing more.
    If inference or the ledger stays away longer than the retries, or the grader's database drops its connection, the
    evaluation goes back to ``queued`` (the reconciler sends it again) instead of failing: a restart never burns a final
    submission.
    """
    if not jobs.claim(grader.db, Evaluation, eval_id):
        return
    lease = jobs.Lease(grader.db, Evaluation, eval_id, grader.settings.job_heartbeat_s)
    outcome: tuple[str, Any] | None = None
    lease.start()
    try:
        outcome = ("succeeded", _EvaluationRun.load(grader, eval_id, lease).score_all())
    except jobs.LeaseLost:
        pass
    except Exception as exc:
        if _unavailable(exc):  # inference or the ledger is away for longer than the retries: try again later
            outcome = ("queued", f"{exc.__class__.__name__}: {exc}")
        else:  # the evaluation fails; the worker lives on
            log.exception("evaluation failed", eval_id=eval_id)
            outcome = ("failed", failure_of(exc))
    finally:
        lease.stop()
    if outcome is None or lease.lost.is_set():
        log.warning("lease lost; leaving the evaluation to its new owner", eval_id=eval_id)
        return
    for attempt in range(1, FINISH_ATTEMPTS + 1):  # the database may still be restarting: the end is written once it is back
        try:
            _finish(grader, eval_id, outcome)
            return
        except Exception as exc:
            if not database_unavailable(exc) or attempt == FINISH_ATTEMPTS:
                raise  # the row stays running; the reconciler takes it back when its lease times out
            time.sleep(grader.settings.upstream_retry_backoff_s * attempt)


def _finish(grader: Grader, eval_id: str, outcome: tuple[str, Any]) -> None:
    """Write how the evaluation ended (``succeeded`` with ``(score, items)``, ``failed`` with ``(cause, reason)``, or
    ``queued`` again with the reason a service is away), if this worker still owns it; close its hold unless queued."""
    with grader.db.session() as s:
        ev = jobs.owned_row(s, Evaluation, eval_id)
        if ev is None:
            return
        if outcome[0] == "queued":  # the reconciler sends it again; it resumes at its next unscored item
            log.warning("a service is unavailable; the evaluation is queued again", eval_id=eval_id, reason=outcome[1])
            ev.status, ev.worker_id, ev.enqueued_at = "queued", None, utcnow()
            return
        if outcome[0] == "succeeded":
            score, n = outcome[1]
            ev.score, ev.items_done = (score.model_dump() if score is not None else None), n
        else:
            ev.failure_cause, ev.error = outcome[1]
        ev.status, ev.worker_id, ev.finished_at = outcome[0], None, utcnow()
    close_hold(grader, eval_id)


@dataclass
class _EvaluationRun:
    """One claimed evaluation as this worker runs it: what it evaluates (``model``, ``harness``, a code harness, the
    suite), on which ``split``, charged to which hold (``charged``: validation only), under which ``lease``. Each sample
    is answered one of three ways: a code harness's rollout in a sandbox (:meth:`rollout`), a conversation the suite
    drives (:meth:`conversation`), or one completion scored by the suite (:meth:`completion`); :meth:`record` writes it.
    With ``null_model`` (the null-model ablation) every model call of the three is answered by the null model
    (:func:`grader.model_endpoint.null_completion`: an empty message, zero tokens, no inference call)."""

    grader: Grader
    eval_id: str
    lease: jobs.Lease
    spec: GradingSpec
    split: str
    model: str
    harness: Harness
    charged: str | None
    ctx: RunContext | None
    total: int
    item_ids: list[str] | None
    suite: Suite
    code: _CodeHarness | None
    converse: Callable[[Item, Harness, Any], float] | None
    scoring: threading.BoundedSemaphore
    null_model: bool = False

    @classmethod
    def load(cls, grader: Grader, eval_id: str, lease: jobs.Lease) -> _EvaluationRun:
        """The evaluation's row, its task's grading spec, the suite and (for a code harness) its archive."""
        with grader.db.session() as s:
            ev = repository.evaluation(s, eval_id)
            spec = repository.spec(s, ev.task_id)
            split, model, harness, hold_id, run_id, total = ev.split, ev.model, Harness(**ev.harness), ev.hold_id, ev.run_id, ev.items_total
            archive_id, item_ids, ablation = ev.harness_archive, ev.item_ids, ev.ablation
        ctx = RunContext(run_id=run_id, task_id=spec.task_id) if run_id else None
        suite = get_suite(spec.suite.name)
        code = _CodeHarness.load(grader, ctx, archive_id) if archive_id else None
        return cls(grader=grader, eval_id=eval_id, lease=lease, spec=spec, split=split, model=model, harness=harness,
                   charged=hold_id if split == "validation" else None,  # test grading is not charged
                   ctx=ctx, total=total, item_ids=item_ids, suite=suite, code=code, converse=suite_converse(suite) if code is None else None,
                   scoring=threading.BoundedSemaphore(grader.settings.scoring_concurrency), null_model=ablation == NULL_MODEL)

    @property
    def k(self) -> int:
        """Samples per item."""
        return self.spec.evaluation.samples

    def score_all(self) -> tuple[Any, int]:
        """Score every sample not scored yet (a test grading audits the run's datasets first) and aggregate them all:
        ``(score, items)``. Raises what a sample raises (:class:`SystemRefused`, ``LeaseLost``, an unavailable service)."""
        items, done = self._items_and_done()
        if self.split == "test" and self.ctx is not None:
            _audit_submission(self.grader, self.eval_id, self.ctx, items, self.spec)
        todo = [(it, j) for it in items for j in range(self.k) if (it.id, j) not in done]
        with self.grader.db.session() as s:
            self.lease.row(s).items_done = sum(1 for it in items if all((it.id, j) in done for j in range(self.k)))
        results = dict(done)
        settings = self.grader.settings
        with ThreadPoolExecutor(settings.rollout_concurrency if self.code or self.converse else settings.inference_concurrency) as pool:
            for item_id, sample, score in pool.map(self._one, todo):
                results[(item_id, sample)] = score
        by_item: dict[str, list[float]] = {}
        for (item_id, _sample), score in sorted(results.items()):
            by_item.setdefault(item_id, []).append(score)
        if self.spec.evaluator is not None:
            return self.evaluator_grade(), len(by_item)
        return aggregate(by_item, self.spec.evaluation.metric, self.k), len(by_item)

    def evaluator_grade(self) -> Score | None:
        """An evaluator's evaluation (the evaluator track's own task): its runs on the candidates graded against the
        targets (:func:`grader.evaluators.grade`), written to the row's ``grade``, and its ``Score``: the mean pairwise
        agreement. A pilot (validation) is graded against the development targets alone (their scores are the run's to
        see), and has no score (``None``) where they order none of its candidates' pairs; a final submission (test)
        against the sealed ones, the ceiling over all. Raises :class:`TargetsNotGraded`
        while a target has not graded every candidate (the evaluation is queued again, :func:`run_evaluation`)."""
        assert self.spec.evaluator is not None
        if self.split == "test":
            answers = {item: a for (item, _), a in self.grader.store.answers(self.eval_id).items()}
        else:
            with self.grader.db.session() as s:
                answers = {t.item_id: t.answer for t in repository.trajectories(s, self.eval_id)}
        results = {name: CandidateEvaluation.model_validate_json(a) if a else CandidateEvaluation(candidate=name, failure="no result")
                   for name, a in answers.items()}
        refs = [t for t in self.spec.evaluator.targets if self.split == "test" or not t.sealed]
        targets: dict[str, dict[str, float]] = {}
        for ref in refs:
            scores = target_scores(self.grader, ref.task_id)
            if any(v is None for v in scores.values()):
                raise TargetsNotGraded(f"target {ref.name!r} has not graded every candidate yet")
            targets[ref.name] = {c: v.value for c, v in scores.items() if v is not None and c in results}  # a pilot: its candidates
        graded = [t.name for t in refs if t.sealed] if self.split == "test" else [t.name for t in refs]
        result = grade(results, targets, graded)
        with self.grader.db.session() as s:
            self.lease.row(s).grade = result.model_dump(mode="json")
        if result.pairwise_agreement is None and self.split == "validation":
            return None  # no pair of these candidates is ordered by a target: a pilot with no result (the grade says why), not 0.0
        lows = [t.ci_low for t in result.targets if t.ci_low is not None]
        highs = [t.ci_high for t in result.targets if t.ci_high is not None]
        return Score(value=result.pairwise_agreement or 0.0, n=len(results), metric="pairwise_agreement", k=1,
                     ci_low=sum(lows) / len(lows) if lows else None, ci_high=sum(highs) / len(highs) if highs else None)

    def _items_and_done(self) -> tuple[list[Item], dict[tuple[str, int], float]]:
        """The split's first ``total`` items (or those of ``item_ids``), and the scores of the samples an earlier attempt
        already wrote."""
        if self.split == "test":
            return self.grader.store.items(self.spec.task_id)[:self.total], self.grader.store.done(self.eval_id)
        with self.grader.db.session() as s:
            items = repository.validation_items(s, self.spec.task_id)
            done = {(t.item_id, t.sample): t.score for t in repository.trajectories(s, self.eval_id)}
        chosen = set(self.item_ids) if self.item_ids is not None else None
        return [it for it in items if it.id in chosen] if chosen is not None else items[:self.total], done

    def _one(self, task: tuple[Item, int]) -> tuple[str, int, float]:
        """Answer, score and record one sample: ``(item id, sample, score)``."""
        item, sample = task
        self.lease.check()
        if self.code is None and self.converse is None:
            return self.completion(item, sample)
        score, answer, outcome = self.rollout(item, sample) if self.code is not None else self.conversation(item, sample)
        trajectory = outcome.trajectory
        self.record(item, sample, score, trajectory.failure, stored_completion="", answer=answer,
                    row={"messages": [{"role": "user", "content": item.question}], "completion": storable(outcome.answer or "") or "",
                         "prompt_tokens": trajectory.prompt_tokens, "completion_tokens": trajectory.completion_tokens,
                         "rollout": trajectory.model_dump(mode="json")})
        return item.id, sample, score

    def record(self, item: Item, sample: int, score: float, error: str | None, *, stored_completion: str, answer: str | None,
               row: dict[str, Any]) -> None:
        """Write one scored sample: to the test store (``stored_completion``, ``answer``) on the test split, else as a
        :class:`Trajectory` (``row``: its messages, completion, tokens and rollout); the item counts as done with its
        last sample."""
        last = sample == self.k - 1
        if self.split == "test":
            self.grader.store.record(self.eval_id, item.id, sample, stored_completion, answer, score, error)
            if last:
                with self.grader.db.session() as s:
                    self.lease.row(s).items_done += 1
            return
        with self.grader.db.session() as s:
            ev = self.lease.row(s)
            repository.add_trajectory(s, self.eval_id, item, sample, score=score, score_error=error, answer=answer, row=row)
            if last:
                ev.items_done += 1

    def _chat(self, request: ChatCompletionRequest, key: str) -> Any:
        """One metered completion (charged to the hold under ``key``, unmetered on the test split), retried while
        inference or the ledger is away; the null model's answer, uncharged, under the null-model ablation."""
        if self.null_model:
            return null_completion(request.model)
        return _with_retries(lambda: self.grader.inference.chat_completions(
            self.ctx, request, hold_id=self.charged, unmetered=self.charged is None, idempotency_key=key,
            context_tokens=self.spec.evaluation.context_tokens), self.grader.settings.upstream_retry_backoff_s)

    def completion(self, item: Item, sample: int) -> tuple[str, int, float]:
        """One completion of the harness's messages (one idempotency key per evaluation, item and sample: a sample re-run
        after a crash is not charged twice), its answer extracted and scored, recorded: ``(item id, sample, score)``. A
        prompt that does not fit the context scores 0; a request inference refuses is :class:`SystemRefused`."""
        messages = render_messages(self.harness, item.question)
        request = completion_request(self.model, self.harness, messages, sample, suite_tools(self.suite, item))
        try:
            out = self._chat(request, f"{self.eval_id}:{item.id}:{sample}")
            completion, prompt_tokens, completion_tokens = out.choices[0].message.content or "", out.usage.prompt_tokens, out.usage.completion_tokens
        except UpstreamProblem as exc:
            if exc.code != "context_exceeded":
                if (refused := _refusal(exc)) is not None:
                    raise refused from exc
                raise
            completion, prompt_tokens, completion_tokens = "", 0, 0  # does not fit: scores 0
        self.lease.check()
        answer = extract_answer(self.harness, completion, entry_point=item.entry.get("entry_point"))
        with self.scoring:  # at most scoring_concurrency answers (sandboxed programs, for code suites) at once
            score, score_error = score_item(self.suite, answer, item)
        self.record(item, sample, score, score_error, stored_completion=storable(completion), answer=storable(answer),  # type: ignore[arg-type]
                    row={"messages": messages, "completion": storable(completion), "prompt_tokens": prompt_tokens,
                         "completion_tokens": completion_tokens})
        return item.id, sample, score

    def rollout(self, item: Item, sample: int) -> tuple[float, str | None, RolloutOutcome]:
        """A code harness's rollout of one sample: ``(score, answer, outcome)``; its sandbox seconds charged. On the
        evaluator track's own task the harness is an evaluator, run on the item's candidate
        (:func:`grader.evaluators.run_evaluator`), and the answer is its :class:`CandidateEvaluation` as JSON."""
        code, settings = self.code, self.grader.settings
        assert code is not None
        key = f"{self.eval_id}:{item.id}:{sample}"
        caps = RolloutLimits.from_settings(settings)
        if self.spec.evaluator is not None:
            result, outcome = run_evaluator(code.sandbox, code.endpoint, archive=code.data, archive_id=code.id, manifest=code.manifest,
                                            candidate=item.id, system=self.spec.candidates[item.id], budget=self.spec.evaluator.budget, caps=caps,
                                            ctx=self.ctx, hold_id=self.charged, key=key, context_tokens=self.spec.evaluation.context_tokens,
                                            check=self.lease.check, unbind_wait_s=settings.inference_timeout_s)
            self.charge_sandbox(key, outcome.sandbox_s)
            return result.score or 0.0, result.model_dump_json(), outcome
        binding = Binding(model=self.model, ctx=self.ctx, hold_id=self.charged, key=key, context_tokens=self.spec.evaluation.context_tokens,
                          max_tokens=self.spec.evaluation.max_tokens, max_calls=self.spec.evaluation.max_turns, null_model=self.null_model)
        outcome = run_rollout(code.sandbox, code.endpoint, archive=code.data, archive_id=code.id, manifest=code.manifest,
                              instruction=item.question, binding=binding, environment=suite_environment(self.suite, item),
                              caps=caps, check=self.lease.check, unbind_wait_s=settings.inference_timeout_s)
        self.charge_sandbox(key, outcome.sandbox_s)
        if outcome.reward is not None:
            return outcome.reward, None, outcome
        answer = storable(outcome.answer.strip()) if outcome.answer else None
        with self.scoring:
            return score_item(self.suite, answer, item)[0], answer, outcome

    def charge_sandbox(self, key: str, sandbox_s: int) -> None:
        """Charge a rollout's sandbox seconds to the evaluation's hold (validation only), once per ``key``."""
        if self.charged and sandbox_s:
            charged = self.charged
            _with_retries(lambda: self.grader.ledger.charge_hold(charged, HoldCharge(
                usage=[UsageItem(kind=UsageKind.sandbox_seconds, quantity=sandbox_s)], idempotency_key=f"{key}:sandbox")),
                self.grader.settings.upstream_retry_backoff_s)

    def conversation(self, item: Item, sample: int) -> tuple[float, str | None, RolloutOutcome]:
        """A conversation the suite drives (``converse``): ``(score, None, outcome)``, the outcome's failure saying why a
        0 could not be scored otherwise; each model turn metered under ``<eval>:<item>:<sample>:<turn>``."""
        calls: list[Call] = []
        evaluation = self.spec.evaluation

        def complete(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
            self.lease.check()
            if len(calls) >= evaluation.max_turns:
                raise TurnLimitReached(f"the benchmark allows {evaluation.max_turns} model turns per item")
            try:
                request = completion_request(self.model, self.harness, messages, sample, tools)
            except SystemRefused as exc:
                if "(field messages" not in str(exc):
                    raise
                raise TurnLimitReached(f"the conversation no longer fits a request: {exc}") from exc  # it grew too long
            try:
                out = self._chat(request, f"{self.eval_id}:{item.id}:{sample}:{len(calls)}")
            except UpstreamProblem as exc:
                if exc.code != "context_exceeded":
                    raise _refusal(exc) or exc from exc
                raise TurnLimitReached("the conversation no longer fits the context") from exc
            message = out.choices[0].message
            calls.append(Call(messages=messages, message=message.model_dump(exclude_none=True), finish_reason=out.choices[0].finish_reason,
                              prompt_tokens=out.usage.prompt_tokens, completion_tokens=out.usage.completion_tokens, at=utcnow().isoformat()))
            return message.content or ""

        failure = None
        try:
            score = self.converse(item, self.harness, complete)  # type: ignore[misc]
        except (SystemRefused, jobs.LeaseLost, UpstreamUnavailable):
            raise
        except UpstreamProblem as exc:
            if _unavailable(exc):
                raise
            score, failure = 0.0, storable(f"{exc.__class__.__name__}: {exc}"[:500])
        except Exception as exc:  # noqa: BLE001 - what the suite raises on a conversation is that item's 0
            score, failure = 0.0, storable(f"{exc.__class__.__name__}: {exc}"[:500])
        trajectory = RolloutTrajectory(model=self.model, steps=steps_of(calls), reward=score, failure=failure, model_calls=len(calls),
                                       prompt_tokens=sum(c.prompt_tokens for c in calls), completion_tokens=sum(c.completion_tokens for c in calls))
        return score, None, RolloutOutcome(trajectory=trajectory, answer=None, reward=score, sandbox_s=0)


def _audit_submission(grader: Grader, eval_id: str, ctx: RunContext, test_items: list[Item], spec: GradingSpec) -> None:
    """Run the contamination audit (:mod:`grader.audit`) of the submission graded by ``eval_id`` over every
    dataset the run had uploaded when it submitted (the digests the gateway handed over with the submission, read from
    the artifact store, content-addressed) and every harness archive the run uploaded (for the suite's solution
    material), once (a resumed grading keeps the first report), and store it on the
    submission. A dataset missing from the store raises ``FileNotFoundError`` (the grading fails, by the platform)."""
    with grader.db.session() as s:
        sub = repository.submission_graded_by(s, eval_id)
        if sub is None or sub.contamination is not None:
            return
        datasets = [DatasetDigest(**d) for d in sub.datasets or []]

    def rows() -> Iterator[Any]:
        for ds in datasets:
            for line in artifacts.get_bytes(grader.settings.artifacts_dir, artifacts.dataset_key(ds.sha256)).splitlines():
                if line.strip():
                    yield json.loads(line)

    with grader.db.session() as s:  # what agents may see and train on: the training pool and the validation items
        public = [text for it in train_pool(grader, spec.task_id) + repository.validation_items(s, spec.task_id) for text in (it.question, it.answer)]
    suite: Suite = get_suite(spec.suite.name)
    report = audit(test_items, rows(), spec.audit, public=public, datasets=len(datasets), canonical=lambda item: suite_canonical(suite, item))
    with grader.db.session() as s:  # the run's harness archives: its final system's and every other it uploaded
        archives = [(a.id, a.uri) for a in repository.usable_archives(s, ctx.run_id) if a.run_id == ctx.run_id]
    findings = audit_harnesses(((archive_id, artifacts.local_path(uri).read_bytes()) for archive_id, uri in archives),
                               solution_material(spec.suite.name, spec.suite.params, test_items), spec.audit, test_items=test_items,
                               public=public, canonical=lambda item: suite_canonical(suite, item))
    report = report.model_copy(update={"contaminated": report.contaminated or bool(findings), "harness_archives": len(archives),
                                       "harness_findings": findings})
    log.info("contamination audit", eval_id=eval_id, flagged=report.flagged_items, items=report.items, rows=report.rows, harness_findings=findings)
    with grader.db.session() as s:
        repository.submission_graded_by(s, eval_id).contamination = report.model_dump()  # type: ignore[union-attr]


def close_hold(grader: Grader, eval_id: str) -> None:
    """Close the evaluation's hold: each completion was charged against it; the rest is released."""
    with grader.db.session() as s:
        hold_id = repository.evaluation(s, eval_id).hold_id
    if hold_id:
        grader.ledger.settle_or_charge(hold_id, [], f"settle:{eval_id}")
        with grader.db.session() as s:
            repository.evaluation(s, eval_id).hold_closed_at = utcnow()


def reap_sandboxes(grader: Grader) -> int:
    """Remove what sandboxes of dead grader processes on this host left behind (the configured backend's ``reap``;
    a sandbox also ends itself shortly after its wall limit). Logs and returns how many; 0 when the backend is away."""
    reaped = reap_workspaces()
    try:
        reaped += get_sandbox(grader.settings.sandbox_backend).reap()
    except SandboxUnavailable as exc:
        log.warning("sandboxes left by dead workers cannot be checked", backend=grader.settings.sandbox_backend, error=str(exc))
        return 0
    if reaped:
        log.warning("removed sandboxes a dead worker left behind", backend=grader.settings.sandbox_backend, count=reaped)
    return reaped


def reconcile(grader: Grader) -> jobs.ReconcileReport:
    """One reconciler round over evaluations (see ``services.common.jobs.reconcile``).

    Runs every ``reconcile_interval_s`` in the grader and once when an eval worker starts. An evaluation
    whose worker is gone is queued again and resumes item by item; one past ``eval_time_limit_s`` fails
    and its hold is closed; a queued one whose message may be lost is sent again.
    """

    def failed(_s: Session, ev: Evaluation, reason: str) -> None:  # the worker was lost too often, or grading ran too long
        ev.error, ev.failure_cause, ev.finished_at = reason, PLATFORM, utcnow()

    return jobs.reconcile(grader.db, Evaluation, grader.settings.reconcile_policy(grader.settings.eval_time_limit_s),
                          send=grader.enqueue, on_requeue=lambda _s, _ev: None, on_fail=failed, after_fail=lambda eval_id: close_hold(grader, eval_id))


def reconcile_builds(grader: Grader) -> jobs.ReconcileReport:
    """One reconciler round over the builds of tasks' splits (``services.common.jobs.reconcile``), beside
    :func:`reconcile`'s: a build whose worker is gone is queued again and sent (it starts over: nothing of it is written
    before it ends), one past ``eval_time_limit_s`` fails, a queued one whose message may be lost is sent again."""

    def failed(_s: Session, task: GradingTask, reason: str) -> None:
        task.error, task.finished_at = reason, utcnow()

    send = grader.enqueue_build or (lambda task_id: build_splits(grader, task_id))
    return jobs.reconcile(grader.db, GradingTask, grader.settings.reconcile_policy(grader.settings.eval_time_limit_s),
                          send=send, on_requeue=lambda _s, _task: None, on_fail=failed, after_fail=lambda _task_id: None)

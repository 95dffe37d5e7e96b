"""Validation evaluations: admission (the model exists, the harness is sound, the run's limits allow one more, the
worst case is held on the run's budget), the run's usage of its allowance, and reading its evaluations back."""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

from sqlalchemy.orm import Session

from grader import repository
from grader.grading_tasks import harness_for
from grader.harness_archives import code_harness_for
from grader.models import PLATFORM, Evaluation
from grader.rollouts import RolloutLimits
from grader.service import Grader
from grader.suites import get_suite, suite_converse, suite_tools
from grader.suites.base import Item
from services.common.auth import RunContext
from services.common.contracts import EvaluationCreate, EvaluationLimits, EvaluationOut, EvaluationUsage, GradingSpec, Harness, Score, TrajectoryOut
from services.common.db import serialize, utcnow
from services.common.errors import EvaluationRateLimited, FailedEvaluationLimit, Unprocessable, UpstreamProblem
from services.common.harness import check_harness, render_messages
from services.common.ids import new_id
from services.ledger.schemas import HoldCreate, HoldRelease, UsageItem, UsageKind

PROMPT_OVERHEAD_TOKENS = 64  # chat-template tokens added around the rendered messages (upper bound)
TOOLS_OVERHEAD_TOKENS = 256  # tokens a chat template (or inference's tools system message) adds around the tools' JSON (upper bound)
ROLLOUT_CONTEXT_TOKENS = 8192  # a code harness's prompt bound per call when the benchmark sets no context length


def check_model(grader: Grader, ctx: RunContext, model: str) -> str:
    """The base model that serves ``model`` to the run (``model`` itself, or a checkpoint's base: what inference charges
    its tokens at); raises ``Unprocessable`` (field ``model``) unless inference serves it."""
    try:
        return grader.inference.get_model(ctx, model).base_model
    except UpstreamProblem as exc:
        if exc.status == 404:
            raise Unprocessable(f"unknown model {model!r}: not a served base model nor one of this run's checkpoints", field="model") from exc
        raise


EVALUATOR_MODEL = "evaluator"
"""The ``model`` of an evaluation of the evaluator track's own task: what runs is the evaluator, on every candidate."""


def evaluated_model(grader: Grader, ctx: RunContext, spec: GradingSpec, model: str | None, harness_archive: str | None) -> tuple[str, str | None]:
    """``(model, base model)`` of the system a run evaluates or submits for ``spec``'s task (:func:`check_model`); for
    the evaluator track's own task ``(EVALUATOR_MODEL, None)``: it takes an evaluator (``harness_archive``) and no model.
    Raises ``Unprocessable`` naming ``model`` or ``harness_archive``, and naming ``task`` for an evaluator-track target
    (it grades the candidates; a system graded on a sealed one would tell the run what it may not know)."""
    if spec.target is not None:
        raise Unprocessable(f"task: {spec.task!r} is a target of the evaluator track: it takes no evaluation or submission; evaluate and "
                            "submit your evaluator on the task 'evaluator'", field="task")
    if spec.evaluator is not None:
        if model is not None:
            raise Unprocessable("model: the evaluator track's task runs your evaluator on every candidate; give harness_archive only", field="model")
        if harness_archive is None:
            raise Unprocessable("harness_archive: required here: the evaluator (an archive of POST /v1/harnesses) to run on the candidates",
                                field="harness_archive")
        return EVALUATOR_MODEL, None
    if model is None:
        raise Unprocessable("model: required: a base model name or one of the run's ckpt_…", field="model")
    return model, check_model(grader, ctx, model)


def evaluator_usage(grader: Grader, spec: GradingSpec, candidates: list[str]) -> list[UsageItem]:
    """The worst case of an evaluator run on each of ``candidates``: its budget's tokens (at most all prompt, at most
    ``calls × max_tokens`` completion) at the candidate's model's prices, and its wall seconds in the sandbox."""
    assert spec.evaluator is not None
    budget, caps = spec.evaluator.budget, RolloutLimits.from_settings(grader.settings)
    usage = []
    for name in candidates:
        model = spec.candidates[name].model
        usage += [UsageItem(kind=UsageKind.prefill_tokens, quantity=budget.tokens, model=model),
                  UsageItem(kind=UsageKind.decode_tokens, quantity=min(budget.tokens, budget.calls * budget.max_tokens), model=model)]
    usage.append(UsageItem(kind=UsageKind.sandbox_seconds, quantity=math.ceil(min(caps.wall_s, budget.wall_s)) * len(candidates)))
    return usage


def prompt_upper_bound(harness: Harness, question: str, tools: list[dict[str, Any]] | None = None) -> int:
    """Upper bound of a call's prompt tokens: bytes of the messages and of the ``tools`` as JSON (a BPE token is
    ≥ 1 byte; ASCII-escaped JSON is never shorter than the UTF-8 text inference renders) + template overhead."""
    tools_bound = len(json.dumps(tools).encode()) + TOOLS_OVERHEAD_TOKENS if tools else 0
    return sum(len(m["content"].encode()) for m in render_messages(harness, question)) + tools_bound + PROMPT_OVERHEAD_TOKENS


def rollout_usage(grader: Grader, spec: GradingSpec, base: str, rollouts: int, *, sandboxed: bool) -> list[UsageItem]:
    """The worst case of ``rollouts`` multi-turn rollouts: each makes at most ``max_turns`` model calls of at most the
    context length (``context_tokens``, else :data:`ROLLOUT_CONTEXT_TOKENS`) of prompt and ``max_tokens`` of completion;
    a code harness's (``sandboxed``) also runs its set-up, harness and verifier for at most their wall limits (sandbox
    seconds)."""
    settings, caps = spec.evaluation, RolloutLimits.from_settings(grader.settings)
    calls = settings.max_turns * rollouts
    usage = [UsageItem(kind=UsageKind.prefill_tokens, quantity=calls * (settings.context_tokens or ROLLOUT_CONTEXT_TOKENS), model=base),
             UsageItem(kind=UsageKind.decode_tokens, quantity=calls * settings.max_tokens, model=base)]
    if sandboxed:
        usage.append(UsageItem(kind=UsageKind.sandbox_seconds, quantity=math.ceil(caps.wall_s + 2 * caps.verifier_wall_s) * rollouts))
    return usage


def evaluation_usage(s: Session, run_id: str, now: dt.datetime | None = None) -> tuple[EvaluationUsage, list[dt.datetime]]:
    """The run's use of its evaluation allowance, and the start times of its counted evaluations (newest first)."""
    now = now or utcnow()
    rows = repository.validation_evaluations(s, run_id)
    counted = sorted((ev.created_at for ev in rows if ev.status not in ("failed", "cancelled")), reverse=True)
    usage = EvaluationUsage(
        last_hour=sum(1 for c in counted if c > now - dt.timedelta(hours=1)),
        last_day=sum(1 for c in counted if c > now - dt.timedelta(days=1)),
        active=sum(1 for ev in rows if ev.status in ("queued", "running")),
        failed=sum(1 for ev in rows if ev.status in ("failed", "cancelled") and ev.failure_cause != PLATFORM),
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


def create_evaluation(grader: Grader, ctx: RunContext, req: EvaluationCreate, limits: EvaluationLimits | None = None) -> EvaluationOut:
    """Queue a validation evaluation after holding its worst-case inference cost on the run's budget.

    With ``req.ablation`` ``null_model`` the system's model is replaced by the null model: no model tokens are held or
    spent, a code harness's sandbox seconds are (a declarative harness's ablation costs nothing and holds nothing); it
    counts against ``limits`` as any evaluation.

    Raises ``Unprocessable`` (model, harness, ablation on the evaluator track), ``EvaluationRateLimited``/``FailedEvaluationLimit``
    (``limits``, checked before the hold and again, serialized per run, when the row is written), and
    passes the ledger's 402 through; when refused, nothing is written and no money stays held.
    """
    limits = limits or EvaluationLimits()
    with grader.db.session() as s:
        spec = repository.spec(s, ctx.task_id)
        items = repository.validation_items(s, ctx.task_id)
        check_evaluation_limits(*evaluation_usage(s, ctx.run_id), limits, utcnow())
    if req.harness is not None:
        check_harness(req.harness)
    if req.ablation is not None and spec.evaluator is not None:
        raise Unprocessable("ablation: the evaluator track's task runs an evaluator on candidate systems; it has no model to ablate", field="ablation")
    model, base = evaluated_model(grader, ctx, spec, req.model, req.harness_archive)  # its price is the evaluated model's
    suite = get_suite(spec.suite.name)
    archive = code_harness_for(grader, ctx, suite, req.harness, req.harness_archive)
    harness = harness_for(spec, req.harness)
    items, item_ids = chosen_items(spec, items, req)
    k = spec.evaluation.samples
    if spec.evaluator is not None:
        usage = evaluator_usage(grader, spec, [it.id for it in items])
    elif archive is None and suite_converse(suite) is None:
        prefill = sum(prompt_upper_bound(harness, it.question, suite_tools(suite, it)) for it in items) * k
        usage = [UsageItem(kind=UsageKind.prefill_tokens, quantity=prefill, model=base),
                 UsageItem(kind=UsageKind.decode_tokens, quantity=harness.max_tokens * len(items) * k, model=base)]
    else:
        usage = rollout_usage(grader, spec, base, len(items) * k, sandboxed=archive is not None)
    if req.ablation is not None:  # the null model spends no tokens
        usage = [u for u in usage if u.kind not in (UsageKind.prefill_tokens, UsageKind.decode_tokens)]
    eval_id = new_id("eval")
    hold = grader.ledger.create_hold(HoldCreate(
        account_id=ctx.run_id, purpose=f"validation evaluation {eval_id}", idempotency_key=f"hold:{eval_id}",
        ttl_s=int(grader.settings.eval_time_limit_s) + 3600,  # outlives the evaluation's time limit: expires only if orphaned
        usage=usage,
    )) if usage else None
    try:
        with grader.db.session() as s:
            serialize(s, f"evaluations:{ctx.run_id}")  # the re-check and the insert are one step per run
            check_evaluation_limits(*evaluation_usage(s, ctx.run_id), limits, utcnow())
            ev = repository.add_evaluation(s, spec, run_id=ctx.run_id, purpose="validation", split="validation", model=model, harness=harness,
                                           items_total=len(items), hold_id=hold.hold_id if hold else None, eval_id=eval_id, harness_archive=archive,
                                           item_ids=item_ids, ablation=req.ablation)
            out = evaluation_out(s, ev)
    except Exception:
        if hold is not None:
            grader.ledger.release_hold(hold.hold_id, HoldRelease(idempotency_key=f"release:{eval_id}"))
        raise
    grader.enqueue(eval_id)
    return out


def chosen_items(spec: GradingSpec, items: list[Item], req: EvaluationCreate) -> tuple[list[Item], list[str] | None]:
    """The validation items ``req`` evaluates and, where they are not the split's first ones, their ids: the first
    ``limit`` items, or on the evaluator track the ``candidates`` chosen for a pilot (in the split's order). Raises
    ``Unprocessable`` (field ``candidates``) where a task other than an evaluator's is given candidates, with ``limit``,
    or with a name that is not one of its candidates."""
    if spec.evaluator is not None and req.limit is not None and req.limit < 2:
        raise Unprocessable("limit: an evaluator is graded on pairs of candidates; a pilot needs two or more", field="limit")
    if req.candidates is None:
        return (items[: req.limit] if req.limit else items), None
    if spec.evaluator is None:
        raise Unprocessable("candidates: only the evaluator track's task `evaluator` takes candidates", field="candidates")
    if req.limit is not None:
        raise Unprocessable("candidates: give candidates or limit, not both", field="candidates")
    unknown = sorted(set(req.candidates) - {it.id for it in items})
    if unknown:
        raise Unprocessable(f"candidates: {', '.join(unknown)} is not a candidate of this benchmark (GET /v1/models lists them)",
                            field="candidates")
    chosen = [it for it in items if it.id in set(req.candidates)]
    return chosen, [it.id for it in chosen]


def evaluation_out(s: Session, ev: Evaluation) -> EvaluationOut:
    """The wire form of ``ev`` (read in ``s``, its session)."""
    return EvaluationOut(id=ev.id, status=ev.status, task=repository.spec(s, ev.task_id).task, split=ev.split, model=ev.model,  # type: ignore[arg-type]
                         harness=None if ev.harness_archive else Harness(**ev.harness),
                         harness_archive=ev.harness_archive, ablation=ev.ablation,  # type: ignore[arg-type]
                         items_total=ev.items_total, items_done=ev.items_done, score=Score(**ev.score) if ev.score else None,
                         attempts=ev.attempts, error=ev.error, created_at=ev.created_at, started_at=ev.started_at, finished_at=ev.finished_at,
                         score_so_far=repository.mean_score_so_far(s, ev.id) if ev.status == "running" and ev.split == "validation" else None)


def usage_of(grader: Grader, ctx: RunContext) -> EvaluationUsage:
    """The run's evaluation usage (for its run card)."""
    with grader.db.session() as s:
        return evaluation_usage(s, ctx.run_id)[0]


def get_evaluation(grader: Grader, ctx: RunContext, eval_id: str) -> EvaluationOut:
    """One of the run's validation evaluations; raises ``NotFound`` for any other id."""
    with grader.db.session() as s:
        return evaluation_out(s, repository.owned_evaluation(s, ctx, eval_id))


def list_evaluations(grader: Grader, ctx: RunContext) -> list[EvaluationOut]:
    """The run's validation evaluations, oldest first."""
    with grader.db.session() as s:
        return [evaluation_out(s, e) for e in repository.validation_evaluations(s, ctx.run_id)]


def trajectories(grader: Grader, ctx: RunContext, eval_id: str) -> list[TrajectoryOut]:
    """Per-item trajectories of one of the run's validation evaluations; raises ``NotFound`` for any other id."""
    with grader.db.session() as s:
        repository.owned_evaluation(s, ctx, eval_id)
        return [TrajectoryOut(item_id=t.item_id, sample=t.sample, question=t.question, messages=t.messages, completion=t.completion,  # type: ignore[arg-type]
                              answer=t.answer, expected=t.expected, score=t.score, score_error=t.score_error, prompt_tokens=t.prompt_tokens,
                              completion_tokens=t.completion_tokens, rollout=t.rollout) for t in repository.trajectories(s, eval_id)]

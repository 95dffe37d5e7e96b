"""Training jobs: creation under a budget hold, reading, cancelling, and a job's end (its status, events and
the settling of its hold), shared by the API and the worker.

A job's row is its truth (``services.common.jobs``); its events are an append-only log an agent polls.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from trainer_service import repository
from trainer_service.estimate import check_memory, dataset_rows, estimate_tokens, job_devices, lora_rank, method_of, place_hold, stored_parameters
from trainer_service.models import Checkpoint, TrainingJob
from trainer_service.schemas import CheckpointRecord
from trainer_service.service import Trainer

from services.common import artifacts, recipes
from services.common.auth import RunContext
from services.common.contracts import CheckpointOut, Harness, JobEventOut, MergeSpec, Recipe, TrainingJobCreate, TrainingJobOut
from services.common.db import utcnow
from services.common.errors import Conflict, IdempotencyKeyReused, NotFound, Unprocessable, UpstreamUnavailable
from services.common.ids import has_prefix, new_id
from services.common.llms import UnknownBaseModel, model_card
from services.common.processes import process_tag, tag_alive
from services.common.settings import ServiceSettings
from services.ledger.schemas import HoldRelease, UsageItem, UsageKind

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
log = structlog.get_logger("trainer")


def _job_out(s: Session, job: TrainingJob) -> TrainingJobOut:
    latest = repository.latest_checkpoint(s, job.id)
    return TrainingJobOut(
        id=job.id, status=job.status, model=job.parent_checkpoint_id or job.base_model, base_model=job.base_model,  # type: ignore[arg-type]
        datasets=job.dataset_ids, recipe=Recipe(**job.recipe), merge=MergeSpec(**job.merge) if job.merge else None,
        harness=Harness(**job.harness) if job.harness else None, grader=job.grader, steps_done=job.steps_done, estimated_tokens=job.estimated_tokens,
        trained_tokens=job.trained_tokens, prefill_tokens=job.prefill_tokens, decode_tokens=job.decode_tokens, latest_checkpoint=latest.id if latest else None, attempts=job.attempts, error=job.error, created_at=job.created_at,
        started_at=job.started_at, finished_at=job.finished_at,
    )


def _resolve_model(s: Session, ctx: RunContext, model: str, models_dir: Path) -> tuple[str, Checkpoint | None]:
    """``(base_model, parent_checkpoint)`` for a base model prepared under ``models_dir`` (the registry) or one of the
    run's checkpoints; else 422."""
    if has_prefix(model, "ckpt"):
        ckpt = repository.checkpoint(s, model, ctx.run_id)
        if ckpt is None:
            raise Unprocessable(f"unknown checkpoint {model!r}", field="model")
        return ckpt.base_model, ckpt
    try:
        model_card(model, models_dir)
    except UnknownBaseModel as exc:
        raise Unprocessable(str(exc), field="model") from exc
    return model, None


@dataclass
class _Plan:
    """What a validated job request becomes: its row's fields, the usage its hold covers, its ``validated`` event."""

    base_model: str
    parent_id: str | None
    dataset_ids: list[str]
    usage: list[UsageItem]
    estimated_tokens: int
    merge: dict[str, Any] | None
    message: str
    data: dict[str, Any]
    adapter: str | None = None  # a merge: its checkpoints' kind, recorded as the job's recipe.adapter
    run_context: dict[str, Any] | None = None  # a rewarded (grpo) job: the run its worker asks the grader for rewards for


def create_job(trainer: Trainer, ctx: RunContext, req: TrainingJobCreate, idempotency_key: str | None = None) -> TrainingJobOut:
    """Validate a job, hold its estimated cost on the run's budget, store it ``queued`` and send it to the workers.

    Raises ``Unprocessable`` (a method this deployment does not train, an unknown model, a LoRA job on a full
    parent, a job too large for a train worker's memory: ``estimate.check_memory``, rows it cannot train: see
    ``estimate.training_examples``; for GRPO, ``rewards.grpo_rows``; for a merge, :func:`_merge_plan`), ``NotFound`` (a dataset that is not the
    run's), ``IdempotencyKeyReused`` (``idempotency_key`` used before with another request) and passes the
    ledger's 402 through. The job row is written only after the hold succeeded, and the hold is released if
    writing fails: nothing is half-written. With ``idempotency_key`` the call is safe to repeat: the ledger hold
    carries a key derived from it (a retry after a lost answer finds the same hold) and a repeat returns the
    job created first.
    """
    recipe = req.recipe
    if recipe.method == "primitives":
        raise Unprocessable("a primitives job is a live model of Tinker's primitives: create it with Tinker's create_lora_training_client "
                            "(the gateway's /api/v1 routes)", field="recipe.method")
    fingerprint = hashlib.sha256(req.model_dump_json().encode()).hexdigest()
    if idempotency_key and (existing := _job_by_key(trainer, ctx, idempotency_key, fingerprint)) is not None:
        return existing
    plan = _merge_plan(trainer, ctx, req) if recipe.method == "merge" else _training_plan(trainer, ctx, req)
    job_id = new_id("job")
    hold = place_hold(trainer, ctx, job_id, plan.usage, idempotency_key)
    try:
        with trainer.db.session() as s:
            job = repository.add_job(
                s, ctx, job_id, method=recipe.method, merge=plan.merge, run_context=plan.run_context,
                harness=req.harness.model_dump() if req.harness else None,
                grader=req.grader.model_dump(exclude_none=True) if req.grader else None,
                recipe=recipe.model_dump() | ({"adapter": plan.adapter} if plan.adapter else {}),
                dataset_ids=plan.dataset_ids, base_model=plan.base_model, parent_checkpoint_id=plan.parent_id,
                hold_id=hold.hold_id, idempotency_key=idempotency_key, request_sha256=fingerprint, estimated_tokens=plan.estimated_tokens,
            )
            repository.add_event(s, job.id, "info", "validated", f"{plan.message}, hold {hold.amount_usd_micros} µUSD",
                                 {**plan.data, "hold_usd_micros": hold.amount_usd_micros})
            out = _job_out(s, job)
    except IntegrityError:  # the same key was used concurrently and the other request wrote its job first
        if idempotency_key and (existing := _job_by_key(trainer, ctx, idempotency_key, fingerprint)) is not None:
            return existing
        raise
    except Exception:
        trainer.ledger.release_hold(hold.hold_id, HoldRelease(idempotency_key=f"release:{hold.hold_id}"))
        raise
    trainer.enqueue(job_id)
    return out


def _refuse_unused(recipe: Recipe, used: frozenset[str]) -> None:
    """``Unprocessable`` naming ``recipe.<field>`` for a field set to other than its default that the job's method
    does not read (``used``: its :attr:`~services.common.recipes.MethodSpec.fields`): a recipe field is honoured or
    refused, never silently ignored."""
    defaults = Recipe()
    for name in Recipe.model_fields:
        if name not in used and getattr(recipe, name) != getattr(defaults, name):
            raise Unprocessable(f"recipe.{name} does not apply to recipe.method {recipe.method!r}; leave it out", field=f"recipe.{name}")


def _training_plan(trainer: Trainer, ctx: RunContext, req: TrainingJobCreate) -> _Plan:
    recipe = req.recipe
    spec = method_of(recipe).spec
    _refuse_unused(recipe, spec.fields)
    if recipe.adapter not in spec.adapters:
        raise Unprocessable(f"recipe.method {recipe.method!r} trains {' or '.join(sorted(spec.adapters))}, not {recipe.adapter!r}",
                            field="recipe.adapter")
    if req.merge is not None:
        raise Unprocessable("merge is for recipe.method 'merge' only", field="merge")
    rewarded = spec.rewarded
    if req.harness is not None and not rewarded:
        names = " or ".join(repr(m.name) for m in recipes.METHODS.values() if m.rewarded)
        raise Unprocessable(f"harness is for recipe.method {names} only (it renders the training pool's prompts and extracts the rewarded "
                            "answer); evaluations take their own harness", field="harness")
    if req.grader is not None and not rewarded:
        names = " or ".join(repr(m.name) for m in recipes.METHODS.values() if m.rewarded)
        raise Unprocessable(f"grader is for recipe.method {names} only (it rewards sampled completions)", field="grader")
    if req.grader is not None and req.harness is not None:
        raise Unprocessable("a graded job samples its datasets' own prompts; the harness renders the training pool's: leave it out", field="harness")
    if req.grader is not None and not req.datasets:
        raise Unprocessable("a graded job trains on its prompt_only datasets, whose rows' fields the grader reads; give at least one",
                            field="datasets")
    if not req.datasets and not rewarded:
        raise Unprocessable(f"recipe.method {recipe.method!r} trains on at least one dataset", field="datasets")
    with trainer.db.session() as s:
        base_model, parent = _resolve_model(s, ctx, req.model, trainer.settings.models_dir)
        datasets = [repository.owned_dataset(s, ctx, d) for d in req.datasets]
    if parent is not None and parent.kind == "full" and recipe.adapter == "lora":
        raise Unprocessable(f"{parent.id} holds full weights; a LoRA adapter is trained over a base model or another adapter. "
                            "Continue it with recipe.adapter 'full'.", field="recipe.adapter")
    if rewarded:
        from trainer_service.rewards import grpo_rows

        rows = grpo_rows(trainer, ctx, req.harness, req.grader, datasets, recipe)
    else:
        rows = dataset_rows(datasets, recipe)
    devices = job_devices(trainer.settings, recipe)
    examples, tokens, longest = estimate_tokens(trainer, base_model, rows, recipe)
    memory_mb = -(-check_memory(trainer, base_model, recipe, longest, lora_parent=parent is not None and parent.kind == "lora",
                                devices=devices).total // 2**20)
    usage = [UsageItem(kind=UsageKind.training_tokens, quantity=tokens.training, model=base_model)]
    usage += [UsageItem(kind=kind, quantity=quantity, model=base_model)
              for kind, quantity in ((UsageKind.prefill_tokens, tokens.prefill), (UsageKind.decode_tokens, tokens.decode)) if quantity]
    source = f"{len(datasets)} dataset(s)" if datasets else "the training pool"
    rollouts = f", ≤{tokens.prefill} prefill and ≤{tokens.decode} decode tokens of rollouts" if rewarded else ""
    return _Plan(base_model=base_model, parent_id=parent.id if parent else None, dataset_ids=[d.id for d in datasets], usage=usage,
                 estimated_tokens=tokens.training, merge=None, run_context=ctx.model_dump() if rewarded else None,
                 message=f"validated {examples} {recipe.method} examples from {source}; estimated ≤{tokens.training} training "
                         f"tokens{rollouts}, ≈{memory_mb} MiB" + (f" on each of {devices} devices" if devices > 1 else ""),
                 data={"rows": examples, "estimated_tokens": tokens.training, "estimated_memory_mb": memory_mb, "devices": devices}
                 | ({"estimated_prefill_tokens": tokens.prefill, "estimated_decode_tokens": tokens.decode} if rewarded else {}))


def _merge_plan(trainer: Trainer, ctx: RunContext, req: TrainingJobCreate) -> _Plan:
    """A merge: ``model`` is the base model, ``merge.checkpoints`` the run's checkpoints of that base, all LoRA or all
    full weights (LoRA of one rank, which PEFT's combinations need). ``Unprocessable`` naming ``merge``,
    ``datasets``, ``model`` or ``merge.checkpoints[i]`` otherwise. The hold covers the parameters the merge reads."""
    spec = req.merge
    if spec is None:
        raise Unprocessable("recipe.method 'merge' needs merge: the checkpoints to combine", field="merge")
    if req.datasets:
        raise Unprocessable("a merge trains on nothing; leave datasets empty", field="datasets")
    if req.harness is not None or req.grader is not None:
        field = "harness" if req.harness is not None else "grader"
        raise Unprocessable(f"a merge samples nothing; leave {field} out", field=field)
    if has_prefix(req.model, "ckpt"):
        raise Unprocessable("a merge's model is the base model of its checkpoints", field="model")
    with trainer.db.session() as s:
        base_model, _ = _resolve_model(s, ctx, req.model, trainer.settings.models_dir)
        checkpoints = []
        for i, ckpt_id in enumerate(spec.checkpoints):
            ckpt = repository.checkpoint(s, ckpt_id, ctx.run_id)
            if ckpt is None:
                raise Unprocessable(f"unknown checkpoint {ckpt_id!r}", field=f"merge.checkpoints[{i}]")
            if ckpt.base_model != base_model:
                raise Unprocessable(f"{ckpt_id} is of {ckpt.base_model}, not {base_model}", field=f"merge.checkpoints[{i}]")
            checkpoints.append((ckpt.kind, artifacts.local_path(ckpt.uri)))
    kinds = {kind for kind, _ in checkpoints}
    if len(kinds) > 1:
        raise Unprocessable("the checkpoints mix LoRA adapters and full weights; merge one kind", field="merge.checkpoints")
    kind = next(iter(kinds))
    if req.recipe.adapter == "full" and kind == "lora":
        raise Unprocessable("a merge keeps its checkpoints' kind: these are LoRA adapters", field="recipe.adapter")
    _refuse_unused(req.recipe, recipes.method_spec("merge").fields)
    if kind == "lora":
        ranks = [lora_rank(folder) for _, folder in checkpoints]
        if len(set(ranks)) > 1:
            i = next(i for i, r in enumerate(ranks) if r != ranks[0])
            raise Unprocessable(f"LoRA ranks differ ({ranks}); PEFT combines adapters of one rank", field=f"merge.checkpoints[{i}]")
    parameters = sum(stored_parameters(folder) for _, folder in checkpoints)
    return _Plan(base_model=base_model, parent_id=None, dataset_ids=[], estimated_tokens=0, merge=spec.model_dump(), adapter=kind,
                 usage=[UsageItem(kind=UsageKind.merged_parameters, quantity=parameters, model=base_model)],
                 message=f"validated a {spec.combination} merge of {len(checkpoints)} {kind} checkpoint(s), {parameters:,} parameters to read",
                 data={"checkpoints": len(checkpoints), "merged_parameters": parameters})


def _job_by_key(trainer: Trainer, ctx: RunContext, idempotency_key: str, fingerprint: str) -> TrainingJobOut | None:
    """The run's job created with ``idempotency_key``; ``IdempotencyKeyReused`` if it was created from another request."""
    with trainer.db.session() as s:
        job = repository.job_by_idempotency_key(s, ctx, idempotency_key)
        if job is None:
            return None
        if job.request_sha256 != fingerprint:
            raise IdempotencyKeyReused(f"Idempotency-Key {idempotency_key!r} was used for a different training job request ({job.id})",
                                       field="Idempotency-Key")
        return _job_out(s, job)


def list_jobs(trainer: Trainer, ctx: RunContext) -> list[TrainingJobOut]:
    """The run's jobs, oldest first."""
    with trainer.db.session() as s:
        return [_job_out(s, j) for j in repository.run_jobs(s, ctx)]


def get_job(trainer: Trainer, ctx: RunContext, job_id: str) -> TrainingJobOut:
    """The run's job; ``NotFound`` for another run's or an unknown id."""
    with trainer.db.session() as s:
        return _job_out(s, repository.owned_job(s, ctx, job_id))


def list_events(trainer: Trainer, ctx: RunContext, job_id: str, after: int = 0, limit: int = 500) -> list[JobEventOut]:
    """Events of the run's job with ``seq > after``, oldest first (poll with the last ``seq`` seen)."""
    with trainer.db.session() as s:
        repository.owned_job(s, ctx, job_id)
        return [JobEventOut(seq=e.seq, level=e.level, type=e.type, message=e.message, data=e.data, created_at=e.created_at)  # type: ignore[arg-type]
                for e in repository.events_after(s, job_id, after, limit)]


def _checkpoint_out(c: Checkpoint) -> CheckpointOut:
    return CheckpointOut(id=c.id, job_id=c.job_id, step=c.step, base_model=c.base_model, kind=c.kind, metrics=c.metrics, created_at=c.created_at)  # type: ignore[arg-type]


def list_checkpoints(trainer: Trainer, ctx: RunContext, job_id: str) -> list[CheckpointOut]:
    """The checkpoints of the run's job by step; ``NotFound`` for another run's or an unknown job."""
    with trainer.db.session() as s:
        repository.owned_job(s, ctx, job_id)
        return [_checkpoint_out(c) for c in repository.job_checkpoints(s, job_id)]


def cancel_job(trainer: Trainer, ctx: RunContext, job_id: str) -> TrainingJobOut:
    """Stop a job. A queued job is cancelled at once and its hold released; a running one stops after its
    current step and is charged for the steps it trained. ``Conflict`` if the job already ended."""
    with trainer.db.session() as s:
        job = repository.owned_job(s, ctx, job_id, lock=True)  # a worker's claim waits for this transaction
        if job.status in TERMINAL:
            raise Conflict(f"training job {job_id} is already {job.status}")
        job.cancel_requested = True
        repository.add_event(s, job.id, "info", "cancel_requested", "cancellation requested")
        if job.status in ("queued", "paused"):  # no worker has it: nobody else will write this row (claims need ``queued``)
            finish(s, job, "cancelled", None)
        out = _job_out(s, job)
        live = repository.live_model_of_job(s, job_id) if out.status == "cancelled" else None
    if out.status == "cancelled":
        settle_cancelled(trainer, job_id)
    if live is not None:  # a live model of Tinker's primitives: its requests still waiting will not run
        fail_queued(trainer, live.id, "the live model's job was cancelled", category="user")
    return out


def checkpoint_record(trainer: Trainer, checkpoint_id: str, run_id: str | None) -> CheckpointRecord:
    """Where a checkpoint lives, for the inference service; ``NotFound`` if unknown or not ``run_id``'s."""
    with trainer.db.session() as s:
        c = repository.checkpoint(s, checkpoint_id, run_id)
        if c is None:
            raise NotFound(f"checkpoint {checkpoint_id} not found")
        return CheckpointRecord(id=c.id, run_id=c.run_id, base_model=c.base_model, uri=c.uri, kind=c.kind, step=c.step)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- a job's end


def finish(s: Session, job: TrainingJob, status: str, error: str | None) -> None:
    """End ``job`` with ``status`` (a terminal one) and ``error``, and log it; its hold is settled by :func:`settle`."""
    job.status = status
    job.error = error
    job.worker_id = None
    job.finished_at = utcnow()
    repository.add_event(s, job.id, "error" if error else "info", status, error or f"job {status} after {job.steps_done} steps, {job.trained_tokens} tokens")


def settle(trainer: Trainer, job_id: str) -> None:
    """Settle the job's hold with the work it did (idempotent: one settle per job) and note it: the tokens a
    training job processed (and a GRPO job's rollouts generated); for a merge, the parameters it read if it wrote its
    checkpoint, else nothing.

    Raises ``UpstreamUnavailable`` while the ledger is away; the reconciler settles finished jobs whose
    hold is still open.
    """
    with trainer.db.session() as s:
        job = repository.training_job(s, job_id)
        hold_id, tokens, base_model = job.hold_id, job.trained_tokens, job.base_model  # type: ignore[union-attr]
        rollouts = ((UsageKind.prefill_tokens, job.prefill_tokens), (UsageKind.decode_tokens, job.decode_tokens))  # type: ignore[union-attr]
        merged = _merged_parameters(s, job) if job.method == "merge" else 0  # type: ignore[union-attr]
    if hold_id is None:
        return
    usage = [UsageItem(kind=UsageKind.training_tokens, quantity=tokens, model=base_model)] if tokens else []
    usage += [UsageItem(kind=kind, quantity=quantity, model=base_model) for kind, quantity in rollouts if quantity]
    usage += [UsageItem(kind=UsageKind.merged_parameters, quantity=merged, model=base_model)] if merged else []
    trainer.ledger.settle_or_charge(hold_id, usage, f"settle:{job_id}")
    with trainer.db.session() as s:
        repository.training_job(s, job_id).hold_closed_at = utcnow()  # type: ignore[union-attr]


def _merged_parameters(s: Session, job: TrainingJob) -> int:
    """Parameters a merge job read: those of its input checkpoints once it wrote its own, else 0."""
    if repository.latest_checkpoint(s, job.id) is None:
        return 0
    return sum(stored_parameters(artifacts.local_path(repository.checkpoint(s, c).uri)) for c in job.merge["checkpoints"])  # type: ignore[index, union-attr]


def settle_cancelled(trainer: Trainer, job_id: str) -> None:
    """:func:`settle` a cancelled job's hold; while the ledger is away, leave it to the reconciler (logged)."""
    try:
        settle(trainer, job_id)
    except UpstreamUnavailable:
        log.warning("ledger unavailable; the cancelled job's hold is settled later", job_id=job_id)


WORKDIR_PREFIX = "work-{owner}-{job_id}-"
"""A job's work folder under the data dir, named for the worker process running it (:func:`process_tag`)."""


def workdir(settings: ServiceSettings, job_id: str) -> Path:
    """A new work folder for ``job_id`` (temporary files while it trains), removed by the worker when the job leaves it
    and, when that worker died, by :func:`reap_workdirs`."""
    return Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX.format(owner=process_tag(), job_id=job_id), dir=settings.data_dir))


def reap_workdirs(settings: ServiceSettings) -> int:
    """Remove the work folders that train workers of this host left when they died (a live worker's are never
    touched); returns how many. Called when a train worker starts."""
    reaped = 0
    for path in Path(settings.data_dir).glob("work-*-*"):
        if path.is_dir() and not tag_alive(path.name.split("-")[1]):
            shutil.rmtree(path, ignore_errors=True)
            reaped += 1
    return reaped


def end_live_requests(trainer: Trainer, job_id: str) -> None:
    """When job ``job_id`` has ended and holds a live model (Tinker's primitives), fail that model's requests still
    queued (:func:`fail_queued`): for a job the reconciler ended, whose worker is gone and will not do it."""
    with trainer.db.session() as s:
        job = repository.training_job(s, job_id)
        live = repository.live_model_of_job(s, job_id)
        if job is None or live is None or job.status not in TERMINAL:
            return
        model_id, status = live.id, job.status
    fail_queued(trainer, model_id, f"the live model's job is {status}", category="user" if status == "cancelled" else "server")


def fail_queued(trainer: Trainer, model_id: str, error: str, *, category: str) -> None:
    """End every request of live model ``model_id`` still queued as failed with ``error``, releasing their holds: the
    model's job has ended (failed, cancelled, its session finished), so nothing will run them."""
    with trainer.db.session() as s:
        holds = []
        for req in repository.queued_primitive_requests(s, model_id):
            req.status, req.error, req.category, req.finished_at = "failed", error, category, utcnow()
            holds += [req.hold_id] if req.hold_id else []
    for hold_id in holds:
        trainer.ledger.release_hold(hold_id, HoldRelease(idempotency_key=f"release:{hold_id}"))

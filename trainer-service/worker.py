"""The worker's side of training jobs: running one to its end (``run_job``, called by the Celery task in
``tasks.py``) and taking back jobs a dead worker left behind (``reconcile``, in the service and at worker start).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy import select
from sqlalchemy.orm import Session
from trainer_service.estimate import dataset_rows, method_of, tokenizer, train_config
from trainer_service.jobs import event, finish, settle, settle_cancelled
from trainer_service.models import Checkpoint, Dataset, TrainingJob
from trainer_service.service import Trainer

from services.common import artifacts, jobs
from services.common.auth import RunContext
from services.common.contracts import Harness, MergeSpec, Recipe
from services.common.db import utcnow
from services.common.ids import new_id
from services.common.llms import base_model_dir

log = structlog.get_logger("trainer")


def run_job(trainer: Trainer, job_id: str) -> None:
    """Run a queued job to the end in this worker process: train, write checkpoints, settle the hold.

    The row's status is the truth: the worker claims the job (``queued`` → ``running`` under its id, see
    ``services.common.jobs``), so a duplicate message finds nothing to do, and heartbeats while it trains.
    A job that already has checkpoints (an earlier attempt died) resumes from the newest one, with its token
    count reset to that checkpoint's, so no step is charged twice. Events record every step's loss, learning
    rate, tokens and tokens/s. The hold is settled with the tokens actually processed, whatever the outcome
    (charge equals work done). If the lease is lost (the watchdog failed the job, or it was given to another
    worker) training stops and this worker writes nothing more. A GRPO job's rollouts are scored by the grader for
    the run the job was created for (``trainer_service.rewards``); their prefill and decode tokens are counted like
    the training tokens (per step, in checkpoints, settled).
    """
    from trainer_service.training import train

    db, settings = trainer.db, trainer.settings
    if not jobs.claim(db, TrainingJob, job_id):
        return
    with db.session() as s:
        job = s.get(TrainingJob, job_id)
        if job.cancel_requested:
            finish(s, job, "cancelled", None)
            job_snapshot = None
        else:
            latest = s.scalar(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step.desc()).limit(1))
            resume = artifacts.local_path(latest.uri) if latest is not None else None
            if latest is not None:
                job.steps_done = latest.step
                job.trained_tokens = int(latest.metrics.get("trained_tokens", job.trained_tokens))
                job.prefill_tokens = int(latest.metrics.get("prefill_tokens", 0))
                job.decode_tokens = int(latest.metrics.get("decode_tokens", 0))
                event(s, job.id, "warn", "resumed", f"attempt {job.attempts}: resuming from checkpoint {latest.id} at step {latest.step}",
                      {"step": latest.step, "checkpoint": latest.id, "attempt": job.attempts})
            else:
                job.steps_done, job.trained_tokens, job.prefill_tokens, job.decode_tokens = 0, 0, 0, 0
                event(s, job.id, "info", "started", f"training started (attempt {job.attempts})", {"attempt": job.attempts})
            job_snapshot = (job.recipe, job.dataset_ids, job.base_model, job.parent_checkpoint_id, job.merge, job.harness, job.run_context)
    if job_snapshot is None:
        settle(trainer, job_id)
        return
    recipe_d, dataset_ids, base_model, parent_id, merge_d, harness_d, context_d = job_snapshot
    with db.session() as s:
        parent = s.get(Checkpoint, parent_id) if parent_id else None
        parent_dir, parent_kind = (artifacts.local_path(parent.uri), parent.kind) if parent is not None else (None, None)
    recipe = Recipe(**recipe_d)
    workdir = Path(tempfile.mkdtemp(prefix=f"{job_id}-", dir=settings.data_dir))
    lease = jobs.Lease(db, TrainingJob, job_id, settings.job_heartbeat_s)

    def on_step(m) -> None:  # noqa: ANN001
        with db.session() as s:
            job = lease.row(s)
            job.steps_done = m.step
            job.trained_tokens += m.tokens
            job.prefill_tokens += m.prefill_tokens
            job.decode_tokens += m.decode_tokens
            job.heartbeat_at = utcnow()
            event(s, job_id, "info", "step", f"step {m.step}/{m.max_steps} loss {m.loss:.4f}",
                  {"step": m.step, "max_steps": m.max_steps, "loss": m.loss, "learning_rate": m.learning_rate,
                   "tokens": m.tokens, "tokens_per_s": m.tokens_per_s, "elapsed_s": m.elapsed_s, **m.extra,
                   **({"prefill_tokens": m.prefill_tokens, "decode_tokens": m.decode_tokens} if m.decode_tokens else {})})

    def on_start(info: dict) -> None:
        with db.session() as s:
            lease.row(s)
            event(s, job_id, "info", "device", f"{info['method']} ({info['adapter']}) on {info['device']}, {info['precision']}, "
                  f"{info['trainable_parameters']:,} trainable parameters", info)

    def on_checkpoint(step: int, path: Path) -> None:
        ckpt_id = new_id("ckpt")
        uri = artifacts.put_dir(settings.artifacts_dir, f"checkpoints/{job_id}/step-{step}", path)
        with db.session() as s:
            job = lease.row(s)
            s.add(Checkpoint(id=ckpt_id, job_id=job_id, run_id=job.run_id, step=step, base_model=base_model, kind=recipe.adapter, uri=uri,
                             metrics={"trained_tokens": job.trained_tokens, "prefill_tokens": job.prefill_tokens, "decode_tokens": job.decode_tokens},
                             created_at=utcnow()))
            event(s, job_id, "info", "checkpoint", f"checkpoint {ckpt_id} at step {step}", {"checkpoint": ckpt_id, "step": step})

    def should_stop() -> bool:
        if lease.lost.is_set():
            return True
        with db.session() as s:
            return bool(s.get(TrainingJob, job_id).cancel_requested)  # type: ignore[union-attr]

    try:
        with lease:
            if merge_d is not None:
                from trainer_service.methods.merge import MergeStopped

                try:
                    if resume is None:  # else an earlier attempt wrote the merged checkpoint: nothing left to do
                        _merge(trainer, base_model, recipe.adapter, MergeSpec(**merge_d), workdir / "step-1", should_stop)
                        on_checkpoint(1, workdir / "step-1")
                    with db.session() as s:
                        lease.row(s).steps_done = 1
                    outcome, error = "succeeded", None
                except MergeStopped:
                    outcome, error = "cancelled", None
            else:
                with db.session() as s:  # validated again: a dataset stored under older rules fails the job, not the worker
                    datasets = [s.get(Dataset, d) for d in dataset_ids]
                    method = method_of(recipe)
                    if method.spec.rewarded:
                        rows, method = _rewarded(trainer, base_model, datasets, recipe, harness_d, context_d)
                    else:
                        rows = dataset_rows(datasets, recipe).rows  # type: ignore[arg-type]
                result = train(
                    base_model_dir(base_model, settings.models_dir), method, rows, train_config(recipe), workdir,
                    init_adapter=parent_dir if parent_kind == "lora" else None, init_weights=parent_dir if parent_kind == "full" else None,
                    resume=resume, on_start=on_start, on_step=on_step, on_checkpoint=on_checkpoint, should_stop=should_stop,
                )
                outcome, error = ("cancelled" if result.stopped else "succeeded"), None
    except jobs.LeaseLost:
        outcome, error = None, None
    except Exception as exc:  # the job fails; the worker lives on
        log.exception("training job failed", job_id=job_id)
        outcome, error = "failed", f"{exc.__class__.__name__}: {exc}"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if outcome is None or lease.lost.is_set():
        log.warning("lease lost; leaving the job to its new owner", job_id=job_id)
        return
    with db.session() as s:
        job = jobs.owned_row(s, TrainingJob, job_id)
        if job is None:
            return
        finish(s, job, outcome, error)
    settle(trainer, job_id)


def _rewarded(trainer: Trainer, base_model: str, datasets: list[Dataset], recipe: Recipe, harness_d: dict | None,
              context_d: dict | None) -> tuple[list, Any]:
    """A rewarded (GRPO) job's rows (its ``prompt_only`` datasets, or the training pool as its harness renders it, read again
    from the grader) and its method's step, built with the reward (``trainer_service.methods.grpo.Reward``): the grader's
    scores for the run the job was created for."""
    from trainer_service.rewards import grpo_rows, reward_function

    ctx, harness = RunContext(**context_d or {}), Harness(**harness_d) if harness_d else None
    rows = grpo_rows(trainer, ctx, harness, datasets, recipe).rows
    return rows, type(method_of(recipe))(reward_function(trainer, ctx, harness, tokenizer(base_model, trainer.settings.models_dir)))


def _merge(trainer: Trainer, base_model: str, kind: str, spec: MergeSpec, out: Path, should_stop: Callable[[], bool]) -> None:
    """Run a merge job's combination of its ``kind`` checkpoints into ``out`` (``methods.merge.merge_checkpoints``,
    stopped by ``should_stop``); a merge job's ``recipe.adapter`` is its checkpoints' kind."""
    from trainer_service.methods.merge import merge_checkpoints

    with trainer.db.session() as s:
        folders = [artifacts.local_path(s.get(Checkpoint, c).uri) for c in spec.checkpoints]  # type: ignore[union-attr]
    merge_checkpoints(base_model_dir(base_model, trainer.settings.models_dir), kind, folders, spec.resolved_weights(), spec.combination,
                      spec.density, spec.seed, out, should_stop)


def reconcile(trainer: Trainer) -> jobs.ReconcileReport:
    """One reconciler round over training jobs (see ``services.common.jobs.reconcile``).

    Runs every ``reconcile_interval_s`` in the trainer service and once when a train worker starts. A job
    whose worker is gone is queued again (it resumes from its newest checkpoint), or cancelled if a cancel
    was asked for; one past ``train_time_limit_s`` fails with its hold settled for the tokens it trained; a
    queued job whose message may be lost is sent again; a finished job whose hold is still open is settled.
    """
    db, settings = trainer.db, trainer.settings

    def requeued(s: Session, job: TrainingJob) -> None:
        event(s, job.id, "warn", "worker_lost", f"the worker running this job ({job.attempts} attempt(s) so far) stopped; "
              "the job is queued again and resumes from its newest checkpoint")

    def failed(s: Session, job: TrainingJob, reason: str) -> None:
        finish(s, job, "failed", reason)

    report = jobs.reconcile(db, TrainingJob, settings.reconcile_policy(settings.train_time_limit_s),
                            send=trainer.enqueue, on_requeue=requeued, on_fail=failed, after_fail=partial(settle, trainer))
    with db.session() as s:  # cancelled while its worker was lost: nobody will claim it to notice
        doomed = s.scalars(select(TrainingJob.id).where(TrainingJob.status == "queued", TrainingJob.cancel_requested.is_(True))).all()
    for job_id in doomed:
        with db.session() as s:
            job = s.get(TrainingJob, job_id, with_for_update=True)
            if job is None or job.status != "queued":
                continue
            finish(s, job, "cancelled", None)
        settle_cancelled(trainer, job_id)
    return report

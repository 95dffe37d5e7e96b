"""The worker's side of training jobs: running one to its end (``run_job``, called by the Celery task in
``tasks.py``) and taking back jobs a dead worker left behind (``reconcile``, in the service and at worker start).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from pydantic import TypeAdapter
from sqlalchemy.orm import Session
from trainer_service import repository
from trainer_service.distributed import DeviceLost, train
from trainer_service.estimate import dataset_rows, job_devices, method_of, tokenizer, train_config
from trainer_service.jobs import end_live_requests, finish, settle, settle_cancelled, workdir
from trainer_service.models import Dataset, TrainingJob
from trainer_service.service import Trainer

from services.common import artifacts, jobs
from services.common.auth import RunContext
from services.common.contracts import Harness, MergeSpec, Recipe
from services.common.db import utcnow
from services.common.graders import Grader
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
    the training tokens (per step, in checkpoints, settled). A job on several devices that loses one
    (``distributed.DeviceLost``) is queued again and resumes from its newest checkpoint, up to ``job_max_attempts``
    attempts, then fails.
    """
    if not jobs.claim(trainer.db, TrainingJob, job_id):
        return
    with trainer.db.session() as s:
        method = repository.training_job(s, job_id).method  # type: ignore[union-attr]
    if method == "primitives":  # a live model of Tinker's primitives: served while its client's requests come
        from trainer_service.live import serve

        serve(trainer, job_id)
        return
    run = _JobRun.start(trainer, job_id)
    if run is None:  # cancelled while queued
        settle(trainer, job_id)
        return
    try:
        with run.lease:
            outcome, error = run.merge() if run.merge_d is not None else run.train()
    except jobs.LeaseLost:
        outcome, error = None, None
    except DeviceLost as exc:  # a process of a job on several devices died: resumed as when a worker dies
        log.warning("training job lost a device", job_id=job_id, error=str(exc))
        outcome, error = "device_lost", str(exc)
    except Exception as exc:  # the job fails; the worker lives on
        log.exception("training job failed", job_id=job_id)
        outcome, error = "failed", f"{exc.__class__.__name__}: {exc}"
    finally:
        shutil.rmtree(run.workdir, ignore_errors=True)
    if outcome is None or run.lease.lost.is_set():
        log.warning("lease lost; leaving the job to its new owner", job_id=job_id)
        return
    if outcome == "device_lost" and _queue_again(trainer, job_id, error or ""):
        return
    with trainer.db.session() as s:
        job = jobs.owned_row(s, TrainingJob, job_id)
        if job is None:
            return
        finish(s, job, "failed" if outcome == "device_lost" else outcome, error)
    settle(trainer, job_id)


def _queue_again(trainer: Trainer, job_id: str, reason: str) -> bool:
    """Hand a job that lost a device back to the queue, as the reconciler does a job whose worker died: its next attempt
    resumes from its newest checkpoint (charged from that checkpoint's tokens). False, and nothing changed, once it has
    had ``job_max_attempts`` attempts (the caller fails it) or when it no longer runs here."""
    with trainer.db.session() as s:
        job = jobs.owned_row(s, TrainingJob, job_id)
        if job is None or job.attempts >= trainer.settings.job_max_attempts:
            return False
        job.status, job.worker_id, job.enqueued_at = "queued", None, utcnow()
        repository.add_event(s, job.id, "warn", "device_lost", f"{reason}; the job is queued again and resumes from its newest checkpoint "
                             f"(attempt {job.attempts} of {trainer.settings.job_max_attempts})", {"attempt": job.attempts})
    trainer.enqueue(job_id)
    return True


@dataclass
class _JobRun:
    """One claimed job as this worker runs it: what it trains (``recipe``, ``base_model``, the datasets, a parent
    checkpoint) or merges (``merge_d``, its ``MergeSpec``), the checkpoint it resumes from (``resume``), its working directory and lease;
    its methods are the training loop's callbacks (progress, checkpoints, cancellation) and the two kinds of work."""

    trainer: Trainer
    job_id: str
    recipe: Recipe
    base_model: str
    dataset_ids: list[str]
    parent_dir: Path | None
    parent_kind: str | None
    merge_d: dict | None
    harness_d: dict | None
    grader_d: dict | None
    context_d: dict | None
    resume: Path | None
    workdir: Path
    lease: jobs.Lease

    @classmethod
    def start(cls, trainer: Trainer, job_id: str) -> _JobRun | None:
        """The claimed job, set to start or resume: ``None`` (and the job ``cancelled``) if it was cancelled while queued.
        A job with checkpoints resumes from its newest, its token counts reset to that checkpoint's (no step is charged
        twice); an event says which."""
        db, settings = trainer.db, trainer.settings
        with db.session() as s:
            job = repository.training_job(s, job_id)
            if job.cancel_requested:
                finish(s, job, "cancelled", None)
                return None
            latest = repository.latest_checkpoint(s, job_id)
            if latest is not None:
                job.steps_done = latest.step
                job.trained_tokens = int(latest.metrics.get("trained_tokens", job.trained_tokens))
                job.prefill_tokens = int(latest.metrics.get("prefill_tokens", 0))
                job.decode_tokens = int(latest.metrics.get("decode_tokens", 0))
                repository.add_event(s, job.id, "warn", "resumed", f"attempt {job.attempts}: resuming from checkpoint {latest.id} at step {latest.step}",
                                     {"step": latest.step, "checkpoint": latest.id, "attempt": job.attempts})
            else:
                job.steps_done, job.trained_tokens, job.prefill_tokens, job.decode_tokens = 0, 0, 0, 0
                repository.add_event(s, job.id, "info", "started", f"training started (attempt {job.attempts})", {"attempt": job.attempts})
            parent = repository.checkpoint(s, job.parent_checkpoint_id) if job.parent_checkpoint_id else None
            return cls(trainer=trainer, job_id=job_id, recipe=Recipe(**job.recipe), base_model=job.base_model, dataset_ids=list(job.dataset_ids),
                       parent_dir=artifacts.local_path(parent.uri) if parent is not None else None, parent_kind=parent.kind if parent is not None else None,
                       merge_d=job.merge, harness_d=job.harness, grader_d=job.grader, context_d=job.run_context,
                       resume=artifacts.local_path(latest.uri) if latest is not None else None,
                       workdir=workdir(settings, job_id),
                       lease=jobs.Lease(db, TrainingJob, job_id, settings.job_heartbeat_s))

    def train(self) -> tuple[str, None]:
        """Train (from ``resume`` if set) to the recipe's last step or a stop: ``("succeeded" | "cancelled", None)``. The
        datasets are validated again: one stored under older rules fails the job, not the worker."""

        with self.trainer.db.session() as s:
            datasets = repository.datasets(s, self.dataset_ids)
            method = method_of(self.recipe)
            if method.spec.rewarded:
                rows, method = _rewarded(self.trainer, self.base_model, datasets, self.recipe, self.harness_d, self.grader_d, self.context_d)
            else:
                rows = dataset_rows(datasets, self.recipe).rows  # type: ignore[arg-type]
        result = train(
            base_model_dir(self.base_model, self.trainer.settings.models_dir), method, rows, train_config(self.recipe), self.workdir,
            devices=job_devices(self.trainer.settings, self.recipe, refuse=False), init_adapter=self.parent_dir if self.parent_kind == "lora" else None, init_weights=self.parent_dir if self.parent_kind == "full" else None,
            resume=self.resume, on_start=self.on_start, on_step=self.on_step, on_checkpoint=self.on_checkpoint, should_stop=self.should_stop,
        )
        return ("cancelled" if result.stopped else "succeeded"), None

    def merge(self) -> tuple[str, None]:
        """Write the merged checkpoint (step 1) unless an earlier attempt did: ``("succeeded" | "cancelled", None)``."""
        from trainer_service.methods.merge import MergeStopped

        try:
            if self.resume is None:  # else an earlier attempt wrote the merged checkpoint: nothing left to do
                _merge(self.trainer, self.base_model, self.recipe.adapter, MergeSpec(**self.merge_d or {}), self.workdir / "step-1",
                       self.should_stop)
                self.on_checkpoint(1, self.workdir / "step-1")
            with self.trainer.db.session() as s:
                self.lease.row(s).steps_done = 1
        except MergeStopped:
            return "cancelled", None
        return "succeeded", None

    def on_start(self, info: dict) -> None:
        """Record the device, precision and trainable parameters the loop runs with."""
        with self.trainer.db.session() as s:
            self.lease.row(s)
            on = f"{info['device']} ({info['parallelism']})" if info.get("parallelism") else info["device"]
            repository.add_event(s, self.job_id, "info", "device", f"{info['method']} ({info['adapter']}) on {on}, {info['precision']}, "
                                 f"{info['trainable_parameters']:,} trainable parameters", info)

    def on_step(self, m: Any) -> None:
        """Count a step's tokens on the job (charged at settle) and record its loss, learning rate and speed."""
        with self.trainer.db.session() as s:
            job = self.lease.row(s)
            job.steps_done = m.step
            job.trained_tokens += m.tokens
            job.prefill_tokens += m.prefill_tokens
            job.decode_tokens += m.decode_tokens
            job.heartbeat_at = utcnow()
            repository.add_event(s, self.job_id, "info", "step", f"step {m.step}/{m.max_steps} loss {m.loss:.4f}",
                                 {"step": m.step, "max_steps": m.max_steps, "loss": m.loss, "learning_rate": m.learning_rate,
                                  "tokens": m.tokens, "tokens_per_s": m.tokens_per_s, "elapsed_s": m.elapsed_s, **m.extra,
                                  **({"prefill_tokens": m.prefill_tokens, "decode_tokens": m.decode_tokens} if m.decode_tokens else {})})

    def on_checkpoint(self, step: int, path: Path) -> None:
        """Store the checkpoint folder as an artifact and record it with the job's token counts (a resume restarts from them)."""
        ckpt_id = new_id("ckpt")
        uri = artifacts.put_dir(self.trainer.settings.artifacts_dir, f"checkpoints/{self.job_id}/step-{step}", path)
        with self.trainer.db.session() as s:
            job = self.lease.row(s)
            repository.add_checkpoint(s, job, ckpt_id, step=step, kind=self.recipe.adapter, uri=uri,
                                      metrics={"trained_tokens": job.trained_tokens, "prefill_tokens": job.prefill_tokens, "decode_tokens": job.decode_tokens})
            repository.add_event(s, self.job_id, "info", "checkpoint", f"checkpoint {ckpt_id} at step {step}", {"checkpoint": ckpt_id, "step": step})

    def should_stop(self) -> bool:
        """The lease is lost, or the job's cancellation was asked for."""
        if self.lease.lost.is_set():
            return True
        with self.trainer.db.session() as s:
            return bool(repository.training_job(s, self.job_id).cancel_requested)  # type: ignore[union-attr]


def _rewarded(trainer: Trainer, base_model: str, datasets: list[Dataset], recipe: Recipe, harness_d: dict | None, grader_d: dict | None,
              context_d: dict | None) -> tuple[list, Any]:
    """A rewarded (GRPO) job's rows (its ``prompt_only`` datasets, or the training pool as its harness renders it, read again
    from the grader) and its method's step, built with the reward (``trainer_service.methods.grpo.Reward``): the grader
    service's scores for the run the job was created for, by the suite's scorer or by the job's grader spec."""
    from trainer_service.rewards import grpo_rows, reward_function

    ctx, harness = RunContext(**context_d or {}), Harness(**harness_d) if harness_d else None
    grader = TypeAdapter(Grader).validate_python(grader_d) if grader_d else None
    rows = grpo_rows(trainer, ctx, harness, grader, datasets, recipe).rows
    return rows, type(method_of(recipe))(reward_function(trainer, ctx, harness, grader, tokenizer(base_model, trainer.settings.models_dir)))


def _merge(trainer: Trainer, base_model: str, kind: str, spec: MergeSpec, out: Path, should_stop: Callable[[], bool]) -> None:
    """Run a merge job's combination of its ``kind`` checkpoints into ``out`` (``methods.merge.merge_checkpoints``,
    stopped by ``should_stop``); a merge job's ``recipe.adapter`` is its checkpoints' kind."""
    from trainer_service.methods.merge import merge_checkpoints

    with trainer.db.session() as s:
        folders = [artifacts.local_path(repository.checkpoint(s, c).uri) for c in spec.checkpoints]  # type: ignore[union-attr]
    merge_checkpoints(base_model_dir(base_model, trainer.settings.models_dir), kind, folders, spec.resolved_weights(), spec.combination,
                      spec.density, spec.seed, out, should_stop)


def reconcile(trainer: Trainer) -> jobs.ReconcileReport:
    """One reconciler round over training jobs (see ``services.common.jobs.reconcile``).

    Runs every ``reconcile_interval_s`` in the trainer service and once when a train worker starts. A job
    whose worker is gone is queued again (it resumes from its newest checkpoint), or cancelled if a cancel
    was asked for; one past ``train_time_limit_s`` fails with its hold settled for the tokens it trained; a
    queued job whose message may be lost is sent again; a finished job whose hold is still open is settled (and a live
    model's requests still waiting when its job ended are failed, their holds released); a live
    model of Tinker's primitives let go by its worker while a request of it was being stored is sent to a worker again.
    """
    db, settings = trainer.db, trainer.settings

    def requeued(s: Session, job: TrainingJob) -> None:
        repository.add_event(s, job.id, "warn", "worker_lost", f"the worker running this job ({job.attempts} attempt(s) so far) stopped; "
                             "the job is queued again and resumes from its newest checkpoint")

    def failed(s: Session, job: TrainingJob, reason: str) -> None:
        finish(s, job, "failed", reason)

    def ended(job_id: str) -> None:
        settle(trainer, job_id)
        end_live_requests(trainer, job_id)

    report = jobs.reconcile(db, TrainingJob, settings.reconcile_policy(settings.train_time_limit_s),
                            send=trainer.enqueue, on_requeue=requeued, on_fail=failed, after_fail=ended)
    with db.session() as s:  # cancelled while its worker was lost: nobody will claim it to notice
        doomed = repository.queued_jobs_to_cancel(s)
    for job_id in doomed:
        with db.session() as s:
            job = repository.training_job(s, job_id, lock=True)
            if job is None or job.status != "queued":
                continue
            finish(s, job, "cancelled", None)
        settle_cancelled(trainer, job_id)
        end_live_requests(trainer, job_id)  # its live model's requests that were waiting: failed, their holds released
    with db.session() as s:  # a request stored as its live model's job ended (a race the submit's check cannot close on SQLite)
        ended = repository.ended_live_jobs_with_requests(s)
    for job_id in ended:
        end_live_requests(trainer, job_id)
    with db.session() as s:
        stranded = repository.paused_live_jobs_with_requests(s)
        for job_id in stranded:
            job = repository.training_job(s, job_id, lock=True)
            if job is not None and job.status == "paused":
                job.status, job.enqueued_at = "queued", utcnow()
    for job_id in stranded:
        trainer.enqueue(job_id)
    return report

"""Celery tasks of the trainer (queue ``train``). A message carries only the job id."""

from __future__ import annotations

from celery.signals import worker_ready

from services.common.celery_app import make_celery
from services.common.settings import ServiceSettings

celery = make_celery("trainer", ServiceSettings(), queue="train")


@celery.task(name="trainer.run_training_job")
def run_training_job(job_id: str) -> None:
    """Run training job ``job_id`` (state lives in the trainer database)."""
    from trainer_service.service import run_job

    run_job(job_id)


def enqueue_training(job_id: str) -> None:
    """Queue job ``job_id`` on the ``train`` queue."""
    run_training_job.apply_async(args=[job_id], queue="train")


@worker_ready.connect
def _reconcile(**_kwargs: object) -> None:
    """On worker start, take back jobs a dead worker left behind (see ``service.reconcile``)."""
    from trainer_service.service import reconcile

    reconcile()

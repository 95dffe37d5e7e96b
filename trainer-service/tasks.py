"""Celery tasks of the trainer (queue ``train``; ``celery -A trainer_service.tasks worker``): thin wrappers over
``trainer_service.worker``. A message carries only the job id; the service sends it by task name
(``service.TRAIN_TASK``), so nothing imports this module but the worker.
"""

from __future__ import annotations

from celery.signals import worker_ready
from trainer_service import worker
from trainer_service.jobs import reap_workdirs
from trainer_service.service import TRAIN_TASK, Trainer, job_queue

from services.common.lazy import once
from services.common.settings import ServiceSettings

settings = ServiceSettings()
celery = job_queue(settings)
trainer = once(lambda: Trainer.from_settings(settings, celery))
"""This worker process's :class:`Trainer`, built on first use; it sends jobs through this Celery app."""


@celery.task(name=TRAIN_TASK)
def run_training_job(job_id: str) -> None:
    """Run training job ``job_id`` (state lives in the trainer database)."""
    worker.run_job(trainer(), job_id)


@worker_ready.connect
def _reconcile(**_kwargs: object) -> None:
    """On worker start, take back jobs a dead worker left behind (see ``worker.reconcile``) and remove the work folders
    dead workers left (``jobs.reap_workdirs``)."""
    reap_workdirs(trainer().settings)
    worker.reconcile(trainer())

"""Celery tasks of the grader (queue ``eval``). A message carries only the evaluation id."""

from __future__ import annotations

from celery.signals import worker_ready

from services.common.celery_app import make_celery
from services.common.settings import ServiceSettings

celery = make_celery("grader", ServiceSettings(), queue="eval")


@celery.task(name="grader.run_evaluation")
def run_evaluation(eval_id: str) -> None:
    """Run evaluation ``eval_id`` (state lives in the grader database)."""
    from grader.service import run_evaluation as run

    run(eval_id)


def enqueue_evaluation(eval_id: str) -> None:
    """Queue evaluation ``eval_id`` on the ``eval`` queue."""
    run_evaluation.apply_async(args=[eval_id], queue="eval")


@worker_ready.connect
def _reconcile(**_kwargs: object) -> None:
    """On worker start, take back evaluations a dead worker left behind (see ``service.reconcile``)."""
    from grader.service import reconcile

    reconcile()

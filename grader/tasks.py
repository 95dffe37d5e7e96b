"""Celery tasks of the grader (queue ``eval``; ``celery -A grader.tasks worker``): thin wrappers over
:mod:`grader.worker`. A message carries only the evaluation id; the grader sends it by task name
(``service.EVAL_TASK``), so nothing imports this module but the worker.
"""

from __future__ import annotations

from celery.signals import worker_ready

from grader import grading_tasks, imports, worker
from grader.sandboxes import get_sandbox
from grader.service import BUILD_TASK, EVAL_TASK, IMPORT_TASK, Grader, evaluation_queue
from grader.settings import GraderSettings
from services.common.lazy import once
from services.common.settings import ServiceSettings

celery = evaluation_queue(ServiceSettings())
grader = once(lambda: Grader.from_settings(GraderSettings(), celery))
"""This worker process's :class:`Grader`, built on first use (its settings hold the test seed); it sends evaluations
through this Celery app."""


@celery.task(name=EVAL_TASK)
def run_evaluation(eval_id: str) -> None:
    """Run evaluation ``eval_id`` (state lives in the grader database)."""
    worker.run_evaluation(grader(), eval_id)


@celery.task(name=IMPORT_TASK)
def validate_import(name: str) -> None:
    """Validate imported collection ``name``'s pending tasks in the sandbox (:func:`grader.imports.validate_collection`)."""
    imports.validate_collection(grader(), name, get_sandbox(grader().settings.sandbox_backend), worker.model_endpoint(grader()))


@celery.task(name=BUILD_TASK)
def build_splits(task_id: str) -> None:
    """Build registered task ``task_id``'s splits and queue its baselines (:func:`grader.grading_tasks.build_splits`)."""
    grading_tasks.build_splits(grader(), task_id)


@worker_ready.connect
def _reconcile(**_kwargs: object) -> None:
    """On worker start, remove the sandboxes a dead worker left (see ``worker.reap_sandboxes``) and take back its
    evaluations (see ``worker.reconcile``), the split builds (``worker.reconcile_builds``) and the imported collections it left half validated."""
    worker.reap_sandboxes(grader())
    worker.reconcile(grader())
    worker.reconcile_builds(grader())
    for name in grader().store.pending_collections():  # a validation a dead worker left
        grader().enqueue_import(name)

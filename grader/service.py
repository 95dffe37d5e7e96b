"""The grader's service object: its settings, database, hidden test store, the clients of the services it calls and
its evaluation queue, one per process.

The app's lifespan builds one from its settings (``app.state.grader``, handed to routes by ``Depends``); an eval
worker builds one when its first task runs (:data:`grader.tasks.grader`). The logic takes it as its first
argument: :mod:`grader.grading_tasks` (registering a task: its splits and baselines; its status, training pool and
validation items), :mod:`grader.evaluations` (admission under the limits, listing), :mod:`grader.scoring`
(estimators, intervals, one answer's score), :mod:`grader.worker` (running an evaluation, closing its hold, the
reconciler) and :mod:`grader.submissions` (final submissions, the leaderboard); every query of the grader's database
is in :mod:`grader.repository` (the hidden test store's in :mod:`grader.teststore`). No HTTP in any of them; errors are ``services.common.errors`` exceptions.

Validation evaluations are charged to the run (a hold for the worst case, each completion charged against it, the
rest released); official test grading is not charged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from celery import Celery
from inference_service.client import InferenceClient

from grader.settings import GraderSettings
from grader.suites import Item
from grader.teststore import TestStore
from services.common.celery_app import make_celery
from services.common.db import Database, migrate
from services.common.settings import ServiceSettings
from services.ledger.client import LedgerClient

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
"""The service's Alembic scripts (its database is migrated when its service object is built)."""

EVAL_QUEUE = "eval"
EVAL_TASK = "grader.run_evaluation"
"""The Celery task that runs one evaluation; its only argument is the evaluation id."""
IMPORT_TASK = "grader.validate_import"
"""The Celery task that validates an imported task collection in the sandbox; its only argument is the collection's name."""
BUILD_TASK = "grader.build_splits"
"""The Celery task that builds a registered task's splits and queues its baselines; its only argument is the task id."""


def evaluation_queue(settings: ServiceSettings) -> Celery:
    """The grader's Celery app on the configured broker, whose tasks default to the ``eval`` queue."""
    return make_celery("grader", settings, queue=EVAL_QUEUE)


def _no_queue(collection: str) -> None:
    raise RuntimeError(f"this grader has no queue to validate the imported collection {collection!r} on")


@dataclass
class Grader:
    """What the grader's logic works with: ``settings``, its ``db``, the hidden test ``store``, the ``ledger`` it holds
    validation budget on, the ``inference`` that answers for the evaluated
    systems, and ``enqueue(eval_id)``, which sends an evaluation to the eval workers (by task name; nothing imports
    the tasks), ``enqueue_import(collection)``, which sends an imported collection's validation there, and
    ``enqueue_build(task_id)``, which sends a registered task's split build there (``None``: a grader without a queue, a
    test's or a tool's, builds at once in the registering call). ``train_pools``: task id → its training pool, the last few read (:func:`grader.grading_tasks.train_pool`)."""

    settings: GraderSettings
    db: Database
    store: TestStore
    ledger: LedgerClient
    inference: InferenceClient
    enqueue: Callable[[str], None]
    enqueue_import: Callable[[str], None] = field(default=lambda name: _no_queue(name))
    enqueue_build: Callable[[str], None] | None = None
    train_pools: dict[str, list[Item]] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: GraderSettings, queue: Celery | None = None) -> Grader:
        """The grader of ``settings``: its database (``database_url_for("grader")``) and its test store, both migrated, the
        ledger and inference (``inference_timeout_s``) clients, and an evaluation queue on
        ``queue`` (an eval worker passes its own Celery app; default: a new one on the broker)."""
        queue = queue or evaluation_queue(settings)

        def enqueue(eval_id: str) -> None:
            queue.send_task(EVAL_TASK, args=[eval_id], queue=EVAL_QUEUE)

        def enqueue_import(name: str) -> None:
            queue.send_task(IMPORT_TASK, args=[name], queue=EVAL_QUEUE)

        def enqueue_build(task_id: str) -> None:
            queue.send_task(BUILD_TASK, args=[task_id], queue=EVAL_QUEUE)

        migrate(settings.database_url_for("grader"), MIGRATIONS_DIR)  # an eval worker may start (and reconcile) before the app
        return cls(settings=settings, db=Database(settings.database_url_for("grader")), store=TestStore(settings.test_store_url()),
                   ledger=LedgerClient.connect(settings),
                   inference=InferenceClient.connect(settings, timeout_s=settings.inference_timeout_s), enqueue=enqueue,
                   enqueue_import=enqueue_import, enqueue_build=enqueue_build)

    def close(self) -> None:
        """Close the clients' connections and the databases' pools."""
        for client in (self.ledger, self.inference):
            client.close()
        self.db.engine.dispose()
        self.store.db.engine.dispose()

"""The trainer's service object: its settings, database, ledger client and job queue, one per process.

The app's lifespan builds one from its settings (``app.state.trainer``, handed to routes by ``Depends``), a
train worker builds one when its first task runs (``trainer_service.tasks``). The logic takes it as its first
argument: ``datasets`` (upload and storage), ``estimate`` (token count and budget hold), ``jobs`` (creation,
listing, cancel, settling) and ``worker`` (the training run and the reconciler), their queries in ``repository``.
No HTTP in any of them; errors are ``services.common.errors`` exceptions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from celery import Celery

from grader.client import GraderClient
from services.common.celery_app import make_celery
from services.common.db import Database, migrate
from services.common.settings import ServiceSettings
from services.ledger.client import LedgerClient

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
"""The service's Alembic scripts (its database is migrated when its service object is built)."""

TRAIN_QUEUE = "train"
TRAIN_TASK = "trainer.run_training_job"
"""The Celery task that runs one training job; its only argument is the job id."""


def job_queue(settings: ServiceSettings) -> Celery:
    """The trainer's Celery app on the configured broker, whose tasks default to the ``train`` queue."""
    return make_celery("trainer", settings, queue=TRAIN_QUEUE)


@dataclass
class Trainer:
    """What the trainer's logic works with: ``settings``, its ``db``, the ``ledger`` it holds budget on, the ``grader``
    that renders and rewards GRPO's training-pool prompts (``trainer_service.rewards``), and ``enqueue(job_id)``, which
    sends a job to the train workers (by task name; nothing imports the tasks)."""

    settings: ServiceSettings
    db: Database
    ledger: LedgerClient
    grader: GraderClient
    enqueue: Callable[[str], None]

    @classmethod
    def from_settings(cls, settings: ServiceSettings, queue: Celery | None = None) -> Trainer:
        """The trainer of ``settings``: its database (``database_url_for("trainer")``, migrated), a ledger client, a grader
        client (120 s a call, 3 retries: scoring a step's rollouts), and a job queue on ``queue`` (a train worker passes
        its own Celery app; default: a new one on the broker)."""
        queue = queue or job_queue(settings)

        def enqueue(job_id: str) -> None:
            queue.send_task(TRAIN_TASK, args=[job_id], queue=TRAIN_QUEUE)

        migrate(settings.database_url_for("trainer"), MIGRATIONS_DIR)  # a train worker may start (and reconcile) before the app
        return cls(settings=settings, db=Database(settings.database_url_for("trainer")), ledger=LedgerClient.connect(settings),
                   grader=GraderClient.connect(settings, timeout_s=120, retries=3), enqueue=enqueue)

    def close(self) -> None:
        """Close the clients' connections and the database's pool."""
        self.ledger.close()
        self.grader.close()
        self.db.engine.dispose()

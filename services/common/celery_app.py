"""Celery application factory: the database row is a job's truth, a message only says "work on job X".

Tasks are acknowledged late and requeued if their worker is lost, so a killed worker's job is picked up
again; prefetch is 1 so a long job never sits behind another in a worker's buffer.
"""

from __future__ import annotations

from celery import Celery

from services.common.settings import ServiceSettings


def make_celery(name: str, settings: ServiceSettings, queue: str) -> Celery:
    """A Celery app named ``name`` on the configured broker whose tasks default to ``queue``."""
    broker = settings.broker()
    app = Celery(name, broker=broker)
    if broker.startswith("sqla+sqlite"):
        # kombu passes these to SQLAlchemy's create_engine: wait for SQLite's write lock instead of failing
        app.conf.broker_transport_options = {"connect_args": {"timeout": 30}}
    app.conf.update(
        task_default_queue=queue,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    return app

"""Celery application factory: the database row is a job's truth, a message only says "work on job X".

Tasks are acknowledged late and requeued if their worker is lost, so a killed worker's job is picked up
again; prefetch is 1 so a long job never sits behind another in a worker's buffer.
"""

from __future__ import annotations

import structlog
from celery import Celery
from celery.signals import worker_ready
from prometheus_client import start_http_server

from services.common.settings import ServiceSettings

log = structlog.get_logger("worker")


def make_celery(name: str, settings: ServiceSettings, queue: str) -> Celery:
    """A Celery app named ``name`` on the configured broker whose tasks default to ``queue``. With the setting
    ``worker_metrics_port``, its worker serves the process's Prometheus metrics there once ready (prometheus-client's
    own HTTP server): the worker serves no other HTTP, and its metrics are no rollout's to read."""
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
    if settings.worker_metrics_port is not None:
        worker_ready.connect(lambda **_: serve_worker_metrics(settings), weak=False)
    return app


def serve_worker_metrics(settings: ServiceSettings) -> None:
    """Serve this process's Prometheus metrics at ``http://<worker_metrics_host>:<worker_metrics_port>/metrics``
    (prometheus-client's HTTP server, a daemon thread). Raises ``OSError`` when the port is taken."""
    start_http_server(settings.worker_metrics_port, addr=settings.worker_metrics_host)
    log.info("worker metrics served", url=f"http://{settings.worker_metrics_host}:{settings.worker_metrics_port}/metrics")

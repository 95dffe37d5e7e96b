"""The grader's FastAPI app (``uvicorn grader.app:app``).

On start-up it migrates its database and builds the :class:`grader.service.Grader` (``app.state.grader``); while it
runs, the reconciler takes back evaluations and split builds a dead worker left behind every ``reconcile_interval_s`` seconds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from grader import worker
from grader.api import graders_router, router, training_pool_router
from grader.service import MIGRATIONS_DIR, Grader
from grader.settings import GraderSettings
from services.common.app import create_service_app, databases_ready
from services.common.auth import service_caller
from services.common.db import migrate
from services.common.periodic import Periodic
from services.common.settings import ServiceSettings


def create_app(settings: GraderSettings | None = None, grader: Grader | None = None) -> FastAPI:
    """Build the grader app. When it starts, its database is migrated and its :class:`Grader` built from ``settings``
    (default: read from the environment then, which must hold the test seed), unless ``grader`` is given (a test's,
    its clients on stand-ins; then it is in ``app.state`` at once)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        built = grader or Grader.from_settings(settings or GraderSettings())
        migrate(built.settings.database_url_for("grader"), MIGRATIONS_DIR)
        app.state.grader, app.state.settings = built, built.settings
        rounds = (worker.reconcile, worker.reconcile_builds)  # evaluations, split builds
        loop = Periodic("grader.reconcile", built.settings.reconcile_interval_s, lambda: [r for r in (f(built) for f in rounds) if r]).start()
        try:
            yield
        finally:
            loop.stop()
            if grader is None:
                built.close()

    app = create_service_app(
        "grader", title="Crucible grader", lifespan=lifespan, log_level=(grader.settings if grader else settings or ServiceSettings()).log_level,
        description="Suites, the hidden test-set store, evaluations and submissions. Internal: reached through the gateway.",
        ready=databases_ready(lambda app: ("database", app.state.grader.db), lambda app: ("test store", app.state.grader.store.db)),
        docs_auth=service_caller,
    )
    if grader is not None:
        app.state.grader, app.state.settings = grader, grader.settings
    app.include_router(router)
    app.include_router(training_pool_router)
    app.include_router(graders_router)
    return app


app = create_app()

"""The trainer service's FastAPI app (``uvicorn trainer_service.app:app``).

On start-up it migrates its database and builds its :class:`~trainer_service.service.Trainer`
(``app.state.trainer``); while it runs, the reconciler takes back jobs whose worker is gone every
``CRUCIBLE_RECONCILE_INTERVAL_S`` seconds (``worker.reconcile``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from trainer_service import worker
from trainer_service.api import router
from trainer_service.service import MIGRATIONS_DIR, Trainer

from services.common.app import create_service_app, databases_ready
from services.common.auth import service_caller
from services.common.db import migrate
from services.common.periodic import Periodic
from services.common.settings import ServiceSettings


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    """Build the trainer app; its database, ledger client and job queue are opened when the app starts."""
    settings = settings or ServiceSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        migrate(settings.database_url_for("trainer"), MIGRATIONS_DIR)
        app.state.trainer = trainer = Trainer.from_settings(settings)
        reconciler = Periodic("trainer.reconcile", settings.reconcile_interval_s, lambda: worker.reconcile(trainer)).start()
        try:
            yield
        finally:
            reconciler.stop()
            trainer.close()

    app = create_service_app(
        "trainer", title="Crucible trainer", lifespan=lifespan, log_level=settings.log_level,
        description="Datasets, training jobs, job events and checkpoints. Internal: reached through the gateway.",
        ready=databases_ready(lambda app: ("database", app.state.trainer.db)),
        docs_auth=service_caller,
    )
    app.state.settings = settings
    app.include_router(router)
    return app


app = create_app()

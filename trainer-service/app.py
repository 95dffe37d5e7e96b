"""The trainer service's FastAPI app (``uvicorn trainer_service.app:app``)."""

from __future__ import annotations

from pathlib import Path

from trainer_service import api, service

from services.common.app import create_service_app
from services.common.periodic import Periodic

app = create_service_app(
    "trainer", title="Crucible trainer", migrations=(lambda: service.runtime().db.url, Path(__file__).parent / "migrations"),
    description="Datasets, training jobs, job events and checkpoints. Internal: reached through the gateway.",
    docs_auth=api.auth.caller,
    background=lambda: Periodic("trainer.reconcile", service.runtime().settings.reconcile_interval_s, service.reconcile),
)
app.include_router(api.router)

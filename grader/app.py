"""The grader's FastAPI app (``uvicorn grader.app:app``)."""

from __future__ import annotations

from pathlib import Path

from grader import api, service
from services.common.app import create_service_app
from services.common.periodic import Periodic

app = create_service_app(
    "grader", title="Crucible grader", migrations=(lambda: service.runtime().db.url, Path(__file__).parent / "migrations"),
    description="Suites, the hidden test-set store, evaluations and submissions. Internal: reached through the gateway.",
    docs_auth=api.auth.caller,
    background=lambda: Periodic("grader.reconcile", service.runtime().settings.reconcile_interval_s, service.reconcile),
)
app.include_router(api.router)

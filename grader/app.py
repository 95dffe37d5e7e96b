"""The grader's FastAPI app (``uvicorn grader.app:app``)."""

from __future__ import annotations

from pathlib import Path

from grader import api, service
from services.common.app import create_service_app

app = create_service_app(
    "grader", title="Crucible grader", migrations=(lambda: service.runtime().db.url, Path(__file__).parent / "migrations"),
    description="Suites, the hidden test-set store, evaluations and submissions. Internal: reached through the gateway.",
)
app.include_router(api.router)

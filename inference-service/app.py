"""The inference service's FastAPI app (``uvicorn inference_service.app:app``)."""

from __future__ import annotations

from pathlib import Path

from inference_service import api, service

from services.common.app import create_service_app

app = create_service_app(
    "inference", title="Crucible inference",
    migrations=(lambda: service.runtime().db.url, Path(__file__).parent / "migrations"), on_startup=service.load_engines,
    description="Model registry (base models and run checkpoints) and OpenAI-compatible chat completions, metered on the ledger.",
    health=lambda: {"models": sorted(service.runtime().batchers)},
    docs_auth=api.auth.caller,
)
app.include_router(api.router)

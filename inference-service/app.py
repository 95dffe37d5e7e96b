"""The inference service's FastAPI app (``uvicorn inference_service.app:app``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from inference_service import api, service

from services.common.app import create_service_app
from services.common.db import migrate


@asynccontextmanager
async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
    rt = service.runtime()
    migrate(rt.db.url, Path(__file__).parent / "migrations")
    service.load_engines()
    yield


app = create_service_app(
    "inference", title="Crucible inference", lifespan=lifespan,
    description="Model registry (base models and run checkpoints) and OpenAI-compatible chat completions, metered on the ledger.",
    health=lambda: {"models": sorted(service.runtime().batchers)},
)
app.include_router(api.router)

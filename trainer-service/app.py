"""The trainer service's FastAPI app (``uvicorn trainer_service.app:app``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from trainer_service import api, service

from services.common.app import create_service_app
from services.common.db import migrate


@asynccontextmanager
async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
    rt = service.runtime()
    migrate(rt.db.url, Path(__file__).parent / "migrations")
    yield


app = create_service_app(
    "trainer", title="Crucible trainer", lifespan=lifespan,
    description="Datasets, training jobs, job events and checkpoints. Internal: reached through the gateway.",
)
app.include_router(api.router)

"""The inference service's FastAPI app (``uvicorn inference_service.app:app``).

On start-up it migrates its database, connects its ledger and trainer clients, loads one engine per prepared base
model (the registry in the models folder) and puts the prepared models' card prices on the ledger's table (in the
background, once the ledger answers); on shutdown it stops the engines and closes the clients.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from inference_service.api import router
from inference_service.prices import register_prices_soon
from inference_service.service import Inference
from inference_service.settings import InferenceSettings
from trainer_service.client import TrainerClient

from services.common.app import create_service_app, databases_ready
from services.common.auth import service_caller
from services.common.db import Database, migrate
from services.ledger.client import LedgerClient

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


def create_app(settings: InferenceSettings | None = None) -> FastAPI:
    """Build the inference app; its database, clients and engines are opened when the app starts."""
    settings = settings or InferenceSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = settings.database_url_for("inference")
        migrate(url, MIGRATIONS_DIR)
        app.state.inference = inference = Inference(settings=settings, db=Database(url), ledger=LedgerClient.connect(settings),
                                                    trainer=TrainerClient.connect(settings))
        inference.load_engines()
        register_prices_soon(inference.ledger, [card for card in inference.cards.values() if card.prices])
        try:
            yield
        finally:
            await inference.aclose()

    def health() -> dict[str, Any]:  # no model names: /healthz needs no token, and the evaluator track hides its candidates' models
        return {"engine": settings.engine}

    app = create_service_app(
        "inference", title="Crucible inference",
        description="Model registry (base models and run checkpoints) and OpenAI-compatible chat and text completions (streamed or not), "
                    "metered on the ledger, on the configured engine.",
        lifespan=lifespan,
        log_level=settings.log_level,
        health=health,
        ready=databases_ready(lambda app: ("database", app.state.inference.db)),  # its engines are loaded before it answers
        docs_auth=service_caller,
    )
    app.state.settings = settings
    app.include_router(router)
    return app


app = create_app()

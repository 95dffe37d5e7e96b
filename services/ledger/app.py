"""The ledger service app: ``uvicorn services.ledger.app:app`` (port 8001 in the embedded mode).

On start-up it migrates its database to the newest revision and loads the price table (``prices.yaml`` with the
registered models' rows); while it runs, a sweep releases expired holds every ``CRUCIBLE_LEDGER_HOLD_SWEEP_S`` seconds
and the registered models' prices are read again as often.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from services.common.app import create_service_app, databases_ready
from services.common.auth import service_caller
from services.common.db import Database, migrate
from services.common.periodic import Periodic
from services.ledger.api import router
from services.ledger.pricing import load_prices
from services.ledger.service import Ledger
from services.ledger.settings import LedgerSettings

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


def create_app(settings: LedgerSettings | None = None) -> FastAPI:
    """Build the ledger app; its database and price table are opened when the app starts."""
    settings = settings or LedgerSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        prices = load_prices(settings.ledger_prices)
        url = settings.database_url_for("ledger")
        migrate(url, MIGRATIONS_DIR)
        db = Database(url)
        app.state.ledger = ledger = Ledger(db, prices)
        ledger.reload_prices()
        sweep = Periodic("ledger.expire_holds", settings.ledger_hold_sweep_s, ledger.expire_holds).start()
        # registered models' prices (PUT /internal/prices/models/…) reach every replica within a sweep
        reload = Periodic("ledger.reload_prices", settings.ledger_hold_sweep_s, ledger.reload_prices).start()
        try:
            yield
        finally:
            reload.stop()
            sweep.stop()
            ledger.close()
            db.engine.dispose()

    def health() -> dict[str, Any]:
        ledger = getattr(app.state, "ledger", None)
        return {"price_version": ledger.prices.version if ledger else None}

    app = create_service_app(
        "ledger",
        title="Crucible budget ledger",
        description="Accounts, holds, append-only entries, the price table and usage events (internal).",
        lifespan=lifespan,
        log_level=settings.log_level,
        health=health,
        ready=databases_ready(lambda app: ("database", app.state.ledger.db)),
        docs_auth=service_caller,
    )
    app.state.settings = settings
    app.include_router(router)
    return app


app = create_app()

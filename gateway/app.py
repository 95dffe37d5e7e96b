"""The gateway's FastAPI app (``uvicorn gateway.app:app``): the only published service.

On start-up it reads its settings (unless given), migrates its database to the newest revision and builds
the :class:`~gateway.service.Gateway` (database, rate limiter, clients of the four services) into
``app.state.gateway``, where the routes find it, and starts the MCP endpoint (``/mcp``, :mod:`gateway.mcp`); on
shutdown it closes them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request

from gateway import api, tinker
from gateway.mcp import MCPEndpoint
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from services.common.app import create_service_app
from services.common.db import migrate

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    """Build the gateway app. ``settings``: ``None`` reads them from the environment when the app starts
    (``CRUCIBLE_ADMIN_KEY`` is required then, not when this module is imported)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        s = settings or GatewaySettings()
        migrate(s.database_url_for("gateway"), MIGRATIONS_DIR)
        app.state.gateway = gateway = Gateway.from_settings(s)
        try:
            async with mcp.run():
                yield
        finally:
            await mcp.aclose()
            await gateway.close()

    def metrics_auth(request: Request) -> None:
        api.admin(request.app.state.gateway, request.headers.get("authorization"))

    app = create_service_app(
        "gateway", title="Crucible", lifespan=lifespan, metrics_auth=metrics_auth, ready=lambda app: app.state.gateway.unready(),
        description=(
            "The agent-facing API of Crucible. Research agents authenticate with their run's API key "
            "(`Authorization: Bearer crk_…`); operators use the admin key on `/admin`. Errors are RFC 9457 problem+json."
        ),
    )
    api.episode_middleware(app)
    app.include_router(api.agent_router)
    app.include_router(api.openai_router)
    app.include_router(tinker.router)
    app.include_router(api.admin_router)
    app.include_router(api.public_router)
    mcp = MCPEndpoint(app)  # the same API as MCP tools, for coding agents (streamable HTTP; gateway.mcp)
    app.state.mcp = mcp
    app.router.add_route("/mcp", mcp, methods=["POST"], include_in_schema=False)
    return app


app = create_app()

"""The gateway's FastAPI app (``uvicorn gateway.app:app``): the only published service."""

from __future__ import annotations

from pathlib import Path

from fastapi.templating import Jinja2Templates

from gateway import api, service
from services.common.app import create_service_app

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")

app = create_service_app(
    "gateway", title="Crucible", migrations=(lambda: service.runtime().db.url, Path(__file__).parent / "migrations"),
    metrics_auth=lambda request: api.admin(request.headers.get("authorization")),
    description=(
        "The agent-facing API of Crucible. Research agents authenticate with their run's API key "
        "(`Authorization: Bearer crk_…`); operators use the admin key on `/admin`. Errors are RFC 9457 problem+json."
    ),
)
api.episode_middleware(app)
app.include_router(api.agent_router)
app.include_router(api.admin_router)
app.include_router(api.public_router)

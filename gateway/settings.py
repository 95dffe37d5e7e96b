"""Gateway settings: the operator's admin key lives here (``CRUCIBLE_ADMIN_KEY``)."""

from __future__ import annotations

from pydantic import Field

from services.common.settings import ServiceSettings


class GatewaySettings(ServiceSettings):
    admin_key: str = Field(..., min_length=16, description="Operator key for /admin routes (CRUCIBLE_ADMIN_KEY).")
    max_upload_bytes: int = Field(64 * 1024 * 1024, description="Largest dataset upload, bytes.")

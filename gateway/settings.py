"""Gateway settings: the operator's admin key lives here (``CRUCIBLE_ADMIN_KEY``)."""

from __future__ import annotations

from pydantic import Field

from services.common.settings import ServiceSettings


class GatewaySettings(ServiceSettings):
    admin_key: str = Field(..., min_length=16, description="Operator key for /admin routes (CRUCIBLE_ADMIN_KEY).")
    max_upload_bytes: int = Field(64 * 1024 * 1024, description="Largest upload (a dataset, a harness archive, a task collection), bytes.")
    rate_limits: str = Field(
        "30/second;1200/minute",
        description="Per run key, `;`-separated limits in the `limits` library's notation (e.g. `30/second;1200/minute`), counted "
                    "in a moving window as each request arrives; past one the key gets 429 with Retry-After. Empty: no limit.",
    )
    rate_limit_storage: str = Field(
        "memory://",
        description="Where hits are counted: `memory://` (per gateway process) or `redis://host:6379/1` (shared by every gateway replica).",
    )
    candidate_key: str | None = Field(None, description=(
        "Key of the order in which an evaluator-track benchmark's candidates get their opaque names (`candidate-01` …): "
        "keep it secret from research agents. Default: a random key per benchmark. Either is kept with the benchmark when it is "
        "loaded, so changing this later renames nothing."))

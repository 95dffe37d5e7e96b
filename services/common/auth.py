"""Service-to-service authentication and the signed run context.

Every internal call carries ``Authorization: Bearer <service token>``. Calls made on behalf of a run also
carry ``X-Crucible-Run`` (base64url JSON of :class:`RunContext`) and ``X-Crucible-Run-Signature``
(HMAC-SHA256 of that header value with the service token), so an internal service trusts the run id,
track and permissions only as the gateway stated them. A run key sent straight to an internal service is
not the service token and is refused with 401.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets

from fastapi import Request
from pydantic import BaseModel, Field

from services.common.errors import Unauthorized

RUN_HEADER = "X-Crucible-Run"
RUN_SIGNATURE_HEADER = "X-Crucible-Run-Signature"


class RunContext(BaseModel):
    """Who a call is for: the run, its benchmark and track, and what it may edit."""

    run_id: str
    benchmark_id: str
    track: str = "joint"
    editable: list[str] = Field(default_factory=lambda: ["data", "trainer", "harness"])


def sign(value: str, secret: str) -> str:
    """Hex HMAC-SHA256 of ``value`` under ``secret``."""
    return hmac.new(secret.encode(), value.encode(), hashlib.sha256).hexdigest()


def run_headers(ctx: RunContext, secret: str) -> dict[str, str]:
    """The two headers that carry ``ctx`` to an internal service."""
    value = base64.urlsafe_b64encode(ctx.model_dump_json().encode()).decode()
    return {RUN_HEADER: value, RUN_SIGNATURE_HEADER: sign(value, secret)}


def read_run_context(request: Request, secret: str) -> RunContext | None:
    """The verified run context of ``request``, ``None`` if absent; raises ``Unauthorized`` if forged."""
    value = request.headers.get(RUN_HEADER)
    if value is None:
        return None
    signature = request.headers.get(RUN_SIGNATURE_HEADER, "")
    if not hmac.compare_digest(signature, sign(value, secret)):
        raise Unauthorized("run context signature does not match")
    return RunContext.model_validate(json.loads(base64.urlsafe_b64decode(value.encode())))


def check_service_token(request: Request, secret: str) -> None:
    """Raise ``Unauthorized`` unless the request carries the service token as its Bearer credential."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), secret.encode()):
        raise Unauthorized("internal endpoint: a valid service token is required")


def new_secret(prefix: str, nbytes: int = 24) -> str:
    """A random credential such as ``crk_…`` (URL-safe)."""
    return f"{prefix}_{secrets.token_urlsafe(nbytes)}"


def hash_secret(value: str) -> str:
    """SHA-256 hex digest used to store keys; keys are high-entropy, so no salt or KDF is needed."""
    return hashlib.sha256(value.encode()).hexdigest()


class InternalAuth:
    """FastAPI dependencies for internal routes of a service whose token is ``secret``.

    ``caller`` checks the service token and returns the run context if one was sent; ``run`` also
    requires one (401 otherwise). Use as ``ctx: RunContext = Depends(auth.run)``.
    """

    def __init__(self, secret: str) -> None:
        self.secret = secret

    def caller(self, request: Request) -> RunContext | None:
        check_service_token(request, self.secret)
        return read_run_context(request, self.secret)

    def run(self, request: Request) -> RunContext:
        ctx = self.caller(request)
        if ctx is None:
            raise Unauthorized("this internal endpoint acts for a run; the signed run context is missing")
        return ctx

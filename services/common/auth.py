"""Service-to-service authentication and the signed run context.

Every service has its own token. An internal call carries ``Authorization: Bearer <the caller's token>``;
the callee accepts only the callers it trusts (``trusted_tokens``: the "may call" column of the design's
service table, e.g. the grader trusts only the gateway and the trainer). Calls made on behalf of a run also carry
``X-Crucible-Run`` (base64url JSON of :class:`RunContext`) and ``X-Crucible-Run-Signature`` (HMAC-SHA256
of that header value with the caller's token), so a service trusts the run id, track and permissions only
as a trusted caller stated them. A run key or an admin key sent straight to an internal service is no
service token and is refused with 401.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from pydantic import BaseModel, Field

from services.common.errors import Unauthorized

MAY_CALL: dict[str, tuple[str, ...]] = {  # the design's service table: caller -> services it may call
    "gateway": ("ledger", "trainer", "inference", "grader"),
    "trainer": ("ledger", "grader"),  # the grader: its /internal/training-pool routes only (GRPO), see grader.api
    "inference": ("ledger", "trainer"),
    "grader": ("inference", "ledger"),  # never the trainer: a submission's audit reads the datasets the gateway names from the artifact store
    "ledger": (),
}


def trusted_callers(service: str) -> tuple[str, ...]:
    """The services allowed to call ``service`` (whose tokens it must trust)."""
    return tuple(caller for caller, callees in MAY_CALL.items() if service in callees)


RUN_HEADER = "X-Crucible-Run"
RUN_SIGNATURE_HEADER = "X-Crucible-Run-Signature"


class RunContext(BaseModel):
    """Who a call is for: the run, the grading task of its benchmark the call concerns, its track, and what it may edit."""

    run_id: str
    task_id: str = Field(description="The grader's id of the task the call is for (one per task of a benchmark).")
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


def identify_caller(request: Request, trusted: dict[str, str]) -> tuple[str, str]:
    """``(caller name, caller token)`` of a request whose Bearer credential is a trusted service token;
    raises ``Unauthorized`` otherwise (every token is compared, in constant time)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    found = None
    for name, secret in trusted.items():
        if hmac.compare_digest(token.encode(), secret.encode()) and scheme.lower() == "bearer" and secret:
            found = (name, secret)
    if found is None:
        raise Unauthorized("internal endpoint: the token of a service allowed to call this one is required")
    return found


def new_secret(prefix: str, nbytes: int = 24) -> str:
    """A random credential such as ``crk_…`` (URL-safe)."""
    return f"{prefix}_{secrets.token_urlsafe(nbytes)}"


def hash_secret(value: str) -> str:
    """SHA-256 hex digest used to store keys; keys are high-entropy, so no salt or KDF is needed."""
    return hashlib.sha256(value.encode()).hexdigest()


def service_caller(request: Request) -> RunContext | None:
    """FastAPI dependency of every internal route: 401 unless the request carries the token of a service this one
    trusts (``request.app.state.settings.trusted_tokens``, name → token); the run context that caller signed, if it
    sent one (401 if forged). Sets ``request.state.caller`` to the caller's name."""
    name, token = identify_caller(request, request.app.state.settings.trusted_tokens)
    request.state.caller = name
    return read_run_context(request, token)


def run_caller(request: Request) -> RunContext:
    """As :func:`service_caller` for a route that acts for a run: the signed run context is required (401 without)."""
    ctx = service_caller(request)
    if ctx is None:
        raise Unauthorized("this internal endpoint acts for a run; the signed run context is missing")
    return ctx


def only_callers(*names: str) -> Callable[[Request], None]:
    """A router's dependency narrowing who of the trusted callers may use its routes (a service trusted for some of
    another's routes, not all: the trainer may ask the grader for GRPO's prompts and rewards, nothing else): 401
    unless the request's service token is that of one of ``names``."""

    def check(request: Request) -> None:
        name, _ = identify_caller(request, request.app.state.settings.trusted_tokens)
        if name not in names:
            raise Unauthorized(f"this internal endpoint does not accept the {name} service's token")

    return check


ServiceCaller = Annotated[RunContext | None, Depends(service_caller)]
RunCaller = Annotated[RunContext, Depends(run_caller)]

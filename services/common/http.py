"""HTTP client for service-to-service calls (httpx) that turns error answers into exceptions.

A problem+json answer becomes :class:`UpstreamProblem` carrying the body unchanged, so the gateway can
pass a ledger 402 or a trainer 422 through to the agent as it was; a refused connection or a timeout
becomes :class:`UpstreamUnavailable` (503, retryable). A client built with ``retries`` tries again on that,
which is only right for services whose every call is idempotent: the ledger's mutating calls all carry
idempotency keys (see :func:`ledger_client`).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import structlog

from services.common.auth import RunContext, run_headers
from services.common.errors import UpstreamProblem, UpstreamUnavailable
from services.common.settings import ServiceSettings

_log = structlog.get_logger("http")


class ServiceClient:
    """Calls one internal service with the service token and, optionally, a signed run context."""

    def __init__(self, base_url: str, token: str, *, timeout_s: float = 30.0, name: str = "", retries: int = 0, backoff_s: float = 0.5) -> None:
        self.name = name or base_url
        self.token = token
        self.retries, self.backoff_s = retries, backoff_s
        self.client = httpx.Client(base_url=base_url, timeout=timeout_s, headers={"Authorization": f"Bearer {token}"})

    def request(
        self,
        method: str,
        path: str,
        *,
        ctx: RunContext | None = None,
        json: Any = None,
        params: dict[str, Any] | None = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
        raw: bool = False,
    ) -> Any:
        """Send a request and return the decoded JSON body (``None`` for 204; the body's bytes with ``raw``).

        Raises ``UpstreamProblem`` for any 4xx/5xx answer and ``UpstreamUnavailable`` when the service
        cannot be reached (after ``retries`` more tries, ``backoff_s`` × try-number seconds apart).
        """
        hdrs = dict(headers or {})
        if ctx is not None:
            hdrs.update(run_headers(ctx, self.token))
        kwargs: dict[str, Any] = {"json": json, "params": params, "headers": hdrs, "content": content}
        if timeout_s is not None:
            kwargs["timeout"] = timeout_s
        for attempt in range(self.retries + 1):
            try:
                resp = self.client.request(method, path, **kwargs)
                break
            except httpx.TransportError as exc:  # refused, reset, timed out, cut off mid-answer
                if attempt == self.retries:
                    raise UpstreamUnavailable(f"{self.name} unavailable: {exc.__class__.__name__}") from exc
                time.sleep(self.backoff_s * (attempt + 1))
        if resp.status_code >= 400:
            try:
                body = resp.json()
            except ValueError:
                body = {"detail": resp.text[:500]}
            if not isinstance(body, dict):
                body = {"detail": str(body)}
            body.setdefault("status", resp.status_code)
            body.setdefault("title", "Upstream error")
            raise UpstreamProblem(body)
        if raw:
            return resp.content
        if resp.status_code == 204 or not resp.content:
            return None
        return resp.json()

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.request("POST", path, **kw)

    def close(self) -> None:
        self.client.close()


def ledger_client(settings: ServiceSettings, retries: int = 6) -> ServiceClient:
    """A client of the ledger that retries while it is unreachable (a restart takes a few seconds).

    Safe because every mutating ledger call is idempotent: holds, charges, settles and releases carry
    idempotency keys, and opening an existing account with the same budget returns it.
    """
    return ServiceClient(settings.ledger_url, settings.service_token, name="ledger", timeout_s=settings.http_timeout_s, retries=retries)


def settle_hold(ledger: ServiceClient, hold_id: str, usage: list[dict[str, Any]], idempotency_key: str) -> None:
    """Settle a ledger hold with ``usage`` (charged) and release the rest (idempotent under ``idempotency_key``).

    Work is never free: if the hold was released or expired before the work it covered was settled, the
    usage is charged from the run's free balance instead (key ``late:<idempotency_key>``); if even that
    cannot be covered (402) the shortfall is logged as an error. A hold settled earlier is left as is.
    Raises ``UpstreamUnavailable`` while the ledger cannot be reached (callers retry later).
    """
    try:
        ledger.post(f"/internal/holds/{hold_id}/settle", json={"usage": usage, "idempotency_key": idempotency_key})
        return
    except UpstreamProblem as exc:
        if exc.status != 409:
            raise
    hold = ledger.get(f"/internal/holds/{hold_id}")
    if hold["status"] == "settled" or not usage:
        return
    try:
        ledger.post("/internal/charges", json={"account_id": hold["account_id"], "usage": usage, "purpose": f"{hold['purpose']} (after its hold closed)",
                                               "idempotency_key": f"late:{idempotency_key}"})
    except UpstreamProblem as exc:
        if exc.status != 402:
            raise
        _log.error("work done after its hold closed could not be charged", hold_id=hold_id, usage=usage, detail=exc.detail)

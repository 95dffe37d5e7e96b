"""HTTP clients for service-to-service calls (httpx) that turn error answers into exceptions.

A problem+json answer becomes :class:`UpstreamProblem` carrying the body unchanged, so the gateway can
pass a ledger 402 or a trainer 422 through to the agent as it was; a refused connection or a timeout
becomes :class:`UpstreamUnavailable` (503, retryable). A client built with ``retries`` tries again on that,
which is only right for services whose every call is idempotent: the ledger's mutating calls all carry
idempotency keys (see ``services.ledger.client``).

Every call has a deadline: ``timeout_s`` bounds the whole call, every retry and back-off included. Each
attempt connects within ``connect_timeout_s`` and may wait for the service what is left of the deadline, so
a service that accepts connections and never answers costs its caller ``timeout_s`` once, then a 503 (not one
full timeout per retry). :class:`AsyncServiceClient` also cuts an attempt off at the deadline however the
service trickles its answer; :class:`ServiceClient` applies it to each connect, write and read.

:class:`ServiceClient` is for code that runs in threads (services' sync routes, Celery workers);
:class:`AsyncServiceClient` for an event loop, where a slow service must not hold a thread (the gateway).
Callers never use these directly: each service's ``client.py`` wraps one in a :class:`ServiceAPI` whose
methods own that service's paths and wire models.

Both keep every connection they open (:data:`POOL_LIMITS`): httpcore 1.0.9's pool, when it holds more connections than
``max_keepalive_connections`` or must close an idle one to make room, can close a connection it has just handed to a
waiting request, whose read then waits on a closed descriptor (or on whatever socket reuses its number) for the whole
read timeout (encode/httpcore#1110). An eval worker's 64 threads sharing the inference client hit it: an evaluation
hung on its last item for half an hour, its thread polling a test-store connection that had taken the number.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import httpx
from pydantic import BaseModel, TypeAdapter

from services.common.auth import RunContext, run_headers
from services.common.errors import UpstreamProblem, UpstreamUnavailable

POOL_CONNECTIONS = 1024
POOL_LIMITS = httpx.Limits(max_connections=POOL_CONNECTIONS, max_keepalive_connections=POOL_CONNECTIONS)
"""Connections a client opens to its service, all kept alive: it never closes one as surplus, and closes an idle one to
make room only past :data:`POOL_CONNECTIONS` calls at once (no caller makes that many; see the module docstring)."""


class _Deadline:
    """The attempts of one call: each one's httpx timeouts, and the pause before the next (or the 503)."""

    def __init__(self, name: str, timeout_s: float, connect_timeout_s: float, retries: int, backoff_s: float) -> None:
        self.name, self.connect_timeout_s, self.retries, self.backoff_s = name, connect_timeout_s, retries, backoff_s
        self.timeout_s = timeout_s
        self.end = time.monotonic() + timeout_s
        self.attempt = 0

    def left_s(self) -> float:
        return max(self.end - time.monotonic(), 0.001)

    def timeout(self) -> httpx.Timeout:
        """This attempt's timeouts: connect within ``connect_timeout_s``, everything else within the time left."""
        left = self.left_s()
        return httpx.Timeout(left, connect=min(self.connect_timeout_s, left))

    def pause_s(self, exc: Exception) -> float:
        """Seconds to wait before the next attempt: ``backoff_s`` × attempt number, cut to the time left.

        Raises ``UpstreamUnavailable`` (from ``exc``) when no attempt or no time is left.
        """
        self.attempt += 1
        left = self.end - time.monotonic()
        if self.attempt > self.retries or left <= 0:
            tries = f"{self.attempt} attempt{'s' if self.attempt > 1 else ''}"
            raise UpstreamUnavailable(f"{self.name} unavailable: {exc.__class__.__name__} ({tries} in {self.timeout_s:g} s at most)") from exc
        return min(self.backoff_s * self.attempt, left)


class _BaseClient:
    def __init__(self, base_url: str, token: str, *, timeout_s: float = 30.0, connect_timeout_s: float = 3.0, name: str = "",
                 retries: int = 0, backoff_s: float = 0.5) -> None:
        self.name, self.token = name or base_url, token
        self.timeout_s, self.connect_timeout_s, self.retries, self.backoff_s = timeout_s, connect_timeout_s, retries, backoff_s

    def _deadline(self, timeout_s: float | None) -> _Deadline:
        return _Deadline(self.name, timeout_s or self.timeout_s, self.connect_timeout_s, self.retries, self.backoff_s)

    def _build(self, client: httpx.Client | httpx.AsyncClient, method: str, path: str, ctx: RunContext | None, json: Any,
               params: dict[str, Any] | None, content: bytes | None, headers: dict[str, str] | None) -> httpx.Request:
        hdrs = dict(headers or {})
        if ctx is not None:
            hdrs.update(run_headers(ctx, self.token))
        return client.build_request(method, path, json=json, params=params, content=content, headers=hdrs)

    @staticmethod
    def _answer(resp: httpx.Response, raw: bool) -> Any:
        if resp.status_code >= 400:
            try:
                body = resp.json()
            except ValueError:
                body = {"detail": resp.text[:500]}
            if not isinstance(body, dict):
                body = {"detail": str(body)}
            body["status"] = resp.status_code  # the answer's code is the truth, whatever the body says
            body.setdefault("title", "Upstream error")
            raise UpstreamProblem(body)
        if raw:
            return resp.content
        if resp.status_code == 204 or not resp.content:
            return None
        return resp.json()


class ServiceClient(_BaseClient):
    """Calls one internal service with the service token and, optionally, a signed run context (blocking).

    ``timeout_s``: seconds a call may take in all (every retry and back-off included); ``connect_timeout_s``:
    seconds an attempt may take to connect; ``retries``: more attempts after a transport error (refused,
    reset, timed out), ``backoff_s`` × attempt number seconds apart, while the deadline allows.
    """

    def __init__(self, base_url: str, token: str, **kw: Any) -> None:
        super().__init__(base_url, token, **kw)
        self.client = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, limits=POOL_LIMITS)

    def request(self, method: str, path: str, *, ctx: RunContext | None = None, json: Any = None, params: dict[str, Any] | None = None,
                content: bytes | None = None, headers: dict[str, str] | None = None, timeout_s: float | None = None, raw: bool = False) -> Any:
        """Send a request and return the decoded JSON body (``None`` for 204; the body's bytes with ``raw``).

        ``timeout_s`` replaces the client's deadline for this call. Raises ``UpstreamProblem`` for any
        4xx/5xx answer and ``UpstreamUnavailable`` when the service cannot be reached within the deadline.
        """
        request = self._build(self.client, method, path, ctx, json, params, content, headers)
        deadline = self._deadline(timeout_s)
        while True:
            request.extensions["timeout"] = deadline.timeout().as_dict()
            try:
                return self._answer(self.client.send(request), raw)
            except httpx.TransportError as exc:  # refused, reset, timed out, cut off mid-answer
                time.sleep(deadline.pause_s(exc))

    def close(self) -> None:
        self.client.close()


class AsyncServiceClient(_BaseClient):
    """:class:`ServiceClient` for an event loop: the same arguments, answers and errors; ``await client.request("GET", …)``.

    A call waiting for its service holds no thread, only one of the client's pooled connections.
    """

    def __init__(self, base_url: str, token: str, **kw: Any) -> None:
        super().__init__(base_url, token, **kw)
        self.client = httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, limits=POOL_LIMITS)

    async def request(self, method: str, path: str, *, ctx: RunContext | None = None, json: Any = None, params: dict[str, Any] | None = None,
                      content: bytes | None = None, headers: dict[str, str] | None = None, timeout_s: float | None = None,
                      raw: bool = False) -> Any:
        """As :meth:`ServiceClient.request`; an attempt still running at the deadline is cancelled (``UpstreamUnavailable``)."""
        request = self._build(self.client, method, path, ctx, json, params, content, headers)
        deadline = self._deadline(timeout_s)
        while True:
            request.extensions["timeout"] = deadline.timeout().as_dict()
            try:
                async with asyncio.timeout(deadline.left_s()):
                    resp = await self.client.send(request)
                return self._answer(resp, raw)
            except (httpx.TransportError, TimeoutError) as exc:
                await asyncio.sleep(deadline.pause_s(exc))

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, *, ctx: RunContext | None = None, json: Any = None,
                     headers: dict[str, str] | None = None, timeout_s: float | None = None) -> AsyncIterator[AsyncIterator[bytes]]:
        """Send a request whose answer streams (server-sent events): ``async with client.stream(…) as chunks`` gives
        the body's bytes as they arrive; leaving the block closes the connection (the service sees the client go).

        One attempt: ``UpstreamUnavailable`` if the service cannot be reached, ``UpstreamProblem`` for a 4xx/5xx answer
        (raised on entering, before any chunk); ``timeout_s`` bounds the wait for each chunk.
        """
        request = self._build(self.client, method, path, ctx, json, None, None, headers)
        deadline = self._deadline(timeout_s)
        request.extensions["timeout"] = deadline.timeout().as_dict()
        try:
            resp = await self.client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise UpstreamUnavailable(f"{self.name} unavailable: {exc.__class__.__name__}") from exc
        try:
            if resp.status_code >= 400:
                await resp.aread()
                self._answer(resp, raw=False)
            yield resp.aiter_raw()
        finally:
            await resp.aclose()

    async def aclose(self) -> None:
        await self.client.aclose()


Transport = ServiceClient | AsyncServiceClient


class ServiceAPI:
    """Base of a service's typed client, the ``client.py`` of the service it calls.

    A service's ``client.py`` is the only place that spells its ``/internal/…`` paths: one method per route,
    named as the route function in that service's ``api.py``, taking the route's path and query parameters as
    arguments and its body as the route's pydantic model, returning the route's response model. Methods call
    :meth:`_call`, which works on either transport: with a :class:`ServiceClient` a method returns the parsed
    answer; with an :class:`AsyncServiceClient` it returns an awaitable of it (``await ledger.balance(run_id)``).
    Errors are the transport's: ``UpstreamProblem`` for a 4xx/5xx answer, ``UpstreamUnavailable`` (503).
    """

    def __init__(self, http: Transport) -> None:
        self.http = http

    def readyz(self) -> Any:  # noqa: ANN401 - a dict, or its awaitable
        """The service's readiness (``GET /readyz``, 2 s at most): ``{"status": "ready", …}``; ``UpstreamProblem`` (503
        ``not_ready``, naming what is not) or ``UpstreamUnavailable`` (no answer) otherwise."""
        return self._call("GET", "/readyz", timeout_s=2)

    def _call(self, method: str, path: str, out: Any = None, *, ctx: RunContext | None = None, body: Any = None,
              params: dict[str, Any] | None = None, content: bytes | None = None, headers: dict[str, str] | None = None,
              timeout_s: float | None = None, raw: bool = False) -> Any:
        """Send one request; parse the answer as ``out`` (a type pydantic can validate; ``None``: as decoded).

        ``body``: a pydantic model (sent as JSON with the fields its maker set, so the callee applies its own defaults
        to the rest and an explicit ``null`` stays one) or JSON-ready data; ``params``: query
        parameters, ``None`` values left out; ``raw``: the answer's bytes, unparsed.
        """
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json", exclude_unset=True, by_alias=True)
        query = {k: v for k, v in (params or {}).items() if v is not None} or None
        answer = self.http.request(method, path, ctx=ctx, json=body, params=query, content=content, headers=headers,
                                   timeout_s=timeout_s, raw=raw)
        if inspect.isawaitable(answer):
            return _parsed_later(answer, out)
        return _parse(answer, out)

    def _stream(self, method: str, path: str, *, ctx: RunContext | None = None, body: Any = None,
                headers: dict[str, str] | None = None) -> contextlib.AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """A streamed call (:meth:`AsyncServiceClient.stream`; async transport only), ``body`` sent as :meth:`_call` sends it."""
        if not isinstance(self.http, AsyncServiceClient):
            raise TypeError("streaming needs an AsyncServiceClient transport")
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json", exclude_unset=True, by_alias=True)
        return self.http.stream(method, path, ctx=ctx, json=body, headers=headers)

    def close(self) -> Any:
        """Close the transport's connections (awaitable for an async transport)."""
        return self.http.aclose() if isinstance(self.http, AsyncServiceClient) else self.http.close()


@functools.cache
def _adapter(out: Any) -> TypeAdapter[Any]:
    return TypeAdapter(out)


def _parse(answer: Any, out: Any) -> Any:
    return answer if out is None or answer is None else _adapter(out).validate_python(answer)


async def _parsed_later(answer: Awaitable[Any], out: Any) -> Any:
    return _parse(await answer, out)

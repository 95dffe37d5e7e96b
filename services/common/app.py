"""The FastAPI application factory every service uses: problem+json errors, health, metrics, logging."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request, params
from fastapi import routing as fastapi_routing
from fastapi.dependencies.utils import get_parameterless_sub_dependant
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.common.db import Database, migrate
from services.common.errors import PROBLEM_JSON, CrucibleError, NotReady, PayloadTooLarge, Unprocessable, problem_responses, with_openai_error
from services.common.logging import configure_logging
from services.common.metrics import instrument
from services.common.periodic import Periodic


def problem_response(err: CrucibleError) -> JSONResponse:
    """Render ``err`` as an RFC 9457 response (with ``Retry-After`` when it carries ``retry_after_s``)."""
    body = err.to_problem()
    return problem_json(body, err.status, {"Retry-After": str(int(body["retry_after_s"]))} if "retry_after_s" in body else {})


def problem_json(body: dict[str, Any], status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    """A problem+json response. A 409 carries ``x-should-retry: false``: OpenAI's and Tinker's SDKs retry a 409 by
    default, and none of ours passes by repeating the request (an idempotency key reused, a job that has ended)."""
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON,
                        headers={**(headers or {}), **({"x-should-retry": "false"} if status == 409 else {})})


def _field_path(loc: tuple[Any, ...], body: Any) -> str:
    """The dotted path of a validation error's field in the request, walked along the input itself: pydantic's
    location also holds the member of a union it tried (``str``, ``literal['none','auto']``, a discriminator's
    value), which is no field of the request and is left out. A key the input lacks is kept when it is the last
    (a missing field)."""
    if not loc or loc[0] not in ("body", "query", "path", "header"):
        return ".".join(str(p) for p in loc)
    parts: list[str] = []
    node = body if loc[0] == "body" else None
    rest = loc[1:]
    for i, p in enumerate(rest):
        if node is None:  # query, path, header: flat
            parts.append(str(p))
        elif isinstance(node, dict) and isinstance(p, str) and p in node:
            parts.append(p)
            node = node[p]
        elif isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node):
            parts.append(str(p))
            node = node[p]
        elif isinstance(node, dict) and i == len(rest) - 1:
            parts.append(str(p))  # a missing field
    return ".".join(parts)


def _primary_error(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The error the problem's ``detail`` tells: the first, except that of a value no member of a union took, the error
    of a member that is not a literal (``n_epochs: "auto" | int >= 1`` sent 0: "greater than or equal to 1", not
    "Input should be 'auto'")."""
    if not errors:
        return {}
    first = errors[0]
    if first.get("type") != "literal_error" or len(first.get("loc", ())) < 2:
        return first
    field = tuple(first["loc"][:-1])
    return next((e for e in errors if tuple(e.get("loc", ())[:-1]) == field and e.get("type") != "literal_error"), first)


def validation_problem(exc: RequestValidationError, status: int = 422) -> dict[str, Any]:
    """The problem of a request FastAPI could not validate: ``status`` (422; 400 on routes that answer as OpenAI's API
    does), ``field`` the dotted path of the first error (:func:`_field_path`; of a union, its non-literal member's:
    :func:`_primary_error`), ``errors`` every error."""
    errors = exc.errors()
    first = _primary_error(errors)
    if first.get("type") == "json_invalid":
        return with_openai_error({"type": "urn:crucible:problem:invalid_input", "title": "Invalid input", "status": status, "code": "invalid_input",
                                  "detail": "the request body is not valid JSON", "field": "body"})
    loc = tuple(first.get("loc", ()))
    field = _field_path(loc, exc.body) or (str(loc[0]) if loc else None)  # the whole body (an array where an object belongs): "body"
    detail = f"{field}: {first.get('msg', 'invalid')}" if field else str(first.get("msg", "invalid request"))
    return with_openai_error({
        "type": "urn:crucible:problem:invalid_input",
        "title": "Invalid input",
        "status": status,
        "detail": detail,
        "code": "invalid_input",
        "field": field,
        "errors": [{"field": ".".join(str(p) for p in e.get("loc", ())), "message": e.get("msg")} for e in errors],
    })


def databases_ready(*get: Callable[[FastAPI], tuple[str, Database]]) -> Callable[[FastAPI], Awaitable[dict[str, str]]]:
    """A ``ready`` check of ``create_service_app``: each ``get(app)`` gives ``(name, database)``, and a database that does
    not answer ``SELECT 1`` (:meth:`Database.unready`, off the event loop) is named as not ready."""

    async def ready(app: FastAPI) -> dict[str, str]:
        unready = {}
        for getter in get:
            name, db = getter(app)
            if why := await asyncio.to_thread(db.unready):
                unready[name] = why
        return unready

    return ready


class StrictBodyRoute(APIRoute):
    """A route whose JSON body is validated in pydantic's strict JSON mode besides FastAPI's own (lax) validation, so a
    value of the wrong JSON type is refused, not coerced: ``"limit": "1"``, ``"stream": 1`` or ``"max_tokens": 8.5``
    is a 422 naming the field (strict mode's conversion table: an integer field takes a JSON integer only, a boolean
    ``true``/``false`` only, a number field an integer or a number, a string field a string; a string still reads as
    an enum member or a date-time, which JSON has no other way to send). The check is the route's last dependency, so
    it runs after the caller is authenticated (a bad body without a key is still a 401). A body that is not JSON, or
    not an object, is left to FastAPI (its own 422, naming ``body``), as is what pydantic's JSON parser refuses but
    Python's reads (a lone surrogate escape), which the model's own validators name."""

    def get_route_handler(self):  # noqa: ANN201 - FastAPI's handler type
        # FastAPI builds a handler for the route itself and one per router that includes it, from that inclusion's own
        # dependant (its private context variable tells which is being built): the check goes last in whichever it is.
        context = fastapi_routing._effective_route_context_var.get()
        dependant = context.dependant if context is not None and context.original_route is self else self.dependant
        annotation = self.body_field.field_info.annotation if self.body_field is not None else None
        if (annotation is not None and not isinstance(self.body_field.field_info, params.Form)  # type: ignore[union-attr]
                and isinstance(annotation, type) and issubclass(annotation, BaseModel)
                and not any(isinstance(getattr(d, "call", None), _StrictCheck) for d in dependant.dependencies)):
            dependant.dependencies.append(get_parameterless_sub_dependant(depends=Depends(_StrictCheck(TypeAdapter(annotation))),
                                                                          path=self.path_format))
        return super().get_route_handler()


class _StrictCheck:
    """The dependency :class:`StrictBodyRoute` adds: the request's JSON object validated strictly by ``adapter``."""

    def __init__(self, adapter: TypeAdapter) -> None:
        self.adapter = adapter

    async def __call__(self, request: Request) -> None:
        raw = await request.body()  # cached: FastAPI reads it again
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return  # not JSON: FastAPI's own problem
        if not isinstance(body, dict):
            return
        try:
            self.adapter.validate_json(raw, strict=True)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            if any(e["type"] != "json_invalid" for e in errors):
                raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors], body=body) from None


def create_service_app(
    name: str,
    *,
    title: str,
    description: str,
    version: str = "0.1.0",
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None,
    migrations: tuple[Callable[[], str], Path] | None = None,
    on_startup: Callable[[], None] | None = None,
    background: Callable[[], Periodic] | None = None,
    max_body_bytes: int = 64 * 1024 * 1024,
    log_level: str = "INFO",
    health: Callable[[], dict[str, Any]] | None = None,
    docs_auth: Callable[[Request], Any] | None = None,
    metrics_auth: Callable[[Request], Any] | None = None,
    service_routes: bool = True,
    ready: Callable[[FastAPI], Awaitable[dict[str, str]]] | None = None,
) -> FastAPI:
    """Build a service app with the shared error handlers, ``GET /healthz`` (liveness), ``GET /readyz`` (readiness),
    ``GET /metrics`` and a body limit.

    ``max_body_bytes`` (bytes) is enforced from ``Content-Length``, or while reading a chunked body (which is
    buffered up to the limit first); larger bodies get 413 problem+json (:class:`BodyLimit`).
    ``migrations`` = ``(database URL getter, Alembic folder)``: applied at start-up, then ``on_startup`` runs.
    ``background()`` builds a :class:`Periodic` loop (e.g. a reconciler) that runs while the app is up.
    ``docs_auth(request)``: for an internal service, the check of a service token (raises ``Unauthorized``);
    ``GET /openapi.json`` and ``GET /docs`` then answer only callers it accepts (401 problem+json otherwise),
    so an internal API's shape is not served to whoever reaches its port. ``None``: public docs (the gateway).
    ``metrics_auth(request)``: who may read ``GET /metrics`` (default: ``docs_auth``; the gateway: its operators).
    ``ready(app)``: what of the service and what it needs cannot serve now (part → why; empty: ready), for
    ``GET /readyz``; a service answers only once its start-up (migrations, models) is done, so ``None`` means ready
    whenever it answers.
    ``service_routes=False``: the app serves its own routes and nothing else (no health, metrics or docs, its requests
    not counted in the process's metrics): the rollout model endpoint, which a sandboxed harness reaches.
    """
    log = configure_logging(name, log_level)
    if lifespan is None and (migrations or on_startup or background):
        lifespan = _lifespan(migrations, on_startup, background)
    docs = {"openapi_url": None, "docs_url": None, "redoc_url": None} if docs_auth or not service_routes else {}
    app = FastAPI(title=title, description=description, version=version, lifespan=lifespan, **docs)
    if docs_auth and service_routes:
        _guarded_docs(app, docs_auth)

    _add_error_handlers(app, log)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    if not service_routes:
        return app

    instrument(app, name, metrics_auth or docs_auth)

    @app.get("/healthz", summary="Liveness", tags=["health"])
    def healthz() -> dict[str, Any]:
        """``{"status": "ok", "service": name, ...}`` while the process answers: whether to restart it, not whether it
        can serve (``GET /readyz``)."""
        return {"status": "ok", "service": name, **(health() if health else {})}

    @app.get("/readyz", summary="Readiness", tags=["health"], responses=problem_responses(NotReady))
    async def readyz() -> dict[str, Any]:
        """``{"status": "ready", "service": name}`` once this service and what it needs can serve requests (its
        database; the gateway: every service behind it, inference with its models loaded); else 503 problem+json
        ``not_ready`` with ``Retry-After``, ``unready`` naming each part that is not. What ``crucible up``, compose's
        healthchecks and Helm's readiness probes wait for."""
        unready = await ready(app) if ready else {}
        if unready:
            raise NotReady(f"{name} is not ready: " + "; ".join(f"{k}: {v}" for k, v in sorted(unready.items())), unready=unready)
        return {"status": "ready", "service": name}

    return app


def _lifespan(migrations: tuple[Callable[[], str], Path] | None, on_startup: Callable[[], None] | None,
              background: Callable[[], Periodic] | None) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's start and stop: migrations applied, then ``on_startup``, then the ``background`` loop until it stops."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if migrations:
            url, folder = migrations
            migrate(url(), folder)
        if on_startup:
            on_startup()
        loop = background().start() if background else None
        try:
            yield
        finally:
            if loop:
                loop.stop()

    return lifespan


def _add_error_handlers(app: FastAPI, log: Any) -> None:
    """Every error as problem+json: the platform's own (:class:`CrucibleError`), FastAPI's validation errors (422 naming
    the field), Starlette's 404/405, text that is not text (an unpaired surrogate), and anything unexpected (500, logged)."""

    @app.exception_handler(CrucibleError)
    async def _crucible_error(_request: Request, exc: CrucibleError) -> JSONResponse:
        return problem_response(exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", path=request.url.path)
        return problem_response(CrucibleError(f"unexpected {exc.__class__.__name__}; the error is logged"))

    @app.exception_handler(UnicodeEncodeError)
    async def _not_text(_request: Request, exc: UnicodeEncodeError) -> JSONResponse:
        # JSON may escape an unpaired surrogate ("\ud800"); it is not text, so it cannot be sent on or tokenized
        return problem_response(Unprocessable(f"the request holds an unpaired surrogate (\\u{ord(exc.object[exc.start]):04x}), which is not text"))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return problem_json(validation_problem(exc), 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        body = {"type": f"urn:crucible:problem:{code}", "title": str(exc.detail), "status": exc.status_code, "detail": str(exc.detail), "code": code}
        return problem_json(with_openai_error(body), exc.status_code)


def _guarded_docs(app: FastAPI, check: Callable[[Request], Any]) -> None:
    """``GET /openapi.json`` and ``GET /docs`` (Swagger UI) behind ``check`` (a service-token check)."""

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(request: Request) -> JSONResponse:
        check(request)
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    def swagger(request: Request) -> HTMLResponse:
        check(request)
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} (internal)")


class BodyLimit:
    """ASGI middleware: refuse request bodies over ``max_bytes`` with 413 problem+json before the app reads them.

    A ``Content-Length`` over the limit is refused at once. A body without one (chunked) is read here up to
    the limit and then handed to the app whole, so a client cannot make the service hold more than the limit
    by leaving the length out (whatever the route would have answered, authentication included)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) > self.max_bytes:
                return await self._refuse(scope, receive, send, f"request body is {int(length)} bytes")
            return await self.app(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await self._refuse(scope, receive, send, f"request body is over {self.max_bytes} bytes")
            chunks.append(chunk)
            more = message.get("more_body", False)
        body, replayed = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)

    async def _refuse(self, scope: dict, receive: Callable, send: Callable, what: str) -> None:
        await problem_response(PayloadTooLarge(f"{what}; the limit is {self.max_bytes}"))(scope, receive, send)

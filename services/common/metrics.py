"""Prometheus metrics: request counts and latencies per service, route and status, served at ``/metrics``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

REQUESTS = Counter("crucible_http_requests_total", "HTTP requests", ["service", "route", "method", "status"])
LATENCY = Histogram("crucible_http_request_seconds", "HTTP request latency in seconds", ["service", "route", "method"])


def instrument(app: FastAPI, service: str, auth: Callable[[Request], Any] | None = None) -> None:
    """Count and time every request of ``app`` and expose ``GET /metrics`` to callers ``auth(request)`` accepts (it
    raises ``Unauthorized`` otherwise): request counts per route tell who is doing what (a grading's progress on
    inference), so a Prometheus scraper sends a credential (``authorization`` in its scrape config)."""

    @app.middleware("http")
    async def _measure(request: Request, call_next):  # noqa: ANN001, ANN202
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        REQUESTS.labels(service, path, request.method, str(response.status_code)).inc()
        LATENCY.labels(service, path, request.method).observe(time.perf_counter() - start)
        return response

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        if auth is not None:
            auth(request)
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

"""Typed clients whose calls go to a service's app in this process, for the in-process route tests."""

from __future__ import annotations

from fastapi.testclient import TestClient

from services.common.http import ServiceClient


def in_process(client: TestClient, token: str, name: str) -> ServiceClient:
    """A blocking transport whose calls go to ``client``'s app (entered, so its lifespan ran) with ``token`` as the
    caller's service token; wrap it in a service's typed client (``LedgerClient(in_process(...))``)."""
    transport = ServiceClient(str(client.base_url), token, name=name)
    transport.client.close()
    client.headers["Authorization"] = f"Bearer {token}"
    transport.client = client
    return transport

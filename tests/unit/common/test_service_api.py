"""ServiceAPI, the base of every typed client: what it sends and how it reads answers."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import BaseModel

from services.common.errors import UpstreamProblem
from services.common.http import ServiceAPI, ServiceClient


class Settings(BaseModel):
    temperature: float | None = 0.0  # null means "the harness chooses": not the same as the default
    samples: int = 1


class Echo(ServiceAPI):
    def send(self, body: Settings, **params: object) -> dict:
        return self._call("POST", "/internal/echo", dict, body=body, params=params)


def echo_client(status: int = 200, answer: object = None) -> tuple[Echo, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json=answer if answer is not None else json.loads(request.content))

    transport = ServiceClient("http://svc", "token", name="svc")
    transport.client = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://svc")
    return Echo(transport), seen


def test_a_body_carries_what_its_maker_set_and_an_explicit_null_stays_one() -> None:
    client, _ = echo_client()
    assert client.send(Settings(temperature=None)) == {"temperature": None}
    assert client.send(Settings(samples=4)) == {"samples": 4}  # the callee applies its own default temperature


def test_a_field_with_an_alias_is_sent_by_its_wire_name() -> None:
    """``response_format.json_schema.schema`` is ``schema_`` in Python: sent as ``schema``, or the callee never sees it."""
    from services.common.openai_protocol import ChatCompletionRequest

    class Chat(ServiceAPI):
        def send(self, body: ChatCompletionRequest) -> dict:
            return self._call("POST", "/internal/echo", dict, body=body)

    client, _ = echo_client()
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}})
    sent = Chat(client.http).send(body)
    assert sent["response_format"]["json_schema"] == {"name": "a", "schema": schema}
    assert ChatCompletionRequest.model_validate(sent).response_format.json_schema.schema_ == schema


def test_query_parameters_left_as_none_are_not_sent() -> None:
    client, seen = echo_client()
    client.send(Settings(), after=None, limit=5)
    assert dict(seen[-1].url.params) == {"limit": "5"}


def test_a_problem_answer_is_raised_with_the_http_status_whatever_its_body_says() -> None:
    client, _ = echo_client(409, {"title": "closed", "status": "released", "detail": "hold is released"})
    with pytest.raises(UpstreamProblem) as exc:
        client.send(Settings())
    assert exc.value.status == 409 and exc.value.problem["status"] == 409


def test_a_client_shared_by_many_threads_closes_none_of_its_connections() -> None:
    """64 calls at once (an eval worker's threads on the inference client) open 64 connections, and the pool keeps them
    all: httpcore closes a surplus idle connection under a request it has just been handed (encode/httpcore#1110; an
    evaluation's call then waited half an hour on a closed socket), and with every connection kept there is no surplus."""
    import http.server
    import threading
    from concurrent.futures import ThreadPoolExecutor

    calls = 64
    arrived = threading.Barrier(calls, timeout=30)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive

        def do_GET(self) -> None:
            arrived.wait()  # every call holds its own connection at once
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = ServiceClient(f"http://127.0.0.1:{server.server_address[1]}", "token", name="svc", timeout_s=30)
    try:
        with ThreadPoolExecutor(calls) as pool:
            assert list(pool.map(lambda _: client.request("GET", "/internal/x"), range(calls))) == [{}] * calls
        connections = client.client._transport._pool.connections  # type: ignore[attr-defined]
        assert len(connections) == calls and not [c for c in connections if c.is_closed()]
    finally:
        client.close()
        server.shutdown()

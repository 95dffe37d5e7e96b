"""A dependency that hangs costs its caller a bounded time, then a 503 problem+json; a paced client is never refused.

Real sockets and a real gateway process: a "ledger" that accepts connections and never answers (nor closes
them), a ledger that comes back after a restart, and an "inference" service that answers in bursts, as its
micro-batcher does.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from services.common.auth import hash_secret
from services.common.errors import UpstreamUnavailable
from services.common.http import AsyncServiceClient, ServiceClient
from services.common.settings import ServiceSettings
from services.ledger.client import LedgerClient
from tests.conftest import ROOT, TEST_BENCHMARK

pytestmark = pytest.mark.slow  # every test here waits on real timeouts
README_LEDGER_S = 10.0  # docs/operators.md: "callers retry for about 10 s … After that the agent gets a 503"
HOLD_S = 8.0  # the fake inference answers the requests it holds every HOLD_S seconds


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers or closes it; yields its URL."""
    sock = socket.create_server(("127.0.0.1", 0), backlog=128)
    sock.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(sock.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        sock.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers every request with ``server.answer(path, body) -> (status, JSON body)``, after ``server.hold()``."""

    def _serve(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.hold()  # type: ignore[attr-defined]
        status, answer = self.server.answer(self.path, body)  # type: ignore[attr-defined]
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _serve

    def log_message(self, *_args: object) -> None:
        pass


@contextlib.contextmanager
def json_server(answer, hold=lambda: None, port: int = 0) -> Iterator[str]:  # noqa: ANN001
    """A threaded HTTP server answering ``answer(path, body)`` after ``hold()``; yields its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    server.daemon_threads = True
    server.answer, server.hold = answer, hold  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


BALANCE = {"account_id": "run_x", "budget_usd_micros": 10, "held_usd_micros": 0, "spent_usd_micros": 0, "remaining_usd_micros": 10,
           "spent_by_kind": {}, "usage_by_kind": {}, "price_version": "v1"}


def _ledger(url: str, transport: type) -> LedgerClient:
    return LedgerClient.connect(ServiceSettings(ledger_url=url), transport)


def _balance(ledger: LedgerClient) -> object:
    """Run ``run_x``'s balance read, on either transport."""
    answer = ledger.get_balance("run_x")
    return asyncio.run(answer) if isinstance(ledger.http, AsyncServiceClient) else answer


# --------------------------------------------------------------------------- the service client


@pytest.mark.parametrize("client", [ServiceClient, AsyncServiceClient])
def test_a_ledger_that_accepts_and_never_answers_is_a_503_after_the_readmes_10_s_not_one_timeout_per_retry(client: type) -> None:
    assert ServiceSettings().ledger_timeout_s == README_LEDGER_S
    with silent_server() as url:
        ledger = _ledger(url, client)
        start = time.monotonic()
        with pytest.raises(UpstreamUnavailable) as exc:
            _balance(ledger)
        elapsed = time.monotonic() - start
    assert README_LEDGER_S - 0.5 <= elapsed <= README_LEDGER_S + 3, elapsed
    problem = exc.value.to_problem()
    assert problem["status"] == 503 and problem["code"] == "upstream_unavailable" and problem["retry_after_s"] >= 1
    assert "ledger" in problem["detail"]


@pytest.mark.parametrize("client", [ServiceClient, AsyncServiceClient])
def test_a_ledger_restarting_for_a_few_seconds_is_waited_for(client: type) -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # free now: connections are refused until the "ledger" is back
    ledger = _ledger(f"http://127.0.0.1:{port}", client)
    back = threading.Event()

    def restart() -> None:
        time.sleep(2.0)
        with json_server(lambda _path, _body: (200, BALANCE), port=port):
            back.set()
            time.sleep(20)

    threading.Thread(target=restart, daemon=True).start()
    start = time.monotonic()
    assert _balance(ledger).account_id == "run_x"  # type: ignore[attr-defined]
    assert back.is_set() and 2.0 <= time.monotonic() - start < README_LEDGER_S


def test_every_attempt_shares_one_deadline_when_a_service_stops_answering() -> None:
    with silent_server() as url:
        client = ServiceClient(url, "token", name="trainer", timeout_s=2.0, retries=5, backoff_s=0.1)
        start = time.monotonic()
        with pytest.raises(UpstreamUnavailable):
            client.request("GET", "/internal/jobs")
        assert time.monotonic() - start < 4.0  # one deadline of 2 s, not 6 attempts of 2 s


def test_a_problem_answer_passes_through_and_is_not_retried() -> None:
    calls = []

    def answer(path: str, _body: bytes) -> tuple[int, dict]:
        calls.append(path)
        return 402, {"type": "urn:crucible:problem:budget_exhausted", "status": 402, "code": "budget_exhausted", "remaining_usd_micros": 5}

    with json_server(answer) as url:
        for client in (ServiceClient, AsyncServiceClient):
            with pytest.raises(Exception) as exc:
                _balance(_ledger(url, client))
            assert exc.value.to_problem()["remaining_usd_micros"] == 5 and exc.value.status == 402
    assert len(calls) == 2


# --------------------------------------------------------------------------- the gateway, a real process


def _completion(_path: str, _body: bytes) -> tuple[int, dict]:
    return 200, {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "smollm2-135m-instruct",
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}


def _in_batches(every_s: float):  # noqa: ANN202
    """A hold that releases the waiting requests together every ``every_s`` seconds, as a micro-batcher answers."""

    def hold() -> None:
        time.sleep(every_s - time.time() % every_s)

    return hold


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The gateway as a process whose ledger never answers and whose inference answers in bursts every ``HOLD_S`` s;
    yields ``(gateway URL, a run key)``."""
    from gateway.models import Benchmark, Run
    from services.common.db import Database

    data_dir = tmp_path_factory.mktemp("gateway")
    with silent_server() as ledger, json_server(_completion, _in_batches(HOLD_S)) as inference, socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
        probe.close()
        env = {**os.environ, "CRUCIBLE_DATA_DIR": str(data_dir), "CRUCIBLE_ADMIN_KEY": "admin-key-for-this-test-only",
               "CRUCIBLE_LEDGER_URL": ledger, "CRUCIBLE_INFERENCE_URL": inference, "CRUCIBLE_RATE_LIMITS": "30/second;1200/minute"}
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "gateway.app:app", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/healthz").status_code == 200:
                        break
                time.sleep(0.1)
            key = "crk_paced-client-test-key"
            now = dt.datetime.now(dt.UTC)
            with Database(f"sqlite:///{data_dir / 'gateway.sqlite'}").session() as s:
                s.add(Benchmark(id="bm_x", name="paced", spec=TEST_BENCHMARK, tasks=None, created_at=now))
                s.add(Run(id="run_x", benchmark_id="bm_x", agent_name="paced", track="joint", key_hash=hash_secret(key), key_prefix=key[:8],
                          budget_usd_micros=10**9, deadline_at=now + dt.timedelta(hours=1), created_at=now))
            yield url, key
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_the_budget_read_of_a_run_is_a_503_problem_json_within_10_s_when_the_ledger_hangs(gateway: tuple[str, str]) -> None:
    url, key = gateway
    start = time.monotonic()
    resp = httpx.get(f"{url}/v1/budget", headers={"Authorization": f"Bearer {key}"}, timeout=300)
    elapsed = time.monotonic() - start
    assert resp.status_code == 503 and resp.headers["content-type"].startswith("application/problem+json"), resp.text
    assert resp.json()["code"] == "upstream_unavailable" and int(resp.headers["Retry-After"]) >= 1
    assert elapsed <= README_LEDGER_S + 3, elapsed


def test_a_client_pacing_at_a_third_of_the_rate_limit_never_gets_429(gateway: tuple[str, str]) -> None:
    """10 chat completions a second under a 30/s limit, while inference holds each for up to ``HOLD_S`` s and
    answers them together: 150 requests, up to 80 in flight, and not one 429."""
    url, key = gateway
    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 4}

    async def paced() -> list[int]:
        # idle connections dropped after 2 s, before uvicorn closes them (5 s): a request sent on a connection the
        # server is closing at that moment fails with ReadError, which is the client's race, not the gateway's answer
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120,
                                     limits=httpx.Limits(max_connections=200, keepalive_expiry=2.0)) as http:
            start = time.monotonic()

            async def one(i: int) -> int:
                await asyncio.sleep(max(0.0, start + i / 10 - time.monotonic()))
                return (await http.post("/v1/chat/completions", json=body)).status_code

            return await asyncio.gather(*(one(i) for i in range(150)))

    codes = asyncio.run(paced())
    assert codes.count(429) == 0 and codes.count(200) == 150, sorted(set(codes))

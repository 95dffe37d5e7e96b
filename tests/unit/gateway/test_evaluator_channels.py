"""The evaluator track's side channels: what a run reads of a candidate's call, beside the completion itself, is the same
for every candidate, whatever its hidden harness.

The gateway, the ledger and the inference service are the real apps in this process (inference serving the test-only
model, :data:`tests.models.TINY_MODEL`, and charging the same ledger the gateway reads the budget from); the grader is
the route tests' stand-in (:class:`tests.unit.gateway.test_routes.Grader`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from inference_service.app import create_app as create_inference_app
from inference_service.client import InferenceClient
from inference_service.service import Inference
from inference_service.settings import InferenceSettings
from trainer_service.app import create_app as create_trainer_app
from trainer_service.client import TrainerClient

from gateway.app import create_app
from services.common.http import ServiceClient
from services.common.ids import new_id
from services.common.settings import ServiceSettings
from services.ledger.app import create_app as create_ledger_app
from services.ledger.client import LedgerClient
from services.ledger.settings import LedgerSettings
from tests.conftest import TEST_BENCHMARK, prepared_models
from tests.models import TINY_MODEL
from tests.unit.gateway.test_routes import ADMIN, GATEWAY_TOKEN, TRAINER_TOKEN, Grader, Served, assert_problem, in_process, settings_for

INFERENCE_TOKEN = "inference-token"
CONTEXT = 256
HIDDEN_PROMPTS = ["", "Be brief.", "You are a careful grader of arithmetic. " * 12]  # 0, 3 and about 100 tokens of hidden harness


class Forwarded(httpx.AsyncBaseTransport):
    """An async transport whose requests go to an app behind a (blocking) ``TestClient``, in a thread: the app's engines
    keep the event loop its lifespan started them on."""

    def __init__(self, client: TestClient) -> None:
        self.client = client

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        resp = await asyncio.to_thread(self.client.request, request.method, request.url.raw_path.decode(),
                                       content=body, headers=dict(request.headers))
        return httpx.Response(resp.status_code, headers={"content-type": resp.headers.get("content-type", "application/json")},
                              stream=httpx.ByteStream(resp.content))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("evaluator-channels")
    ledger_app = create_ledger_app(LedgerSettings(database_url=f"sqlite:///{tmp}/ledger.sqlite", service_token="ledger-token",
                                                  trusted_tokens={"gateway": GATEWAY_TOKEN, "inference": INFERENCE_TOKEN}))
    trainer_app = create_trainer_app(ServiceSettings(data_dir=tmp / "trainer", service_token=TRAINER_TOKEN, reconcile_interval_s=3600,
                                                     trusted_tokens={"gateway": GATEWAY_TOKEN}))
    (tmp / "inference").mkdir()
    (tmp / "inference" / "models").symlink_to(prepared_models(TINY_MODEL))
    inference_app = create_inference_app(InferenceSettings(data_dir=tmp / "inference", service_token=INFERENCE_TOKEN,
                                                           trusted_tokens={"gateway": GATEWAY_TOKEN}))
    with (TestClient(ledger_app, base_url="http://ledger") as ledger_http, TestClient(trainer_app),
          TestClient(inference_app, base_url="http://inference") as inference_http,
          TestClient(create_app(settings_for(tmp)), base_url="http://gateway") as http):
        inference: Inference = inference_app.state.inference
        inference.ledger.close()
        inference.ledger = LedgerClient(in_process_blocking(ledger_http, INFERENCE_TOKEN, "ledger"))
        served = Served(http=http, grader=Grader(), services={"ledger": ledger_app, "trainer": trainer_app})
        served.gateway.ledger = LedgerClient(in_process(httpx.ASGITransport(app=ledger_app), "ledger"))
        served.gateway.trainer = TrainerClient(in_process(httpx.ASGITransport(app=trainer_app), "trainer"))
        served.gateway.grader = served.grader  # type: ignore[assignment]
        served.gateway.inference = InferenceClient(in_process(Forwarded(inference_http), "inference"))
        yield served


def in_process_blocking(client: TestClient, token: str, name: str) -> ServiceClient:
    """A blocking transport to ``client``'s app, as ``token``'s service (a copy of the client: the gateway's calls to the
    same app carry the gateway's token)."""
    transport = ServiceClient(str(client.base_url), token, name=name)
    transport.client.close()
    transport.client = TestClient(client.app, base_url=str(client.base_url), headers={"Authorization": f"Bearer {token}"})
    return transport


def candidates_benchmark() -> dict[str, Any]:
    doc = {k: v for k, v in TEST_BENCHMARK.items() if k not in ("suite", "initial_system", "reference", "recipe")}
    return {**doc, "name": f"channels-{new_id('bm')[3:]}", "track": "evaluator", "evaluation": {**doc["evaluation"], "context_tokens": CONTEXT},
            "candidates": [{"model": TINY_MODEL, "harness": {"system_prompt": p, "max_tokens": 8} if p else {"max_tokens": 8}}
                           for p in HIDDEN_PROMPTS],
            "tasks": [{"name": "dev", "target": "development", "suite": TEST_BENCHMARK["suite"]},
                      {"name": "hidden", "target": "sealed", "suite": TEST_BENCHMARK["suite"]}]}


@pytest.mark.slow  # the inference app's engine starts (about 10 s on a quiet machine)
def test_candidates_with_different_hidden_harnesses_report_and_charge_the_same_prompt(served: Served) -> None:
    bm = served.load(candidates_benchmark())
    resp = served.http.post("/admin/runs", json={"benchmark": bm["id"], "agent_name": "probe", "track": "evaluator"}, headers=ADMIN)
    agent = {"Authorization": f"Bearer {resp.json()['api_key']}"}
    names = [m["id"] for m in served.http.get("/v1/models", headers=agent).json()["data"]]
    assert len(names) == len(HIDDEN_PROMPTS)
    ask = {"messages": [{"role": "user", "content": "What is 17 + 25?"}], "max_tokens": 1}
    seen: dict[str, tuple[Any, ...]] = {}
    for name in names:
        before = served.http.get("/v1/budget", headers=agent).json()
        out = served.http.post("/v1/chat/completions", json={**ask, "model": name}, headers=agent)
        assert out.status_code == 200, out.text
        usage = out.json()["usage"]
        after = served.http.get("/v1/budget", headers=agent).json()
        spent = {kind: after["spent_by_kind"].get(kind, 0) - before["spent_by_kind"].get(kind, 0) for kind in after["spent_by_kind"]}
        used = {kind: after["usage_by_kind"].get(kind, 0) - before["usage_by_kind"].get(kind, 0) for kind in after["usage_by_kind"]}
        assert usage["completion_tokens"] == 1 and used["decode_tokens"] == 1
        seen[name] = (usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], used, spent,
                      after["spent_usd_micros"] - before["spent_usd_micros"])
    assert len(set(map(repr, seen.values()))) == 1, seen  # one answer for all: nothing of a hidden prompt's length
    prompt_tokens, cached, used, _spent, _total = next(iter(seen.values()))
    assert cached == 0 and used["prefill_tokens"] == prompt_tokens and not used.get("cached_prefill_tokens")
    again = served.http.post("/v1/chat/completions", json={**ask, "model": names[0], "stream": True, "stream_options": {"include_usage": True}},
                             headers=agent)
    assert again.status_code == 200 and f'"prompt_tokens":{prompt_tokens},' in again.text.replace(" ", "")  # streamed: the same

    # the context's limit is one for all: a message that fits the candidate without a hidden prompt but not the one with
    # the longest is refused whichever is named, alike
    long = {"messages": [{"role": "user", "content": "seven " * (CONTEXT - 60)}], "max_tokens": 1}
    refusals = [assert_problem(served.http.post("/v1/chat/completions", json={**long, "model": name}, headers=agent), 422, "context_exceeded")
                for name in names]
    assert len({(r["field"], r["detail"].split(":", 1)[1], r["title"]) for r in refusals}) == 1 and refusals[0]["field"] == "messages"

"""The inference app in this process, shared by the route and protocol tests of this folder: ``create_app`` serving the
test-only model ``tiny-smollm2`` (:data:`MODEL`) and the real one (:data:`REAL_MODEL`, for the checks that read what it
says), its ledger calls answered by the real ledger app (SQLite) in this process, its checkpoint look-ups by a stub
trainer that knows none."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from inference_service.app import create_app
from inference_service.client import InferenceClient
from inference_service.service import Inference
from inference_service.settings import InferenceSettings
from trainer_service.client import TrainerClient

from services.common.auth import RunContext
from services.common.http import ServiceClient
from services.ledger.app import create_app as create_ledger_app
from services.ledger.client import LedgerClient
from services.ledger.schemas import AccountCreate
from services.ledger.settings import LedgerSettings
from tests.conftest import prepared_models
from tests.models import TINY_MODEL
from tests.unit.inprocess import in_process

MODEL = TINY_MODEL  # the protocol's plumbing: which fields, streams, holds and logs (what the model says does not matter)
REAL_MODEL = "smollm2-135m-instruct"  # where a check reads what the model says (penalties, stops, JSON schemas)
GATEWAY_TOKEN, INFERENCE_TOKEN = "gateway-token", "inference-token"


def no_checkpoints(request: httpx.Request) -> httpx.Response:
    """The trainer, knowing no checkpoint."""
    return httpx.Response(404, json={"type": "urn:crucible:problem:not_found", "title": "Not found", "status": 404, "code": "not_found",
                                     "detail": "unknown checkpoint"})


@pytest.fixture(scope="package")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerClient]:
    tmp = tmp_path_factory.mktemp("ledger")
    app = create_ledger_app(LedgerSettings(database_url=f"sqlite:///{tmp}/ledger.db", service_token="ledger-token",
                                           trusted_tokens={"inference": INFERENCE_TOKEN}))
    with TestClient(app, base_url="http://ledger", headers={"Authorization": f"Bearer {INFERENCE_TOKEN}"}) as client:
        yield LedgerClient(in_process(client, INFERENCE_TOKEN, "ledger"))


@pytest.fixture(scope="package")
def served(tmp_path_factory: pytest.TempPathFactory, ledger: LedgerClient) -> Iterator[TestClient]:
    """The inference app, started (engine loaded), called with the gateway's token."""
    data_dir = tmp_path_factory.mktemp("inference")
    (data_dir / "models").symlink_to(prepared_models(MODEL, REAL_MODEL))
    settings = InferenceSettings(data_dir=data_dir, service_token=INFERENCE_TOKEN, trusted_tokens={"gateway": GATEWAY_TOKEN})
    with TestClient(create_app(settings), base_url="http://inference", headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"}) as client:
        inference: Inference = client.app.state.inference
        inference.ledger.close()
        inference.ledger = ledger
        inference.trainer.close()
        trainer = ServiceClient("http://trainer", INFERENCE_TOKEN, name="trainer")
        trainer.client = httpx.Client(base_url="http://trainer", transport=httpx.MockTransport(no_checkpoints))
        inference.trainer = TrainerClient(trainer)
        yield client


@pytest.fixture(scope="package")
def inference(served: TestClient) -> InferenceClient:
    return InferenceClient(in_process(served, GATEWAY_TOKEN, "inference"))


def run(ledger: LedgerClient, run_id: str, budget_usd_micros: int = 1_000_000) -> RunContext:
    """A run with an open ledger account of ``budget_usd_micros``."""
    ledger.open_account(AccountCreate(account_id=run_id, budget_usd_micros=budget_usd_micros))
    return RunContext(run_id=run_id, task_id="bench_t")

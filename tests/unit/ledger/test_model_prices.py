"""A registered base model's prices on the ledger's price table (``PUT /internal/prices/models/{model}``): they price
its usage from then on, the table's version changes with them, they survive a restart, and a bad body or name is a 422
naming the field. The real ledger app in this process (SQLite)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from services.common.errors import UpstreamProblem
from services.common.http import ServiceClient
from services.ledger.app import create_app
from services.ledger.client import LedgerClient
from services.ledger.pricing import load_prices
from services.ledger.schemas import AccountCreate, ChargeCreate, ModelPrices, UsageItem, UsageKind
from services.ledger.settings import LedgerSettings

TOKEN = "inference-token"
YAML = load_prices()


def connect(tmp_path: Path) -> tuple[TestClient, LedgerClient]:
    app = create_app(LedgerSettings(database_url=f"sqlite:///{tmp_path}/ledger.db", service_token="ledger-token", trusted_tokens={"inference": TOKEN}))
    client = TestClient(app, base_url="http://ledger", headers={"Authorization": f"Bearer {TOKEN}"})
    transport = ServiceClient("http://ledger", TOKEN, name="ledger")
    transport.client = client
    return client, LedgerClient(transport)


@pytest.fixture()
def ledger(tmp_path: Path) -> Iterator[LedgerClient]:
    client, ledger = connect(tmp_path)
    with client:
        yield ledger


def rows(ledger: LedgerClient, model: str) -> dict[str, int]:
    return {p.kind.value: p.usd_micros_per_million_units for p in ledger.prices().prices if p.model == model}


def test_a_registered_models_prices_price_its_usage_and_version_the_table(ledger: LedgerClient, tmp_path: Path) -> None:
    assert rows(ledger, "gemma3-270m") == {} and ledger.prices().version == YAML.version
    table = ledger.register_model_prices("gemma3-270m", ModelPrices(prices={"prefill_tokens": 200_000, "decode_tokens": 800_000}))
    assert table.version.startswith(f"{YAML.version}+") and table == ledger.prices()
    assert rows(ledger, "gemma3-270m") == {"prefill_tokens": 200_000, "decode_tokens": 800_000}
    assert ledger.register_model_prices("gemma3-270m", ModelPrices(prices={"decode_tokens": 800_000})).version == table.version  # same rows

    ledger.open_account(AccountCreate(account_id="run_p", budget_usd_micros=1_000_000))
    charge = ledger.create_charge(ChargeCreate(account_id="run_p", idempotency_key="k1", purpose="chat", usage=[
        UsageItem(kind=UsageKind.decode_tokens, quantity=1000, model="gemma3-270m"),
        UsageItem(kind=UsageKind.training_tokens, quantity=1000, model="gemma3-270m")]))  # not registered: the "*" row
    assert [(line.usd_micros_per_million_units, line.amount_usd_micros) for line in charge.lines] == [
        (800_000, 800), (YAML.unit_price(UsageKind.training_tokens, "*"), YAML.unit_price(UsageKind.training_tokens, "*") // 1000)]
    assert charge.price_version == table.version

    smol = ledger.register_model_prices("smollm2-135m-instruct", ModelPrices(prices={"decode_tokens": 1}))
    assert rows(ledger, "smollm2-135m-instruct")["decode_tokens"] == 1 and smol.version != table.version  # replaces prices.yaml's row


def test_registered_prices_survive_a_restart(tmp_path: Path) -> None:
    client, ledger = connect(tmp_path)
    with client:
        version = ledger.register_model_prices("my-model", ModelPrices(prices={"decode_tokens": 5})).version
    client, ledger = connect(tmp_path)
    with client:
        assert ledger.prices().version == version and rows(ledger, "my-model") == {"decode_tokens": 5}


@pytest.mark.parametrize(("model", "body", "field"), [
    ("*", {"prices": {"decode_tokens": 1}}, "model"),
    ("my-model", {"prices": {"sandbox_seconds": 1}}, "prices.sandbox_seconds"),
    ("my-model", {"prices": {"decode_tokens": -1}}, "prices"),
    ("my-model", {"prices": {}}, "prices"),
])
def test_bad_prices_are_a_422_naming_the_field(ledger: LedgerClient, model: str, body: dict, field: str) -> None:
    with pytest.raises(UpstreamProblem) as exc:
        ledger.http.request("PUT", f"/internal/prices/models/{model}", json=body)
    assert exc.value.status == 422 and exc.value.problem["field"].startswith(field), exc.value.problem
    assert ledger.prices().version == YAML.version

"""The ledger's typed client against the real ledger app, in this process (SQLite), over both transports."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from services.common.errors import UpstreamProblem
from services.common.http import AsyncServiceClient, ServiceClient
from services.ledger.app import create_app
from services.ledger.client import LedgerClient
from services.ledger.schemas import (
    AccountCreate,
    ChargeCreate,
    EntryType,
    HoldCharge,
    HoldCreate,
    HoldRelease,
    HoldSettle,
    HoldStatus,
    RefundCreate,
    UsageItem,
    UsageKind,
)
from services.ledger.settings import LedgerSettings

TOKEN = "trainer-token"


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(LedgerSettings(database_url=f"sqlite:///{tmp_path}/ledger.db", service_token="ledger-token", trusted_tokens={"trainer": TOKEN}))
    with TestClient(app, base_url="http://ledger", headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        yield client


@pytest.fixture()
def ledger(served: TestClient) -> LedgerClient:
    transport = ServiceClient("http://ledger", TOKEN, name="ledger")
    transport.client = served  # calls go to the ledger app in this process
    return LedgerClient(transport)


def decode(tokens: int) -> UsageItem:
    return UsageItem(kind=UsageKind.decode_tokens, quantity=tokens)


def test_every_route_answers_its_model(ledger: LedgerClient) -> None:
    account = ledger.open_account(AccountCreate(account_id="run_a", budget_usd_micros=1_000_000))
    assert account.remaining_usd_micros == 1_000_000
    assert ledger.open_account(AccountCreate(account_id="run_a", budget_usd_micros=1_000_000)) == account  # same budget: the account
    with pytest.raises(UpstreamProblem) as exc:
        ledger.open_account(AccountCreate(account_id="run_a", budget_usd_micros=7))
    assert exc.value.status == 409

    hold = ledger.create_hold(HoldCreate(account_id="run_a", usage=[decode(100_000)], purpose="eval", idempotency_key="h1"))
    assert hold.status == HoldStatus.open and ledger.get_hold(hold.hold_id) == hold
    charged = ledger.charge_hold(hold.hold_id, HoldCharge(usage=[decode(10)], idempotency_key="c1"))
    assert charged.charged_usd_micros > 0
    settled = ledger.settle_hold(hold.hold_id, HoldSettle(usage=[decode(10)], idempotency_key="s1"))
    assert settled.status == HoldStatus.settled
    assert [h.hold_id for h in ledger.list_holds("run_a", status=HoldStatus.settled)] == [hold.hold_id]
    assert ledger.list_holds("run_a", status=HoldStatus.open) == []

    charge = ledger.create_charge(ChargeCreate(account_id="run_a", usage=[decode(1000)], purpose="chat", idempotency_key="k1"))
    refund = ledger.create_refund(RefundCreate(account_id="run_a", entry_id=charge.lines[0].entry_id, reason="platform fault", idempotency_key="r1"))
    assert refund.amount_usd_micros == charge.lines[0].amount_usd_micros

    entries = ledger.list_entries("run_a")
    assert {EntryType.hold, EntryType.charge, EntryType.release, EntryType.refund} <= {e.type for e in entries}
    assert ledger.list_entries("run_a", after=entries[0].id, limit=2) == entries[1:3]
    balance = ledger.get_balance("run_a")
    assert balance.spent_usd_micros == sum(b.amount_usd_micros for b in ledger.usage("run_a")) - refund.amount_usd_micros
    assert [b.account_id for b in ledger.list_balances()] == ["run_a"]
    assert ledger.prices().version == balance.price_version

    with pytest.raises(UpstreamProblem) as exc:
        ledger.get_balance("run_missing")
    assert exc.value.status == 404


def test_settle_or_charge_charges_work_done_after_its_hold_closed(ledger: LedgerClient) -> None:
    ledger.open_account(AccountCreate(account_id="run_b", budget_usd_micros=1_000_000))
    hold = ledger.create_hold(HoldCreate(account_id="run_b", usage=[decode(100_000)], purpose="job", idempotency_key="h"))
    ledger.release_hold(hold.hold_id, HoldRelease(idempotency_key="rel"))  # e.g. expired while the worker was cut off
    ledger.settle_or_charge(hold.hold_id, [decode(1000)], "settle:job")
    ledger.settle_or_charge(hold.hold_id, [decode(1000)], "settle:job")  # a retry charges nothing more
    late = [e for e in ledger.list_entries("run_b") if e.type == EntryType.charge]
    assert len(late) == 1 and late[0].idempotency_key == "late:settle:job" and late[0].hold_id is None


def test_settle_or_charge_leaves_a_settled_hold_as_it_is(ledger: LedgerClient) -> None:
    ledger.open_account(AccountCreate(account_id="run_c", budget_usd_micros=1_000_000))
    hold = ledger.create_hold(HoldCreate(account_id="run_c", usage=[decode(100_000)], purpose="job", idempotency_key="h"))
    ledger.settle_or_charge(hold.hold_id, [decode(1000)], "settle:job")
    ledger.settle_or_charge(hold.hold_id, [decode(5000)], "settle:other")  # settled already: 409, nothing charged twice
    assert ledger.get_balance("run_c").spent_usd_micros == ledger.get_hold(hold.hold_id).charged_usd_micros


def test_an_async_transport_returns_awaitables_of_the_same_models(served: TestClient, ledger: LedgerClient) -> None:
    ledger.open_account(AccountCreate(account_id="run_d", budget_usd_micros=5))

    async def read() -> None:
        transport = AsyncServiceClient("http://ledger", TOKEN, name="ledger")
        transport.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=served.app), base_url="http://ledger",
                                             headers={"Authorization": f"Bearer {TOKEN}"})
        client = LedgerClient(transport)
        try:
            assert await client.get_balance("run_d") == ledger.get_balance("run_d")
            with pytest.raises(UpstreamProblem) as exc:
                await client.create_charge(ChargeCreate(account_id="run_d", usage=[decode(10**9)], purpose="x", idempotency_key="k"))
            assert exc.value.status == 402
        finally:
            await client.close()

    asyncio.run(read())


def test_a_closed_hold_is_a_409_whose_status_is_the_http_status(ledger: LedgerClient) -> None:
    """RFC 9457: ``status`` is the HTTP status code; the hold's own state travels as ``hold_status``."""
    ledger.open_account(AccountCreate(account_id="run_e", budget_usd_micros=1_000_000))
    hold = ledger.create_hold(HoldCreate(account_id="run_e", usage=[decode(1000)], purpose="job", idempotency_key="h"))
    ledger.release_hold(hold.hold_id, HoldRelease(idempotency_key="rel"))
    with pytest.raises(UpstreamProblem) as exc:
        ledger.charge_hold(hold.hold_id, HoldCharge(usage=[decode(1)], idempotency_key="c"))
    assert exc.value.status == 409 and exc.value.problem["status"] == 409
    assert exc.value.problem["code"] == "hold_closed" and exc.value.problem["hold_status"] == "released"


def test_an_error_may_not_overwrite_a_problem_member() -> None:
    from services.common.errors import Conflict

    with pytest.raises(TypeError, match="reserved"):
        Conflict("closed", status="released")

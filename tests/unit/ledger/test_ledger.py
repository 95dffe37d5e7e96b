"""The budget ledger: holds, charges, idempotency and no overdraft, on SQLite and on PostgreSQL.

Each backend gets one real database for the module (a SQLite file; a throwaway PostgreSQL database
created and dropped here, skipped only if PostgreSQL is unreachable). Every test opens its own accounts.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import secrets
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import func, select, text, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from services.common.db import Database, migrate
from services.common.errors import Conflict, CrucibleError, NotFound, PaymentRequired
from services.common.ids import new_id
from services.ledger import models
from services.ledger.app import MIGRATIONS_DIR, create_app
from services.ledger.pricing import load_prices
from services.ledger.repository import recompute_balance
from services.ledger.schemas import AccountCreate, ChargeCreate, HoldCharge, HoldCreate, HoldRelease, HoldSettle, RefundCreate, UsageItem, UsageKind
from services.ledger.service import BudgetMismatch, HoldClosed, HoldExceeded, IdempotencyKeyReused, Ledger, RefundExceedsCharge
from services.ledger.settings import LedgerSettings
from tests.conftest import PG_ADMIN, throwaway_databases

TOKEN = "test-service-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MODEL = "smollm2-135m-instruct"
DECODE_PER_1K = 400  # micro-USD for 1,000 decode tokens of MODEL ($0.40 per 1M)
TRAIN_PER_1K = 2_000  # micro-USD for 1,000 training tokens of MODEL ($2 per 1M)
@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with throwaway_databases(["ledger"], request.param, tmp_path_factory.mktemp("ledger")) as urls:
        migrate(urls["ledger"], MIGRATIONS_DIR)
        yield urls["ledger"]


@pytest.fixture
def ledger(db_url: str) -> Iterator[Ledger]:
    db = Database(db_url)
    ledger = Ledger(db, load_prices())
    yield ledger
    ledger.close()
    db.engine.dispose()


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(LedgerSettings(database_url=db_url, service_token="ledger-own-token", trusted_tokens={"trainer": TOKEN}))) as c:
        yield c


def decode(tokens: int) -> UsageItem:
    return UsageItem(kind="decode_tokens", quantity=tokens, model=MODEL)


def train(tokens: int) -> UsageItem:
    return UsageItem(kind="training_tokens", quantity=tokens, model=MODEL)


def open_account(ledger: Ledger, budget: int) -> str:
    account_id = new_id("run")
    ledger.open_account(AccountCreate(account_id=account_id, budget_usd_micros=budget))
    return account_id


def key() -> str:
    return secrets.token_hex(8)


def assert_cached_balance_matches_entries(ledger: Ledger, account_id: str) -> None:
    with ledger.db.session() as s:
        acct = s.get(models.Account, account_id)
        totals = recompute_balance(s, account_id)
        holds = s.scalars(select(models.Hold).where(models.Hold.account_id == account_id)).all()
    assert (totals.budget_usd_micros, totals.held_usd_micros, totals.spent_usd_micros) == (
        acct.budget_usd_micros,
        acct.held_usd_micros,
        acct.spent_usd_micros,
    )
    assert acct.held_usd_micros == sum(h.left_usd_micros for h in holds if h.status == "open")
    assert acct.remaining_usd_micros >= 0


def run_concurrently(n: int, call: Callable[[int], Any]) -> list[Any]:
    """Run ``call(i)`` for i in range(n) on n threads released together; each result or raised error."""
    barrier = threading.Barrier(n)

    def one(i: int) -> Any:
        barrier.wait()
        try:
            return call(i)
        except CrucibleError as err:
            return err

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(one, range(n)))


# -- holds ----------------------------------------------------------------------------------------


def test_hold_settled_for_less_releases_the_rest(ledger: Ledger) -> None:
    account_id = open_account(ledger, 1_000_000)
    hold = ledger.create_hold(HoldCreate(account_id=account_id, usage=[train(300_000)], purpose="training job job_x", idempotency_key=key()))
    assert hold.amount_usd_micros == 300 * TRAIN_PER_1K
    assert hold.status == "open" and hold.hold_id.startswith("hold_")
    balance = ledger.balance(account_id)
    assert (balance.held_usd_micros, balance.spent_usd_micros, balance.remaining_usd_micros) == (600_000, 0, 400_000)

    settled = ledger.settle_hold(hold.hold_id, HoldSettle(usage=[train(100_000)], idempotency_key=key()))
    assert (settled.status, settled.charged_usd_micros, settled.released_usd_micros) == ("settled", 200_000, 400_000)
    assert settled.closed_at is not None

    balance = ledger.balance(account_id)
    assert (balance.held_usd_micros, balance.spent_usd_micros, balance.remaining_usd_micros) == (0, 200_000, 800_000)
    assert balance.spent_by_kind["training_tokens"] == 200_000
    assert balance.usage_by_kind["training_tokens"] == 100_000
    assert balance.spent_by_kind["decode_tokens"] == 0
    types = [e.type for e in ledger.entries(account_id)]
    assert types == ["grant", "hold", "charge", "release"]
    assert_cached_balance_matches_entries(ledger, account_id)


def test_a_hold_whose_holder_died_expires_and_frees_its_money(ledger: Ledger) -> None:
    account_id = open_account(ledger, 100_000)
    stray = ledger.create_hold(HoldCreate(account_id=account_id, usage=[decode(200_000)], purpose="inference x", idempotency_key=key(), ttl_s=60))
    kept = ledger.create_hold(HoldCreate(account_id=account_id, usage=[decode(10_000)], purpose="training y", idempotency_key=key()))
    assert stray.expires_at is not None and kept.expires_at is None
    with pytest.raises(PaymentRequired):  # 80,000 + 4,000 of 100,000 are held
        ledger.create_hold(HoldCreate(account_id=account_id, usage=[decode(50_000)], purpose="z", idempotency_key=key()))
    assert ledger.expire_holds(now=stray.expires_at - dt.timedelta(seconds=1)) == 0

    assert ledger.expire_holds(now=stray.expires_at + dt.timedelta(seconds=1)) == 1
    assert ledger.get_hold(stray.hold_id).status == "expired"
    assert ledger.get_hold(kept.hold_id).status == "open"
    assert ledger.balance(account_id).held_usd_micros == 4_000
    with pytest.raises(HoldClosed):
        ledger.charge_hold(stray.hold_id, HoldCharge(usage=[decode(1)], idempotency_key=key()))
    assert [e.type for e in ledger.entries(account_id)] == ["grant", "hold", "hold", "release"]
    assert_cached_balance_matches_entries(ledger, account_id)


def test_an_expired_hold_is_released_before_the_next_hold_is_checked(ledger: Ledger) -> None:
    account_id = open_account(ledger, 100_000)
    stray = ledger.create_hold(HoldCreate(account_id=account_id, usage=[decode(200_000)], purpose="inference x", idempotency_key=key(), ttl_s=1))
    with ledger.db.session() as s:  # its ttl ran out before any sweep came by
        s.execute(update(models.Hold).where(models.Hold.hold_id == stray.hold_id).values(expires_at=stray.created_at))
    ledger.create_hold(HoldCreate(account_id=account_id, usage=[decode(200_000)], purpose="inference y", idempotency_key=key()))
    assert ledger.get_hold(stray.hold_id).status == "expired"
    assert_cached_balance_matches_entries(ledger, account_id)


def test_short_calls_are_charged_against_a_prior_hold_up_to_its_amount(ledger: Ledger) -> None:
    account_id = open_account(ledger, 100_000)
    hold = ledger.create_hold(HoldCreate(account_id=account_id, usage=[decode(10_000)], purpose="chat", idempotency_key=key()))
    assert hold.amount_usd_micros == 10 * DECODE_PER_1K

    after = ledger.charge_hold(hold.hold_id, HoldCharge(usage=[decode(4_000)], idempotency_key=key()))
    assert (after.charged_usd_micros, after.status) == (4 * DECODE_PER_1K, "open")
    with pytest.raises(HoldExceeded) as exc:
        ledger.charge_hold(hold.hold_id, HoldCharge(usage=[decode(7_000)], idempotency_key=key()))
    assert exc.value.extra["hold_remaining_usd_micros"] == 6 * DECODE_PER_1K
    assert exc.value.extra["required_usd_micros"] == 7 * DECODE_PER_1K

    released = ledger.release_hold(hold.hold_id, HoldRelease(idempotency_key=key()))
    assert (released.status, released.charged_usd_micros, released.released_usd_micros) == ("released", 1_600, 2_400)
    with pytest.raises(HoldClosed):
        ledger.charge_hold(hold.hold_id, HoldCharge(usage=[decode(1)], idempotency_key=key()))
    with pytest.raises(HoldClosed):
        ledger.release_hold(hold.hold_id, HoldRelease(idempotency_key=key()))
    assert ledger.balance(account_id).remaining_usd_micros == 100_000 - 1_600
    assert_cached_balance_matches_entries(ledger, account_id)


def test_settling_twice_with_the_same_key_returns_the_same_hold(ledger: Ledger) -> None:
    account_id = open_account(ledger, 100_000)
    hold = ledger.create_hold(HoldCreate(account_id=account_id, usage=[decode(10_000)], purpose="eval", idempotency_key=key()))
    settle = HoldSettle(usage=[decode(1_000)], idempotency_key="settle-1")
    first = ledger.settle_hold(hold.hold_id, settle)
    assert ledger.settle_hold(hold.hold_id, settle) == first
    assert len(ledger.entries(account_id)) == 4  # grant, hold, charge, release: the repeat wrote nothing
    with pytest.raises(HoldClosed):
        ledger.settle_hold(hold.hold_id, HoldSettle(usage=[], idempotency_key="settle-2"))
    with pytest.raises(IdempotencyKeyReused):
        ledger.settle_hold(hold.hold_id, HoldSettle(usage=[decode(2_000)], idempotency_key="settle-1"))
    assert ledger.get_hold(hold.hold_id) == first


def test_settle_with_no_usage_releases_everything(ledger: Ledger) -> None:
    account_id = open_account(ledger, 10_000)
    hold = ledger.create_hold(HoldCreate(account_id=account_id, usage=[decode(5_000)], purpose="job", idempotency_key=key()))
    settled = ledger.settle_hold(hold.hold_id, HoldSettle(idempotency_key=key()))
    assert (settled.status, settled.charged_usd_micros, settled.released_usd_micros) == ("settled", 0, 2_000)
    assert ledger.balance(account_id).remaining_usd_micros == 10_000


# -- budget exhaustion ----------------------------------------------------------------------------


def test_exhausted_budget_gets_402_with_remaining_and_reads_still_work(ledger: Ledger) -> None:
    account_id = open_account(ledger, 1_000)
    ledger.charge(ChargeCreate(account_id=account_id, usage=[decode(2_000)], purpose="chat", idempotency_key=key()))
    with pytest.raises(PaymentRequired) as exc:
        ledger.charge(ChargeCreate(account_id=account_id, usage=[decode(1_000)], purpose="chat", idempotency_key=key()))
    assert exc.value.extra["remaining_usd_micros"] == 200
    assert exc.value.extra["required_usd_micros"] == 400
    with pytest.raises(PaymentRequired) as exc:
        ledger.create_hold(HoldCreate(account_id=account_id, usage=[decode(1_000)], purpose="job", idempotency_key=key()))
    assert exc.value.extra["remaining_usd_micros"] == 200

    ledger.charge(ChargeCreate(account_id=account_id, usage=[decode(500)], purpose="chat", idempotency_key=key()))
    balance = ledger.balance(account_id)
    assert (balance.spent_usd_micros, balance.remaining_usd_micros) == (1_000, 0)
    with pytest.raises(PaymentRequired) as exc:
        ledger.charge(ChargeCreate(account_id=account_id, usage=[decode(1)], purpose="chat", idempotency_key=key()))
    assert exc.value.extra["remaining_usd_micros"] == 0
    assert len(ledger.entries(account_id)) == 3
    assert ledger.usage_by_hour(account_id)[0].quantity == 2_500
    assert account_id in {b.account_id for b in ledger.balances()}


def test_budget_never_overdrawn_under_race(ledger: Ledger) -> None:
    account_id = open_account(ledger, 100 * DECODE_PER_1K)

    def charge(i: int) -> Any:
        return ledger.charge(ChargeCreate(account_id=account_id, usage=[decode(1_000)], purpose=f"call {i}", idempotency_key=f"call-{i}"))

    results = run_concurrently(200, charge)
    refused = [r for r in results if isinstance(r, PaymentRequired)]
    assert len(refused) == 100
    assert len(results) - len(refused) == 100
    assert all(not isinstance(r, Exception) or isinstance(r, PaymentRequired) for r in results)
    assert all(r.remaining_usd_micros >= 0 for r in results if not isinstance(r, Exception))
    balance = ledger.balance(account_id)
    assert (balance.spent_usd_micros, balance.remaining_usd_micros) == (100 * DECODE_PER_1K, 0)
    assert_cached_balance_matches_entries(ledger, account_id)


def test_holds_never_overdraw_under_race(ledger: Ledger) -> None:
    account_id = open_account(ledger, 10 * TRAIN_PER_1K)

    def hold(i: int) -> Any:
        return ledger.create_hold(HoldCreate(account_id=account_id, usage=[train(1_000)], purpose=f"job {i}", idempotency_key=f"job-{i}"))

    results = run_concurrently(30, hold)
    assert sum(1 for r in results if isinstance(r, PaymentRequired)) == 20
    assert ledger.balance(account_id).held_usd_micros == 10 * TRAIN_PER_1K
    assert_cached_balance_matches_entries(ledger, account_id)


def test_database_refuses_an_overdraft_even_if_the_code_would_write_one(ledger: Ledger) -> None:
    account_id = open_account(ledger, 1_000)
    with pytest.raises(IntegrityError), ledger.db.session() as s:
        s.execute(update(models.Account).where(models.Account.account_id == account_id).values(spent_usd_micros=1_001))
    assert ledger.balance(account_id).remaining_usd_micros == 1_000


# -- idempotency ----------------------------------------------------------------------------------


def test_same_key_fifty_times_concurrently_writes_once(ledger: Ledger) -> None:
    account_id = open_account(ledger, 1_000_000)
    body = ChargeCreate(account_id=account_id, usage=[decode(1_000), train(1_000)], purpose="chat", idempotency_key="once")
    results = run_concurrently(50, lambda _i: ledger.charge(body))
    assert all(r == results[0] for r in results), {type(r) for r in results}
    assert [line.entry_id for line in results[0].lines] == [e.id for e in ledger.entries(account_id) if e.type == "charge"]
    with ledger.db.session() as s:
        n = s.scalar(select(func.count()).select_from(models.Entry).where(models.Entry.account_id == account_id, models.Entry.idempotency_key == "once"))
    assert n == 2  # one charge entry per usage item, written once
    assert ledger.balance(account_id).spent_usd_micros == DECODE_PER_1K + TRAIN_PER_1K


def test_same_hold_key_fifty_times_concurrently_places_one_hold(ledger: Ledger) -> None:
    account_id = open_account(ledger, 1_000_000)
    body = HoldCreate(account_id=account_id, usage=[train(10_000)], purpose="job", idempotency_key="hold-once")
    results = run_concurrently(50, lambda _i: ledger.create_hold(body))
    assert len({r.hold_id for r in results}) == 1
    assert len(ledger.holds(account_id)) == 1
    assert ledger.balance(account_id).held_usd_micros == 10 * TRAIN_PER_1K


def test_same_key_with_a_different_body_is_409(ledger: Ledger) -> None:
    account_id = open_account(ledger, 1_000_000)
    ledger.charge(ChargeCreate(account_id=account_id, usage=[decode(1_000)], purpose="chat", idempotency_key="k"))
    with pytest.raises(IdempotencyKeyReused):
        ledger.charge(ChargeCreate(account_id=account_id, usage=[decode(1_001)], purpose="chat", idempotency_key="k"))
    with pytest.raises(IdempotencyKeyReused):
        ledger.charge(ChargeCreate(account_id=account_id, usage=[decode(1_000)], purpose="other", idempotency_key="k"))
    assert len(ledger.entries(account_id)) == 2


def test_replay_returns_the_original_answer_after_the_hold_moved_on(ledger: Ledger) -> None:
    account_id = open_account(ledger, 1_000_000)
    body = HoldCreate(account_id=account_id, usage=[decode(10_000)], purpose="job", idempotency_key=key())
    hold = ledger.create_hold(body)
    charge = HoldCharge(usage=[decode(1_000)], idempotency_key=key())
    charged = ledger.charge_hold(hold.hold_id, charge)
    ledger.settle_hold(hold.hold_id, HoldSettle(idempotency_key=key()))
    assert ledger.create_hold(body) == hold
    assert ledger.charge_hold(hold.hold_id, charge) == charged
    assert [e.type for e in ledger.entries(account_id)] == ["grant", "hold", "charge", "release"]


def test_a_refused_call_stores_nothing_and_may_be_retried(ledger: Ledger) -> None:
    account_id = open_account(ledger, 1_000)
    hold = ledger.create_hold(HoldCreate(account_id=account_id, usage=[decode(2_000)], purpose="job", idempotency_key=key()))
    with pytest.raises(PaymentRequired):
        ledger.charge(ChargeCreate(account_id=account_id, usage=[decode(1_000)], purpose="chat", idempotency_key="retry"))
    ledger.release_hold(hold.hold_id, HoldRelease(idempotency_key=key()))
    ok = ledger.charge(ChargeCreate(account_id=account_id, usage=[decode(1_000)], purpose="chat", idempotency_key="retry"))
    assert ok.remaining_usd_micros == 600


# -- accounts, entries, prices --------------------------------------------------------------------


def test_opening_an_account_twice(ledger: Ledger) -> None:
    account_id = new_id("run")
    results = run_concurrently(10, lambda _i: ledger.open_account(AccountCreate(account_id=account_id, budget_usd_micros=5_000)))
    assert sorted(created for _account, created in results) == [False] * 9 + [True]
    assert [e.type for e in ledger.entries(account_id)] == ["grant"]
    with pytest.raises(BudgetMismatch):
        ledger.open_account(AccountCreate(account_id=account_id, budget_usd_micros=6_000))
    with pytest.raises(NotFound):
        ledger.balance(new_id("run"))
    assert isinstance(BudgetMismatch("x"), Conflict)


def test_mixed_workload_cached_balance_matches_entries(ledger: Ledger) -> None:
    accounts = [open_account(ledger, 200_000) for _ in range(3)]

    def worker(i: int) -> None:
        rng = random.Random(i)
        for step in range(25):
            account_id = rng.choice(accounts)
            try:
                op = rng.random()
                if op < 0.35:
                    ledger.charge(ChargeCreate(account_id=account_id, usage=[decode(rng.randint(0, 20_000)), train(rng.randint(0, 5_000))], purpose="chat", idempotency_key=f"{i}-{step}"))
                    continue
                hold = ledger.create_hold(HoldCreate(account_id=account_id, usage=[train(rng.randint(1, 20_000))], purpose="job", idempotency_key=f"{i}-{step}"))
                if rng.random() < 0.5:
                    ledger.charge_hold(hold.hold_id, HoldCharge(usage=[train(rng.randint(0, 25_000))], idempotency_key=f"{i}-{step}-c"))
                if op < 0.7:
                    ledger.settle_hold(hold.hold_id, HoldSettle(usage=[train(rng.randint(0, 15_000))], idempotency_key=f"{i}-{step}-s"))
                elif op < 0.9:
                    ledger.release_hold(hold.hold_id, HoldRelease(idempotency_key=f"{i}-{step}-r"))
                # else: the hold stays open
            except (PaymentRequired, HoldExceeded):
                pass

    run_concurrently(8, worker)
    for account_id in accounts:
        assert_cached_balance_matches_entries(ledger, account_id)
        balance = ledger.balance(account_id)
        assert sum(balance.spent_by_kind.values()) == balance.spent_usd_micros


def test_a_refund_gives_back_part_of_a_charge_once_and_never_more_than_it(ledger: Ledger) -> None:
    account_id = open_account(ledger, 10_000)
    charge = ledger.charge(ChargeCreate(account_id=account_id, usage=[decode(10_000)], purpose="calls", idempotency_key=key()))
    entry_id = charge.lines[0].entry_id
    first = RefundCreate(account_id=account_id, entry_id=entry_id, amount_usd_micros=1_500, reason="lost work", idempotency_key=key())
    refund = ledger.refund(first)
    assert (refund.amount_usd_micros, refund.refund_of, refund.remaining_usd_micros) == (1_500, entry_id, 10_000 - 4_000 + 1_500)
    assert ledger.refund(first) == refund  # same key: the first answer, nothing written
    listed = ledger.entries(account_id)[-1]  # the entry names the charge it refunds
    assert (listed.type, listed.refund_of, listed.amount_usd_micros) == ("refund", entry_id, 1_500)
    bal = ledger.balance(account_id)
    assert bal.spent_usd_micros == 2_500 and bal.spent_by_kind["decode_tokens"] == 2_500 and bal.usage_by_kind["decode_tokens"] == 10_000

    with pytest.raises(RefundExceedsCharge) as exc:
        ledger.refund(RefundCreate(account_id=account_id, entry_id=entry_id, amount_usd_micros=2_501, reason="too much", idempotency_key=key()))
    assert exc.value.extra["refundable_usd_micros"] == 2_500
    rest = ledger.refund(RefundCreate(account_id=account_id, entry_id=entry_id, reason="the rest", idempotency_key=key()))
    assert rest.amount_usd_micros == 2_500 and ledger.balance(account_id).spent_usd_micros == 0
    with pytest.raises(RefundExceedsCharge):
        ledger.refund(RefundCreate(account_id=account_id, entry_id=entry_id, reason="again", idempotency_key=key()))

    hold_entry = next(e for e in ledger.entries(account_id) if e.type == "grant")
    with pytest.raises(NotFound):  # only charges can be refunded
        ledger.refund(RefundCreate(account_id=account_id, entry_id=hold_entry.id, reason="not a charge", idempotency_key=key()))
    other = open_account(ledger, 10_000)
    with pytest.raises(NotFound):  # nor another account's charge
        ledger.refund(RefundCreate(account_id=other, entry_id=entry_id, reason="cross-account", idempotency_key=key()))
    assert [e.type for e in ledger.entries(account_id)] == ["grant", "charge", "refund", "refund"]
    assert_cached_balance_matches_entries(ledger, account_id)


def test_concurrent_refunds_never_give_back_more_than_the_charge(ledger: Ledger) -> None:
    account_id = open_account(ledger, 100_000)
    charge = ledger.charge(ChargeCreate(account_id=account_id, usage=[decode(10_000)], purpose="calls", idempotency_key=key()))
    refunds = run_concurrently(20, lambda i: ledger.refund(RefundCreate(
        account_id=account_id, entry_id=charge.lines[0].entry_id, amount_usd_micros=1_000, reason=f"r{i}", idempotency_key=f"r{i}")))
    assert sum(1 for r in refunds if not isinstance(r, CrucibleError)) == 4  # 4 × 1,000 of the 4,000 charged
    assert all(isinstance(r, RefundExceedsCharge) for r in refunds if isinstance(r, CrucibleError))
    assert ledger.balance(account_id).spent_usd_micros == 0
    assert_cached_balance_matches_entries(ledger, account_id)


def test_cached_prompt_tokens_have_their_own_price(ledger: Ledger) -> None:
    account_id = open_account(ledger, 1_000_000)
    charge = ledger.charge(ChargeCreate(account_id=account_id, usage=[
        UsageItem(kind="prefill_tokens", quantity=100_000, model=MODEL),
        UsageItem(kind="cached_prefill_tokens", quantity=100_000, model=MODEL)], purpose="calls", idempotency_key=key()))
    assert [line.amount_usd_micros for line in charge.lines] == [10_000, 2_500]  # $0.10 and $0.025 per 1M
    assert ledger.balance(account_id).spent_by_kind["cached_prefill_tokens"] == 2_500


def test_entries_are_append_only(ledger: Ledger) -> None:
    account_id = open_account(ledger, 1_000)
    with pytest.raises(RuntimeError, match="append-only"), ledger.db.session() as s:
        entry = s.scalars(select(models.Entry).where(models.Entry.account_id == account_id)).one()
        entry.amount_usd_micros = 1
    with pytest.raises(RuntimeError, match="append-only"), ledger.db.session() as s:
        s.delete(s.scalars(select(models.Entry).where(models.Entry.account_id == account_id)).one())
    assert ledger.entries(account_id)[0].amount_usd_micros == 1_000


def test_the_database_itself_refuses_to_change_or_delete_an_entry(ledger: Ledger) -> None:
    account_id = open_account(ledger, 1_000)
    for statement in ("UPDATE entries SET amount_usd_micros = 1 WHERE account_id = :a", "DELETE FROM entries WHERE account_id = :a"):
        with pytest.raises(DBAPIError, match="append-only"), ledger.db.engine.begin() as conn:
            conn.execute(text(statement), {"a": account_id})
    assert ledger.entries(account_id)[0].amount_usd_micros == 1_000


def test_usage_is_priced_per_model_with_a_default_and_rounded_up(ledger: Ledger) -> None:
    account_id = open_account(ledger, 10_000_000)
    charge = ledger.charge(
        ChargeCreate(
            account_id=account_id,
            usage=[
                decode(1),  # 0.4 micro-USD rounds up to 1
                UsageItem(kind="decode_tokens", quantity=1_000, model=None),  # default row: $4 per 1M
                UsageItem(kind="decode_tokens", quantity=1_000, model="some-other-model"),
                UsageItem(kind="prefill_tokens", quantity=0, model=MODEL),
                UsageItem(kind="sandbox_seconds", quantity=3_600),
                UsageItem(kind="storage_gb_hours", quantity=2),
            ],
            purpose="mix",
            idempotency_key=key(),
        )
    )
    assert [line.amount_usd_micros for line in charge.lines] == [1, 4_000, 4_000, 0, 36_000, 200]
    assert charge.amount_usd_micros == sum(line.amount_usd_micros for line in charge.lines)
    assert {e.price_version for e in ledger.entries(account_id)} == {ledger.prices.version}


def test_price_table_comes_from_the_configured_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "prices.yaml"
    rows = "".join(f"  - {{kind: {k}, model: '*', usd_micros_per_million_units: 1000000}}\n" for k in UsageKind)
    table.write_text("version: test-1\nprices:\n" + rows)
    monkeypatch.setenv("CRUCIBLE_LEDGER_PRICES", str(table))
    prices = load_prices(LedgerSettings().ledger_prices)
    assert prices.version == "test-1"
    assert prices.unit_price("decode_tokens", MODEL) == 1_000_000

    table.write_text("version: test-2\nprices:\n" + rows.split("\n", 1)[1])  # no training_tokens default
    with pytest.raises(ValueError, match="training_tokens"):
        load_prices(table)


# -- HTTP -----------------------------------------------------------------------------------------


def test_internal_routes_require_the_service_token(client: TestClient) -> None:
    for headers in ({}, {"Authorization": "Bearer crk_a-run-key"}, {"Authorization": TOKEN}, {"Authorization": "Bearer ledger-own-token"}):
        r = client.get("/internal/prices", headers=headers)
        assert r.status_code == 401
        assert r.headers["content-type"] == "application/problem+json"
        r = client.post("/internal/accounts", json={"account_id": new_id("run"), "budget_usd_micros": 1}, headers=headers)
        assert r.status_code == 401
    shipped = yaml.safe_load((Path(__file__).parents[3] / "services" / "ledger" / "prices.yaml").read_text())["version"]
    assert client.get("/internal/prices", headers=AUTH).json()["version"] == shipped


def test_http_hold_lifecycle(client: TestClient) -> None:
    account_id = new_id("run")
    body = {"account_id": account_id, "budget_usd_micros": 1_000_000}
    assert client.post("/internal/accounts", json=body, headers=AUTH).status_code == 201
    assert client.post("/internal/accounts", json=body, headers=AUTH).status_code == 200
    r = client.post("/internal/accounts", json={**body, "budget_usd_micros": 2}, headers=AUTH)
    assert (r.status_code, r.json()["code"]) == (409, "account_exists")

    hold_body = {"account_id": account_id, "usage": [{"kind": "training_tokens", "quantity": 100_000, "model": MODEL}], "purpose": "training job job_1", "idempotency_key": "job_1:hold"}
    r = client.post("/internal/holds", json=hold_body, headers=AUTH)
    assert r.status_code == 201
    hold = r.json()
    assert client.post("/internal/holds", json=hold_body, headers=AUTH).json() == hold
    hold_id = hold["hold_id"]
    r = client.post(f"/internal/holds/{hold_id}/charges", json={"usage": [{"kind": "decode_tokens", "quantity": 1000, "model": MODEL}], "idempotency_key": "c1"}, headers=AUTH)
    assert (r.status_code, r.json()["charged_usd_micros"]) == (200, DECODE_PER_1K)
    r = client.post(f"/internal/holds/{hold_id}/settle", json={"usage": [{"kind": "training_tokens", "quantity": 50_000, "model": MODEL}], "idempotency_key": "s1"}, headers=AUTH)
    assert r.json()["status"] == "settled"
    assert client.get(f"/internal/holds/{hold_id}", headers=AUTH).json() == r.json()
    r = client.post(f"/internal/holds/{hold_id}/release", json={"idempotency_key": "r1"}, headers=AUTH)
    assert (r.status_code, r.json()["code"]) == (409, "hold_closed")

    balance = client.get(f"/internal/accounts/{account_id}", headers=AUTH).json()
    assert balance["spent_usd_micros"] == DECODE_PER_1K + 50 * TRAIN_PER_1K
    assert balance["remaining_usd_micros"] == 1_000_000 - balance["spent_usd_micros"]
    entries = client.get(f"/internal/accounts/{account_id}/entries", headers=AUTH).json()
    assert [e["type"] for e in entries] == ["grant", "hold", "charge", "charge", "release"]
    assert all(e["id"].startswith("ent_") for e in entries)
    later = client.get(f"/internal/accounts/{account_id}/entries", params={"after": entries[1]["id"], "limit": 2}, headers=AUTH).json()
    assert [e["id"] for e in later] == [e["id"] for e in entries[2:4]]
    usage = client.get(f"/internal/accounts/{account_id}/usage", params={"bucket": "hour"}, headers=AUTH).json()
    assert {u["kind"]: u["quantity"] for u in usage} == {"decode_tokens": 1000, "training_tokens": 50_000}
    assert client.get(f"/internal/accounts/{account_id}/holds", params={"status": "open"}, headers=AUTH).json() == []
    assert client.get(f"/internal/accounts/{new_id('run')}", headers=AUTH).status_code == 404
    assert client.get(f"/internal/holds/{new_id('hold')}", headers=AUTH).status_code == 404


def test_http_402_is_problem_json_with_remaining(client: TestClient) -> None:
    account_id = new_id("run")
    client.post("/internal/accounts", json={"account_id": account_id, "budget_usd_micros": 300}, headers=AUTH)
    r = client.post("/internal/charges", json={"account_id": account_id, "usage": [{"kind": "decode_tokens", "quantity": 1000, "model": MODEL}], "purpose": "chat", "idempotency_key": "c1"}, headers=AUTH)
    assert r.status_code == 402
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert (problem["code"], problem["remaining_usd_micros"], problem["required_usd_micros"]) == ("budget_exhausted", 300, 400)
    assert client.get(f"/internal/accounts/{account_id}", headers=AUTH).status_code == 200


def test_http_422_names_the_field(client: TestClient) -> None:
    account_id = new_id("run")
    client.post("/internal/accounts", json={"account_id": account_id, "budget_usd_micros": 300}, headers=AUTH)
    base = {"account_id": account_id, "purpose": "chat", "idempotency_key": "c1"}
    cases = [
        ({**base, "usage": [{"kind": "gpu_hours", "quantity": 1}]}, "usage.0.kind"),
        ({**base, "usage": [{"kind": "decode_tokens", "quantity": -1}]}, "usage.0.quantity"),
        ({**base, "usage": [{"kind": "decode_tokens", "quantity": 1}], "amount_usd": 5}, "amount_usd"),
        ({k: v for k, v in base.items() if k != "idempotency_key"} | {"usage": [{"kind": "decode_tokens", "quantity": 1}]}, "idempotency_key"),
    ]
    for body, field in cases:
        r = client.post("/internal/charges", json=body, headers=AUTH)
        assert r.status_code == 422, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["field"] == field
    r = client.post("/internal/accounts", json={"account_id": new_id("run"), "budget_usd_micros": -1}, headers=AUTH)
    assert (r.status_code, r.json()["field"]) == (422, "budget_usd_micros")


def test_http_refund_is_201_then_409_past_the_charge(client: TestClient) -> None:
    account_id = new_id("run")
    client.post("/internal/accounts", json={"account_id": account_id, "budget_usd_micros": 10_000}, headers=AUTH)
    charge = client.post("/internal/charges", headers=AUTH, json={
        "account_id": account_id, "usage": [{"kind": "decode_tokens", "quantity": 1000, "model": MODEL}], "purpose": "calls", "idempotency_key": "c1"}).json()
    body = {"account_id": account_id, "entry_id": charge["lines"][0]["entry_id"], "reason": "lost work", "idempotency_key": "r1"}
    r = client.post("/internal/refunds", json=body, headers=AUTH)
    assert (r.status_code, r.json()["amount_usd_micros"]) == (201, DECODE_PER_1K)
    again = client.post("/internal/refunds", json={**body, "idempotency_key": "r2"}, headers=AUTH)
    assert again.status_code == 409 and again.headers["content-type"] == "application/problem+json"
    assert again.json()["refundable_usd_micros"] == 0
    missing = client.post("/internal/refunds", json={**body, "entry_id": "ent_nope", "idempotency_key": "r3"}, headers=AUTH)
    assert missing.status_code == 404 and missing.json()["field"] == "entry_id"


def test_on_postgresql_the_common_path_is_one_function_call_and_survives_a_dropped_connection(ledger: Ledger) -> None:
    if ledger.db.engine.dialect.name != "postgresql":
        pytest.skip("the one-call path exists on PostgreSQL only; SQLite runs the general path (every other test)")
    calls: list[Any] = []
    real = ledger._call
    ledger._call = lambda stmt, params: calls.append(real(stmt, params)) or calls[-1]  # type: ignore[method-assign]
    account_id = open_account(ledger, 10_000)
    hold = ledger.create_hold(HoldCreate(account_id=account_id, usage=[decode(10_000)], purpose="p", idempotency_key="h"))
    settled = ledger.settle_hold(hold.hold_id, HoldSettle(usage=[decode(2_500)], idempotency_key="s"))
    assert calls[0] is True and json.loads(calls[1])["status"] == "settled" and len(calls) == 2  # no general-path fallback
    assert (settled.charged_usd_micros, settled.released_usd_micros) == (1_000, 3_000)
    assert ledger.settle_hold(hold.hold_id, HoldSettle(usage=[decode(2_500)], idempotency_key="s")) == settled  # replay: general path
    assert_cached_balance_matches_entries(ledger, account_id)

    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:  # the server drops every connection of the ledger's pool (as a restart would)
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                      (ledger.db.engine.url.database,))
    again = ledger.create_hold(HoldCreate(account_id=account_id, usage=[decode(1_000)], purpose="p", idempotency_key="h2"))
    assert again.status == "open" and calls[-1] is True
    assert_cached_balance_matches_entries(ledger, account_id)

"""The budget ledger's rules: accounts, holds, charges, refunds, balances and usage. No HTTP and no SQL here: every
statement is a function of :mod:`services.ledger.repository`.

Every mutating call is one transaction that first takes the account row's lock, with the balance check in the same
statement where it can be: a conditional ``UPDATE accounts … WHERE budget − held − spent >= amount`` for holds and
charges (``repository.reserve``; the row lock comes with it; on SQLite every transaction is ``BEGIN IMMEDIATE``,
which serializes writers), ``SELECT … FOR UPDATE`` on the account before a hold is changed. Entries and the cached
totals are written in that transaction, so all mutations of one account are serialized, no check can be raced past,
and nothing is ever half-written. The common path of a hold, a settle or a charge is four or five statements and one
commit; on PostgreSQL it is one call of a function the migrations create (``repository.place_hold_in_one_call``,
``repository.take_in_one_call``), which applies the same rules, and the general path below runs only when it does
not apply (an error to raise, a replay, expired holds to release).

Idempotency keys are scoped to (account, operation): ``hold.create``, ``hold.charge``, ``hold.settle``,
``hold.release``, ``charge.create``, ``refund.create``. The answer is stored last in the same transaction
(``INSERT … ON CONFLICT DO NOTHING``); a repeat with the same key and the same request finds it taken, rolls
its own work back and returns the stored first answer; the same key with a different request is a 409.
Failed calls (402, 409, 404) store nothing, so they may be retried with the same key.

A hold placed with ``ttl_s`` expires: once ``expires_at`` has passed, what is left on it is released and
it is closed as ``expired``. Expiry happens when a new hold or charge on the account would not be covered
otherwise, and in a periodic sweep (:meth:`Ledger.expire_holds`), so a holder that dies never locks money for longer
than its ttl.

Entry arithmetic (all amounts are non-negative micro-USD; the type gives the sign):
``budget = Σ grant``, ``spent = Σ charge − Σ refund``,
``held = Σ hold − Σ release − Σ charge with a hold_id`` (``repository.recompute_balance`` checks it).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel
from sqlalchemy import Executable
from sqlalchemy.orm import Session

from services.common.db import Database, utcnow
from services.common.errors import Conflict, IdempotencyKeyReused, NotFound, PaymentRequired
from services.common.ids import new_id
from services.ledger import models, repository
from services.ledger.pricing import PriceBook, PricedItem, with_registered
from services.ledger.schemas import (
    Account,
    AccountCreate,
    Balance,
    Charge,
    ChargeCreate,
    ChargeLine,
    Entry,
    EntryType,
    Hold,
    HoldCharge,
    HoldCreate,
    HoldRelease,
    HoldSettle,
    HoldStatus,
    ModelPrices,
    Price,
    PriceTable,
    Refund,
    RefundCreate,
    UsageBucket,
    UsageItem,
    UsageKind,
)

ResponseT = TypeVar("ResponseT", bound=BaseModel)


class BudgetMismatch(Conflict):
    """The account exists with a different budget."""

    code, title = "account_exists", "The account already exists with a different budget"


class HoldClosed(Conflict):
    """The hold is settled or released; it takes no more charges."""

    code, title = "hold_closed", "The hold is already closed"


class RefundExceedsCharge(Conflict):
    """The refund is larger than what is left to refund of the charge."""

    code, title = "refund_exceeds_charge", "The refund exceeds what is left of the charge"


class HoldExceeded(Conflict):
    """The usage costs more than is left on the hold (a hold is an upper bound)."""

    code, title = "hold_exceeded", "Usage exceeds what is left on the hold"


def _fingerprint(operation: str, target: str, body: BaseModel) -> str:
    payload = {"operation": operation, "target": target, "body": body.model_dump(mode="json", exclude={"idempotency_key"})}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Ledger:
    """The ledger over one database and one price table; each method is one transaction."""

    def __init__(self, db: Database, prices: PriceBook) -> None:
        self.db = db
        self.base_prices = prices  # prices.yaml; ``prices`` adds the registered models' rows (``reload_prices``)
        self.prices = prices
        # PostgreSQL: the common path of a hold and of a charge/settle/release is one call of a function the
        # migrations create, in its own transaction (one round trip); anything else takes the general path.
        self._postgres = db.engine.dialect.name == "postgresql"
        self._autocommit = repository.autocommit_engine(db.engine.url) if self._postgres else None

    # -- accounts ---------------------------------------------------------------------------------

    def open_account(self, body: AccountCreate) -> tuple[Account, bool]:
        """Create the account with a ``grant`` entry for its budget; ``(account, created)``.

        Opening an existing account with the same budget returns it (``created`` false); with a different
        budget raises ``BudgetMismatch``.
        """
        with self.db.session() as s:
            acct = repository.account_for_update_or_none(s, body.account_id)
            created = False
            if acct is None:
                now = utcnow()
                acct = repository.insert_account(s, body.account_id, body.budget_usd_micros, now)
                if acct is None:  # opened concurrently (PostgreSQL); the other one committed first
                    acct = repository.account_for_update(s, body.account_id)
                else:
                    created = True
                    repository.append_entries(s, [self._entry(acct.account_id, EntryType.grant, body.budget_usd_micros, now, purpose="budget")])
            if acct.budget_usd_micros != body.budget_usd_micros:
                raise BudgetMismatch(
                    f"account {body.account_id} exists with budget_usd_micros={acct.budget_usd_micros}",
                    account_id=body.account_id,
                    budget_usd_micros=acct.budget_usd_micros,
                )
            return _account_out(acct), created

    def balance(self, account_id: str) -> Balance:
        """The account's cached balance with spending and usage by kind."""
        with self.db.session() as s:
            return self._balances(s, [repository.account(s, account_id)])[0]

    def balances(self) -> list[Balance]:
        """Every account's balance, oldest first."""
        with self.db.session() as s:
            return self._balances(s, repository.accounts(s))

    def _balances(self, s: Session, accts: list[models.Account]) -> list[Balance]:
        spent: dict[str, dict[str, int]] = defaultdict(lambda: {k.value: 0 for k in UsageKind})
        usage: dict[str, dict[str, int]] = defaultdict(lambda: {k.value: 0 for k in UsageKind})
        for account_id, type_, kind, amount, quantity in repository.charges_and_refunds_by_kind(s, [a.account_id for a in accts]):
            if type_ == EntryType.refund.value:  # refunds lower spending, not usage
                spent[account_id][kind] -= amount
            else:
                spent[account_id][kind] += amount
                usage[account_id][kind] += quantity
        return [
            Balance(
                account_id=a.account_id,
                budget_usd_micros=a.budget_usd_micros,
                held_usd_micros=a.held_usd_micros,
                spent_usd_micros=a.spent_usd_micros,
                remaining_usd_micros=a.remaining_usd_micros,
                spent_by_kind=spent[a.account_id],
                usage_by_kind=usage[a.account_id],
                price_version=self.prices.version,
            )
            for a in accts
        ]

    def entries(self, account_id: str, *, after: str | None = None, limit: int = 1000) -> list[Entry]:
        """The account's entries in append order, the first ``limit`` after entry ``after`` (if given)."""
        with self.db.session() as s:
            repository.account(s, account_id)
            after_seq = None
            if after is not None:
                after_seq = repository.entry_seq(s, account_id, after)
                if after_seq is None:
                    raise NotFound(f"no entry {after} in account {account_id}", field="after")
            return [_entry_out(e) for e in repository.entries_in_order(s, account_id, after_seq=after_seq, limit=limit)]

    def usage_by_hour(self, account_id: str) -> list[UsageBucket]:
        """Charged usage aggregated by UTC hour and kind, oldest hour first."""
        with self.db.session() as s:
            repository.account(s, account_id)
            charges = repository.charges_in_order(s, account_id)
        buckets: dict[tuple[dt.datetime, str], list[int]] = defaultdict(lambda: [0, 0])
        for created_at, kind, quantity, amount in charges:
            bucket = buckets[(created_at.replace(minute=0, second=0, microsecond=0), kind)]
            bucket[0] += quantity or 0
            bucket[1] += amount
        return [
            UsageBucket(hour=hour, kind=kind, quantity=q, amount_usd_micros=a)
            for (hour, kind), (q, a) in sorted(buckets.items(), key=lambda kv: (kv[0][0], kv[0][1]))
        ]

    # -- holds ------------------------------------------------------------------------------------

    def create_hold(self, body: HoldCreate) -> Hold:
        """Reserve the priced cost of ``body.usage``; ``PaymentRequired`` (402) if the free balance cannot cover it.

        Raises ``NotFound`` (no such account) and ``IdempotencyKeyReused`` (409: the key was used for another
        request). Common path: one function call on PostgreSQL, four statements in one transaction otherwise
        (the conditional reservation, the hold, its entry and the idempotency record).
        """
        amount = sum(p.amount_usd_micros for p in self.prices.price(body.usage))
        fingerprint = _fingerprint("hold.create", body.account_id, body)

        def new_hold(now: dt.datetime) -> Hold:
            return Hold(
                hold_id=new_id("hold"), account_id=body.account_id, amount_usd_micros=amount, charged_usd_micros=0, released_usd_micros=0,
                status=HoldStatus.open, purpose=body.purpose, price_version=self.prices.version, created_at=now,
                expires_at=now + dt.timedelta(seconds=body.ttl_s) if body.ttl_s else None,
            )

        if self._postgres:
            hold = new_hold(utcnow())
            try:
                if repository.place_hold_in_one_call(self._call, hold, entry_id=new_id("ent"), key=body.idempotency_key, fingerprint=fingerprint):
                    return hold
            except repository.KeyTaken:
                return self._replay(body.account_id, "hold.create", body.idempotency_key, fingerprint, Hold)

        def work(s: Session) -> tuple[str, Hold]:
            now = utcnow()
            self._reserve(s, body.account_id, amount, now, "held_usd_micros", "hold.create", body.idempotency_key)
            hold = new_hold(now)
            repository.insert_hold(s, hold)
            repository.append_entries(s, [self._entry(body.account_id, EntryType.hold, amount, now, hold_id=hold.hold_id,
                                                      purpose=body.purpose, key=body.idempotency_key)])
            return body.account_id, hold

        return self._once("hold.create", body.idempotency_key, fingerprint, Hold, work)

    def get_hold(self, hold_id: str) -> Hold:
        """The hold as it is now."""
        with self.db.session() as s:
            return _hold_out(repository.hold(s, hold_id))

    def holds(self, account_id: str, status: HoldStatus | None = None) -> list[Hold]:
        """The account's holds, oldest first, optionally only those in ``status``."""
        with self.db.session() as s:
            repository.account(s, account_id)
            return [_hold_out(h) for h in repository.holds_of_account(s, account_id, status)]

    def charge_hold(self, hold_id: str, body: HoldCharge) -> Hold:
        """Charge usage against an open hold; ``HoldExceeded`` (409) if it costs more than is left on it,
        ``HoldClosed`` (409) if the hold is closed, ``NotFound`` if there is no such hold."""
        return self._from_hold("hold.charge", hold_id, body, body.usage, body.purpose, close_as=None)

    def settle_hold(self, hold_id: str, body: HoldSettle) -> Hold:
        """Charge the final usage against the hold, release what is left and close it as ``settled``
        (errors as :meth:`charge_hold`)."""
        return self._from_hold("hold.settle", hold_id, body, body.usage, body.purpose, close_as=HoldStatus.settled)

    def release_hold(self, hold_id: str, body: HoldRelease) -> Hold:
        """Release what is left on the hold and close it as ``released`` (``HoldClosed`` if it is closed)."""
        return self._from_hold("hold.release", hold_id, body, [], None, close_as=HoldStatus.released)

    def _from_hold(
        self, operation: str, hold_id: str, body: BaseModel, usage: list[UsageItem], purpose: str | None, close_as: HoldStatus | None
    ) -> Hold:
        """Charge ``usage`` against the hold and, with ``close_as``, release the rest and close it: one transaction
        that locks the account, then updates the hold only if it is open and covers the charge."""
        priced = self.prices.price(usage)
        total = sum(p.amount_usd_micros for p in priced)
        fingerprint = _fingerprint(operation, hold_id, body)
        key: str = body.idempotency_key  # type: ignore[attr-defined]
        if self._postgres:
            try:
                taken = repository.take_in_one_call(self._call, hold_id, priced, close_as=close_as, purpose=purpose, price_version=self.prices.version,
                                                    key=key, operation=operation, fingerprint=fingerprint, now=utcnow())
            except repository.KeyTaken:
                with self.db.session() as s:
                    account_id = repository.account_of_hold(s, hold_id)
                return self._replay(account_id, operation, key, fingerprint, Hold)  # type: ignore[arg-type]
            if taken is not None:
                return taken

        def work(s: Session) -> tuple[str, Hold]:
            account_id = repository.lock_account_of_hold(s, hold_id)
            now = utcnow()
            hold = repository.take_from_hold(s, hold_id, total, close_as=close_as, now=now)
            if hold is None:
                _raise_if_answered(s, account_id, operation, key)
                row = repository.hold(s, hold_id)
                _require_open(row)
                raise HoldExceeded(
                    f"usage costs {total} micro-USD but hold {hold_id} has {row.left_usd_micros} left",
                    hold_id=hold_id, hold_remaining_usd_micros=row.left_usd_micros, required_usd_micros=total,
                )
            released = hold.released_usd_micros if close_as is not None else 0
            entries = [self._charge_entry(account_id, p, now, purpose=purpose or hold.purpose, key=key, hold_id=hold_id) for p in priced]
            if released:
                entries.append(self._entry(account_id, EntryType.release, released, now, hold_id=hold_id, purpose=hold.purpose, key=key))
            repository.append_entries(s, entries)
            repository.shift_totals(s, account_id, held_delta=-(total + released), spent_delta=total, now=now)
            return account_id, hold

        return self._once(operation, key, fingerprint, Hold, work)

    # -- registered models' prices ------------------------------------------------------------------

    def reload_prices(self) -> PriceBook:
        """The price table in force: ``prices.yaml`` with the registered models' rows (``model_prices``) in place of its
        own. Called at start-up and periodically, so every replica prices with the rows any of them registered."""
        with self.db.session() as s:
            rows = [Price(kind=UsageKind(r.kind), model=r.model, usd_micros_per_million_units=r.usd_micros_per_million_units)
                    for r in repository.registered_prices(s)]
        self.prices = with_registered(self.base_prices, rows)
        return self.prices

    def register_model_prices(self, model: str, body: ModelPrices) -> PriceTable:
        """Store ``model``'s prices (replacing those it had for the same kinds) and price with them from now on; the
        table's version changes with them. Repeating the same prices changes nothing."""
        now = utcnow()
        with self.db.session() as s:
            for kind, value in body.prices.items():
                repository.put_model_price(s, model, kind, value, now)
        return self.reload_prices().table()

    def expire_holds(self, now: dt.datetime | None = None) -> int:
        """Close every open hold whose ``expires_at`` has passed (status ``expired``); the number closed."""
        now = now or utcnow()
        with self.db.session() as s:
            accounts = repository.accounts_with_expired_holds(s, now)
        closed = 0
        for account_id in accounts:
            with self.db.session() as s:
                repository.account_for_update(s, account_id)  # the account's lock before its holds change
                closed += self._expire(s, account_id, now)
        return closed

    def _expire(self, s: Session, account_id: str, now: dt.datetime) -> int:
        """Within a transaction holding the account's lock: close its expired open holds as ``expired``, each with a
        ``release`` entry for what was left on it; the number closed."""
        closed = []
        for hold_id in repository.expired_hold_ids(s, account_id, now):
            hold = repository.take_from_hold(s, hold_id, 0, close_as=HoldStatus.expired, now=now)
            if hold is not None:  # always, under the account's lock: an open hold covers a charge of 0
                closed.append(hold)
        repository.append_entries(s, [self._entry(account_id, EntryType.release, h.released_usd_micros, now, hold_id=h.hold_id,
                                                  purpose=h.purpose, key=f"expire:{h.hold_id}") for h in closed if h.released_usd_micros])
        if closed:
            repository.shift_totals(s, account_id, held_delta=-sum(h.released_usd_micros for h in closed), now=now)
        return len(closed)

    def _reserve(self, s: Session, account_id: str, amount: int, now: dt.datetime, column: repository.TotalColumn, operation: str, key: str) -> int:
        """Add ``amount`` to the account's ``column`` (held or spent) if the free balance covers it; the
        remaining balance after it.

        One conditional UPDATE (which also locks the row). When it does not apply: ``NotFound`` for a missing
        account, the stored answer if this key was answered before (a replay must not get a 402), else expired
        holds are released and it is tried once more before ``PaymentRequired``.
        """
        if (remaining := repository.reserve(s, account_id, column, amount, now)) is not None:
            return remaining
        repository.account_for_update(s, account_id)  # NotFound for a missing account; else its lock
        _raise_if_answered(s, account_id, operation, key)
        self._expire(s, account_id, now)
        if (remaining := repository.reserve(s, account_id, column, amount, now)) is not None:  # expired holds, or funds freed before the lock
            return remaining
        left = repository.account_for_update(s, account_id).remaining_usd_micros  # fresh: after the expiry
        raise PaymentRequired(
            f"this costs {amount} micro-USD but account {account_id} has {left} left",
            account_id=account_id, remaining_usd_micros=left, required_usd_micros=amount,
        )

    # -- direct charges and refunds ------------------------------------------------------------------

    def charge(self, body: ChargeCreate) -> Charge:
        """Charge usage from the free balance; ``PaymentRequired`` (402) if it cannot be covered, ``NotFound``
        for an unknown account, ``IdempotencyKeyReused`` (409)."""
        priced = self.prices.price(body.usage)
        total = sum(p.amount_usd_micros for p in priced)
        fingerprint = _fingerprint("charge.create", body.account_id, body)

        def work(s: Session) -> tuple[str, Charge]:
            now = utcnow()
            remaining = self._reserve(s, body.account_id, total, now, "spent_usd_micros", "charge.create", body.idempotency_key)
            entries = [self._charge_entry(body.account_id, p, now, purpose=body.purpose, key=body.idempotency_key) for p in priced]
            repository.append_entries(s, entries)
            lines = [ChargeLine(entry_id=e["id"], kind=p.kind, quantity=p.quantity, model=p.model, usd_micros_per_million_units=p.usd_micros_per_million_units,
                                amount_usd_micros=p.amount_usd_micros) for e, p in zip(entries, priced, strict=True)]
            return body.account_id, Charge(account_id=body.account_id, amount_usd_micros=total, lines=lines, purpose=body.purpose,
                                           price_version=self.prices.version, remaining_usd_micros=remaining, created_at=now)

        return self._once("charge.create", body.idempotency_key, fingerprint, Charge, work)

    def refund(self, body: RefundCreate) -> Refund:
        """Give back (part of) a charge: a ``refund`` entry that lowers the account's spent total.

        ``body.amount_usd_micros`` defaults to everything of the charge not refunded yet. Raises ``NotFound``
        (no such account, or ``entry_id`` is not one of its charges) and ``RefundExceedsCharge`` (409) when
        the charge has less left to refund.
        """
        fingerprint = _fingerprint("refund.create", body.account_id, body)

        def work(s: Session) -> tuple[str, Refund]:
            account_id = repository.account_for_update(s, body.account_id).account_id
            charge = repository.charge_entry(s, account_id, body.entry_id)
            if charge is None:
                raise NotFound(f"no charge entry {body.entry_id} in account {body.account_id}", field="entry_id")
            refundable = charge.amount_usd_micros - repository.refunded_usd_micros(s, charge.id)
            amount = body.amount_usd_micros if body.amount_usd_micros is not None else refundable
            if amount > refundable or amount == 0:
                _raise_if_answered(s, account_id, "refund.create", body.idempotency_key)
                raise RefundExceedsCharge(f"charge {charge.id} has {refundable} micro-USD left to refund; asked for {amount}",
                                          field="amount_usd_micros", refundable_usd_micros=refundable)
            now = utcnow()
            entry = self._entry(account_id, EntryType.refund, amount, now, purpose=body.reason, key=body.idempotency_key)
            entry |= {"kind": charge.kind, "model": charge.model, "refund_of": charge.id}
            repository.append_entries(s, [entry])
            remaining = repository.shift_totals(s, account_id, spent_delta=-amount, now=now)
            return account_id, Refund(entry_id=entry["id"], account_id=account_id, refund_of=charge.id, amount_usd_micros=amount,
                                      reason=body.reason, remaining_usd_micros=remaining, created_at=now)

        return self._once("refund.create", body.idempotency_key, fingerprint, Refund, work)

    # -- idempotency and entries ------------------------------------------------------------------

    def _once(self, operation: str, key: str, fingerprint: str, model: type[ResponseT], work: Callable[[Session], tuple[str, ResponseT]]) -> ResponseT:
        """Run ``work`` in one transaction and store its answer under (account, ``operation``, ``key``) in the
        same transaction; if the key was answered before, roll everything back and return that answer.

        The record is written last with ``INSERT … ON CONFLICT DO NOTHING``: a concurrent request with the same
        key waits on the unique index until the first commits, then finds it taken and replays it.
        ``IdempotencyKeyReused`` (409) if the stored answer was for a different request.
        """
        try:
            with self.db.session() as s:
                account_id, out = work(s)
                if not repository.remember_answer(s, account_id, operation, key, fingerprint, out.model_dump_json(), utcnow()):
                    raise _Answered(account_id)
                return out
        except _Answered as answered:
            return self._replay(answered.account_id, operation, key, fingerprint, model)

    def _replay(self, account_id: str, operation: str, key: str, fingerprint: str, model: type[ResponseT]) -> ResponseT:
        """The stored answer to (account, ``operation``, ``key``); ``IdempotencyKeyReused`` if it was for another request."""
        with self.db.session() as s:
            stored_fingerprint, response = repository.stored_answer(s, account_id, operation, key)
        if stored_fingerprint != fingerprint:
            raise IdempotencyKeyReused(f"idempotency key {key!r} was already used for a different {operation} request", field="idempotency_key")
        return model.model_validate_json(response)

    def _call(self, statement: Executable, params: dict[str, Any]) -> Any:
        """One statement of the PostgreSQL one-call path in its own transaction (``repository.call_alone`` on the
        ledger's own autocommit pool); its scalar result. Every round trip of that path goes through here."""
        return repository.call_alone(self._autocommit, statement, params)  # type: ignore[arg-type]

    def close(self) -> None:
        """Close the ledger's own connection pool (the database's is the caller's)."""
        if self._autocommit is not None:
            self._autocommit.dispose()

    def _entry(
        self, account_id: str, type_: EntryType, amount: int, now: dt.datetime, *,
        hold_id: str | None = None, purpose: str | None = None, key: str | None = None,
    ) -> dict:
        """The column values of a new entry (for ``repository.append_entries``)."""
        return {"id": new_id("ent"), "account_id": account_id, "type": type_.value, "amount_usd_micros": amount, "kind": None,
                "quantity": None, "model": None, "hold_id": hold_id, "purpose": purpose, "price_version": self.prices.version,
                "idempotency_key": key, "refund_of": None, "created_at": now}

    def _charge_entry(self, account_id: str, p: PricedItem, now: dt.datetime, *, purpose: str, key: str, hold_id: str | None = None) -> dict:
        entry = self._entry(account_id, EntryType.charge, p.amount_usd_micros, now, hold_id=hold_id, purpose=purpose, key=key)
        return entry | {"kind": p.kind.value, "quantity": p.quantity, "model": p.model}


class _Answered(Exception):  # noqa: N818 - control flow, never leaves the Ledger
    """The idempotency key already has an answer: roll back and replay it."""

    def __init__(self, account_id: str) -> None:
        self.account_id = account_id


def _raise_if_answered(s: Session, account_id: str, operation: str, key: str) -> None:
    """On a path that would fail: if this key was answered before, replay that answer instead of failing."""
    if repository.is_answered(s, account_id, operation, key):
        raise _Answered(account_id)


def _require_open(hold: models.Hold) -> None:
    if hold.status != HoldStatus.open.value:
        raise HoldClosed(f"hold {hold.hold_id} is {hold.status}", hold_id=hold.hold_id, hold_status=hold.status)


def _account_out(a: models.Account) -> Account:
    return Account(
        account_id=a.account_id,
        budget_usd_micros=a.budget_usd_micros,
        held_usd_micros=a.held_usd_micros,
        spent_usd_micros=a.spent_usd_micros,
        remaining_usd_micros=a.remaining_usd_micros,
        created_at=a.created_at,
    )


def _hold_out(h: models.Hold) -> Hold:
    return Hold(
        hold_id=h.hold_id,
        account_id=h.account_id,
        amount_usd_micros=h.amount_usd_micros,
        charged_usd_micros=h.charged_usd_micros,
        released_usd_micros=h.released_usd_micros,
        status=HoldStatus(h.status),
        purpose=h.purpose,
        price_version=h.price_version,
        created_at=h.created_at,
        expires_at=h.expires_at,
        closed_at=h.closed_at,
    )


def _entry_out(e: models.Entry) -> Entry:
    return Entry(
        id=e.id,
        account_id=e.account_id,
        type=EntryType(e.type),
        amount_usd_micros=e.amount_usd_micros,
        kind=UsageKind(e.kind) if e.kind else None,
        quantity=e.quantity,
        model=e.model,
        hold_id=e.hold_id,
        purpose=e.purpose,
        price_version=e.price_version,
        idempotency_key=e.idempotency_key,
        refund_of=e.refund_of,
        created_at=e.created_at,
    )

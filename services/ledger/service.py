"""The budget ledger's logic: accounts, holds, charges, balances and usage. No HTTP here.

Every mutating call is one transaction that first takes the account row's lock, with the balance check
in the same statement where it can be: a conditional ``UPDATE accounts … WHERE budget − held − spent >=
amount`` for holds and charges (the row lock comes with it; on SQLite every transaction is ``BEGIN
IMMEDIATE``, which serializes writers), ``SELECT … FOR UPDATE`` on the account before a hold is changed.
Entries and the cached totals are written in that transaction, so all mutations of one account are
serialized, no check can be raced past, and nothing is ever half-written. The common path of a hold, a
settle or a charge is four or five statements and one commit.

Idempotency keys are scoped to (account, operation): ``hold.create``, ``hold.charge``, ``hold.settle``,
``hold.release``, ``charge.create``, ``refund.create``. The answer is stored last in the same transaction
(``INSERT … ON CONFLICT DO NOTHING``); a repeat with the same key and the same request finds it taken, rolls
its own work back and returns the stored first answer; the same key with a different request is a 409.
Failed calls (402, 409, 404) store nothing, so they may be retried with the same key.

A hold placed with ``ttl_s`` expires: once ``expires_at`` has passed, what is left on it is released and
it is closed as ``expired``. Expiry happens when a new hold or charge on the account would not be covered
otherwise, and in a periodic sweep (:meth:`Ledger.expire_holds`), so a holder that dies never locks money for longer
than its ttl.

Entry arithmetic (all amounts are non-negative; the type gives the sign):
``budget = Σ grant``, ``spent = Σ charge − Σ refund``,
``held = Σ hold − Σ release − Σ charge with a hold_id``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel
from sqlalchemy import ColumnElement, TextClause, bindparam, case, create_engine, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from services.common.db import Database, utcnow
from services.common.errors import Conflict, IdempotencyKeyReused, NotFound, PaymentRequired
from services.common.ids import new_id
from services.ledger import models
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


@dataclass(frozen=True)
class Totals:
    """An account's budget, held and spent amounts (micro-USD)."""

    budget_usd_micros: int
    held_usd_micros: int
    spent_usd_micros: int


def recompute_balance(session: Session, account_id: str) -> Totals:
    """Rebuild an account's totals from its entries alone (to check them against the cached row)."""
    amount = models.Entry.amount_usd_micros
    kind = models.Entry.type

    def total(cond: ColumnElement[bool]) -> ColumnElement[int]:
        return func.coalesce(func.sum(case((cond, amount), else_=0)), 0)

    row = session.execute(
        select(
            total(kind == EntryType.grant.value),
            total(kind == EntryType.hold.value),
            total(kind == EntryType.release.value),
            total(kind == EntryType.charge.value),
            total((kind == EntryType.charge.value) & models.Entry.hold_id.is_not(None)),
            total(kind == EntryType.refund.value),
        ).where(models.Entry.account_id == account_id)
    ).one()
    grant, hold, release, charge, charge_from_holds, refund = (int(v) for v in row)
    return Totals(grant, hold - release - charge_from_holds, charge - refund)


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
        # its own pool, without a ping per checkout: a connection found dead is retried once on a fresh one
        self._autocommit = create_engine(db.engine.url, isolation_level="AUTOCOMMIT", pool_size=5, max_overflow=5) if self._postgres else None

    # -- accounts ---------------------------------------------------------------------------------

    def open_account(self, body: AccountCreate) -> tuple[Account, bool]:
        """Create the account with a ``grant`` entry for its budget; ``(account, created)``.

        Opening an existing account with the same budget returns it (``created`` false); with a different
        budget raises ``BudgetMismatch``.
        """
        with self.db.session() as s:
            acct = _lock_account(s, body.account_id, missing_ok=True)
            created = False
            if acct is None:
                try:
                    with s.begin_nested():
                        acct = self._insert_account(s, body)
                    created = True
                except IntegrityError:  # opened concurrently (PostgreSQL); the other one committed first
                    acct = _lock_account(s, body.account_id)
            if acct.budget_usd_micros != body.budget_usd_micros:
                raise BudgetMismatch(
                    f"account {body.account_id} exists with budget_usd_micros={acct.budget_usd_micros}",
                    account_id=body.account_id,
                    budget_usd_micros=acct.budget_usd_micros,
                )
            return _account_out(acct), created

    def _insert_account(self, s: Session, body: AccountCreate) -> models.Account:
        now = utcnow()
        acct = models.Account(
            account_id=body.account_id,
            budget_usd_micros=body.budget_usd_micros,
            held_usd_micros=0,
            spent_usd_micros=0,
            created_at=now,
            updated_at=now,
        )
        s.add(acct)
        s.flush()
        s.add(models.Entry(**self._entry(acct.account_id, EntryType.grant, body.budget_usd_micros, now, purpose="budget")))
        s.flush()
        return acct

    def balance(self, account_id: str) -> Balance:
        """The account's cached balance with spending and usage by kind."""
        with self.db.session() as s:
            acct = s.get(models.Account, account_id)
            if acct is None:
                raise NotFound(f"no ledger account {account_id}", account_id=account_id)
            return self._balances(s, [acct])[0]

    def balances(self) -> list[Balance]:
        """Every account's balance, oldest first."""
        with self.db.session() as s:
            accts = s.scalars(select(models.Account).order_by(models.Account.created_at, models.Account.account_id)).all()
            return self._balances(s, list(accts))

    def _balances(self, s: Session, accts: list[models.Account]) -> list[Balance]:
        ids = [a.account_id for a in accts]
        spent: dict[str, dict[str, int]] = defaultdict(lambda: {k.value: 0 for k in UsageKind})
        usage: dict[str, dict[str, int]] = defaultdict(lambda: {k.value: 0 for k in UsageKind})
        if ids:
            rows = s.execute(
                select(models.Entry.account_id, models.Entry.type, models.Entry.kind, func.sum(models.Entry.amount_usd_micros), func.sum(models.Entry.quantity))
                .where(models.Entry.type.in_([EntryType.charge.value, EntryType.refund.value]), models.Entry.account_id.in_(ids))
                .group_by(models.Entry.account_id, models.Entry.type, models.Entry.kind)
            )
            for account_id, type_, kind, amount, quantity in rows:  # refunds lower spending, not usage
                sign = -1 if type_ == EntryType.refund.value else 1
                spent[account_id][kind] += sign * int(amount or 0)
                usage[account_id][kind] += int(quantity or 0) if sign > 0 else 0
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
            _require_account(s, account_id)
            query = select(models.Entry).where(models.Entry.account_id == account_id)
            if after is not None:
                seq = s.scalar(select(models.Entry.seq).where(models.Entry.id == after, models.Entry.account_id == account_id))
                if seq is None:
                    raise NotFound(f"no entry {after} in account {account_id}", field="after")
                query = query.where(models.Entry.seq > seq)
            rows = s.scalars(query.order_by(models.Entry.seq).limit(limit)).all()
            return [_entry_out(e) for e in rows]

    def usage_by_hour(self, account_id: str) -> list[UsageBucket]:
        """Charged usage aggregated by UTC hour and kind, oldest hour first."""
        with self.db.session() as s:
            _require_account(s, account_id)
            rows = s.execute(
                select(models.Entry.created_at, models.Entry.kind, models.Entry.quantity, models.Entry.amount_usd_micros)
                .where(models.Entry.account_id == account_id, models.Entry.type == EntryType.charge.value)
                .order_by(models.Entry.seq)
            )
            buckets: dict[tuple[dt.datetime, str], list[int]] = defaultdict(lambda: [0, 0])
            for created_at, kind, quantity, amount in rows:
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
        priced = self.prices.price(body.usage)
        amount = sum(p.amount_usd_micros for p in priced)
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
                placed = self._call(SQL.pg_hold, {
                    "account": body.account_id, "amount": amount, "hold": hold.hold_id, "entry": new_id("ent"), "purpose": body.purpose,
                    "price_version": self.prices.version, "key": body.idempotency_key, "fingerprint": fingerprint,
                    "response": hold.model_dump_json(), "now": hold.created_at, "expires": hold.expires_at})
            except IntegrityError as exc:
                _reraise_unless_key_taken(exc)
                return self._replay(body.account_id, "hold.create", body.idempotency_key, fingerprint, Hold)
            if placed:
                return hold

        def work(s: Session) -> tuple[str, Hold]:
            now = utcnow()
            self._reserve(s, body.account_id, amount, now, "held_usd_micros", "hold.create", body.idempotency_key)
            hold = new_hold(now)
            s.execute(SQL.insert_hold, hold.model_dump() | {"status": hold.status.value})
            s.execute(SQL.insert_entry, [self._entry(body.account_id, EntryType.hold, amount, now, hold_id=hold.hold_id,
                                                     purpose=body.purpose, key=body.idempotency_key)])
            return body.account_id, hold

        return self._once("hold.create", body.idempotency_key, fingerprint, Hold, work)

    def get_hold(self, hold_id: str) -> Hold:
        """The hold as it is now."""
        with self.db.session() as s:
            hold = s.get(models.Hold, hold_id)
            if hold is None:
                raise NotFound(f"no hold {hold_id}", hold_id=hold_id)
            return _hold_out(hold)

    def holds(self, account_id: str, status: HoldStatus | None = None) -> list[Hold]:
        """The account's holds, oldest first, optionally only those in ``status``."""
        with self.db.session() as s:
            _require_account(s, account_id)
            query = select(models.Hold).where(models.Hold.account_id == account_id)
            if status is not None:
                query = query.where(models.Hold.status == status.value)
            return [_hold_out(h) for h in s.scalars(query.order_by(models.Hold.created_at, models.Hold.hold_id))]

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
            lines = [{"id": new_id("ent"), "amount": p.amount_usd_micros, "kind": p.kind.value, "quantity": p.quantity, "model": p.model} for p in priced]
            try:
                answer = self._call(SQL.pg_take, {
                    "hold": hold_id, "total": total, "close_as": close_as.value if close_as else None, "lines": json.dumps(lines),
                    "release_entry": new_id("ent"), "purpose": purpose, "price_version": self.prices.version, "key": key, "operation": operation,
                    "fingerprint": fingerprint, "now": utcnow()})
            except IntegrityError as exc:
                _reraise_unless_key_taken(exc)
                with self.db.session() as s:
                    account_id = s.scalar(select(HOLDS.c.account_id).where(HOLDS.c.hold_id == hold_id))
                return self._replay(account_id, operation, key, fingerprint, Hold)  # type: ignore[arg-type]
            if answer is not None:
                return Hold.model_validate_json(answer)

        def work(s: Session) -> tuple[str, Hold]:
            account_id = _lock_hold_account(s, hold_id)
            now = utcnow()
            # an open hold has released nothing yet (a check constraint says so), so closing releases amount − charged
            stmt, params = (SQL.take, {}) if close_as is None else (SQL.take_and_close, {"p_status": close_as.value, "p_now": now})
            row = s.execute(stmt, {"p_hold": hold_id, "p_total": total, **params}).first()
            if row is None:
                _raise_if_answered(s, account_id, operation, key)
                hold = s.get(models.Hold, hold_id, populate_existing=True)
                _require_open(hold)
                raise HoldExceeded(
                    f"usage costs {total} micro-USD but hold {hold_id} has {hold.left_usd_micros} left",
                    hold_id=hold_id, hold_remaining_usd_micros=hold.left_usd_micros, required_usd_micros=total,
                )
            hold = Hold.model_validate(row._asdict())
            released = hold.released_usd_micros if close_as is not None else 0
            entries = [self._charge_entry(account_id, p, now, purpose=purpose or hold.purpose, key=key, hold_id=hold_id) for p in priced]
            if released:
                entries.append(self._entry(account_id, EntryType.release, released, now, hold_id=hold_id, purpose=hold.purpose, key=key))
            if entries:
                s.execute(SQL.insert_entry, entries)
            s.execute(SQL.move, {"p_account": account_id, "p_unhold": total + released, "p_spend": total, "p_now": now})
            return account_id, hold

        return self._once(operation, key, fingerprint, Hold, work)

    # -- registered models' prices ------------------------------------------------------------------

    def reload_prices(self) -> PriceBook:
        """The price table in force: ``prices.yaml`` with the registered models' rows (``model_prices``) in place of its
        own. Called at start-up and periodically, so every replica prices with the rows any of them registered."""
        with self.db.session() as s:
            rows = [Price(kind=UsageKind(r.kind), model=r.model, usd_micros_per_million_units=r.usd_micros_per_million_units)
                    for r in s.scalars(select(models.ModelPrice))]
        self.prices = with_registered(self.base_prices, rows)
        return self.prices

    def register_model_prices(self, model: str, body: ModelPrices) -> PriceTable:
        """Store ``model``'s prices (replacing those it had for the same kinds) and price with them from now on; the
        table's version changes with them. Repeating the same prices changes nothing."""
        now = utcnow()
        with self.db.session() as s:
            for kind, value in body.prices.items():
                row = s.get(models.ModelPrice, (model, kind))
                if row is None:
                    s.add(models.ModelPrice(model=model, kind=kind, usd_micros_per_million_units=value, updated_at=now))
                elif row.usd_micros_per_million_units != value:
                    row.usd_micros_per_million_units, row.updated_at = value, now
        return self.reload_prices().table()

    def expire_holds(self, now: dt.datetime | None = None) -> int:
        """Close every open hold whose ``expires_at`` has passed (status ``expired``); the number closed."""
        now = now or utcnow()
        with self.db.session() as s:
            accounts = s.scalars(select(models.Hold.account_id).distinct().where(
                models.Hold.status == HoldStatus.open.value, models.Hold.expires_at <= now)).all()
        closed = 0
        for account_id in accounts:
            with self.db.session() as s:
                closed += self._expire(s, _lock_account(s, account_id), now)
        return closed

    def _expire(self, s: Session, acct: models.Account, now: dt.datetime) -> int:
        """Within a transaction holding ``acct``'s lock: close its expired open holds."""
        expired = s.scalars(select(models.Hold).where(
            models.Hold.account_id == acct.account_id, models.Hold.status == HoldStatus.open.value, models.Hold.expires_at <= now,
        ).execution_options(populate_existing=True)).all()
        for hold in expired:
            left = hold.left_usd_micros
            if left:
                s.add(models.Entry(**self._entry(acct.account_id, EntryType.release, left, now, hold_id=hold.hold_id,
                                                 purpose=hold.purpose, key=f"expire:{hold.hold_id}")))
            hold.released_usd_micros += left
            hold.status = HoldStatus.expired.value
            hold.closed_at = now
            acct.held_usd_micros -= left
            acct.updated_at = now
        s.flush()
        return len(expired)

    def _reserve(self, s: Session, account_id: str, amount: int, now: dt.datetime, column: str, operation: str, key: str) -> int:
        """Add ``amount`` to the account's ``column`` (held or spent) if the free balance covers it; the
        remaining balance after it.

        One conditional UPDATE (which also locks the row). When it does not apply: ``NotFound`` for a missing
        account, the stored answer if this key was answered before (a replay must not get a 402), else expired
        holds are released and it is tried once more before ``PaymentRequired``.
        """
        stmt, params = SQL.reserve[column], {"p_account": account_id, "p_amount": amount, "p_now": now}
        if (remaining := s.execute(stmt, params).scalar()) is not None:
            return remaining
        acct = _lock_account(s, account_id)
        _raise_if_answered(s, account_id, operation, key)
        self._expire(s, acct, now)
        if (remaining := s.execute(stmt, params).scalar()) is not None:  # expired holds, or funds freed before the lock, may cover it now
            return remaining
        s.refresh(acct)
        raise PaymentRequired(
            f"this costs {amount} micro-USD but account {account_id} has {acct.remaining_usd_micros} left",
            account_id=account_id, remaining_usd_micros=acct.remaining_usd_micros, required_usd_micros=amount,
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
            s.execute(SQL.insert_entry, entries)
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
            acct = _lock_account(s, body.account_id)
            charge = s.scalar(select(models.Entry).where(models.Entry.id == body.entry_id, models.Entry.account_id == acct.account_id,
                                                         models.Entry.type == EntryType.charge.value))
            if charge is None:
                raise NotFound(f"no charge entry {body.entry_id} in account {body.account_id}", field="entry_id")
            refunded = s.scalar(select(func.coalesce(func.sum(models.Entry.amount_usd_micros), 0))
                                .where(models.Entry.refund_of == charge.id, models.Entry.type == EntryType.refund.value))
            refundable = charge.amount_usd_micros - int(refunded)
            amount = body.amount_usd_micros if body.amount_usd_micros is not None else refundable
            if amount > refundable or amount == 0:
                _raise_if_answered(s, acct.account_id, "refund.create", body.idempotency_key)
                raise RefundExceedsCharge(f"charge {charge.id} has {refundable} micro-USD left to refund; asked for {amount}",
                                          field="amount_usd_micros", refundable_usd_micros=refundable)
            now = utcnow()
            entry = self._entry(acct.account_id, EntryType.refund, amount, now, purpose=body.reason, key=body.idempotency_key)
            entry |= {"kind": charge.kind, "model": charge.model, "refund_of": charge.id}
            s.execute(SQL.insert_entry, [entry])
            acct.spent_usd_micros -= amount
            acct.updated_at = now
            return acct.account_id, Refund(entry_id=entry["id"], account_id=acct.account_id, refund_of=charge.id, amount_usd_micros=amount,
                                           reason=body.reason, remaining_usd_micros=acct.remaining_usd_micros, created_at=now)

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
                stored = s.execute(SQL.remember[s.get_bind().dialect.name], {
                    "account_id": account_id, "operation": operation, "key": key, "fingerprint": fingerprint,
                    "response": out.model_dump_json(), "created_at": utcnow()}).first()
                if stored is None:
                    raise _Answered(account_id)
                return out
        except _Answered as answered:
            return self._replay(answered.account_id, operation, key, fingerprint, model)

    def _replay(self, account_id: str, operation: str, key: str, fingerprint: str, model: type[ResponseT]) -> ResponseT:
        """The stored answer to (account, ``operation``, ``key``); ``IdempotencyKeyReused`` if it was for another request."""
        with self.db.session() as s:
            rec = s.execute(SQL.answer, {"p_account": account_id, "p_operation": operation, "p_key": key}).one()
        if rec.fingerprint != fingerprint:
            raise IdempotencyKeyReused(f"idempotency key {key!r} was already used for a different {operation} request", field="idempotency_key")
        return model.model_validate_json(rec.response)

    def _call(self, statement: TextClause, params: dict) -> Any:
        """Run one statement in its own transaction (PostgreSQL's autocommit); its scalar result.

        A pooled connection that turns out dead (the server restarted) invalidates the pool and the call is
        made once more on a new connection: nothing was applied, since the statement never reached the server
        or died with its transaction."""
        try:
            with self._autocommit.connect() as conn:  # type: ignore[union-attr]
                return conn.execute(statement, params).scalar()
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
        with self._autocommit.connect() as conn:  # type: ignore[union-attr]
            return conn.execute(statement, params).scalar()

    def close(self) -> None:
        """Close the ledger's own connection pool (the database's is the caller's)."""
        if self._autocommit is not None:
            self._autocommit.dispose()

    def _entry(
        self, account_id: str, type_: EntryType, amount: int, now: dt.datetime, *,
        hold_id: str | None = None, purpose: str | None = None, key: str | None = None,
    ) -> dict:
        """The column values of a new entry (for ``insert(ENTRIES)``)."""
        return {"id": new_id("ent"), "account_id": account_id, "type": type_.value, "amount_usd_micros": amount, "kind": None,
                "quantity": None, "model": None, "hold_id": hold_id, "purpose": purpose, "price_version": self.prices.version,
                "idempotency_key": key, "refund_of": None, "created_at": now}

    def _charge_entry(self, account_id: str, p: PricedItem, now: dt.datetime, *, purpose: str, key: str, hold_id: str | None = None) -> dict:
        entry = self._entry(account_id, EntryType.charge, p.amount_usd_micros, now, hold_id=hold_id, purpose=purpose, key=key)
        return entry | {"kind": p.kind.value, "quantity": p.quantity, "model": p.model}


ACCOUNTS = models.Account.__table__
HOLDS = models.Hold.__table__
ENTRIES = models.Entry.__table__
IDEMPOTENCY = models.IdempotencyRecord.__table__
FREE = ACCOUNTS.c.budget_usd_micros - ACCOUNTS.c.held_usd_micros - ACCOUNTS.c.spent_usd_micros


class SQL:
    """The hot path's statements, built once with bound parameters (``p_*``) so each call only binds values."""

    reserve = {  # add p_amount to held or spent if the free balance covers it; returns the free balance after
        column: update(ACCOUNTS).where(ACCOUNTS.c.account_id == bindparam("p_account"), bindparam("p_amount") <= FREE)
        .values({column: ACCOUNTS.c[column] + bindparam("p_amount"), "updated_at": bindparam("p_now")}).returning(FREE)
        for column in ("held_usd_micros", "spent_usd_micros")
    }
    move = (update(ACCOUNTS).where(ACCOUNTS.c.account_id == bindparam("p_account"))
            .values(held_usd_micros=ACCOUNTS.c.held_usd_micros - bindparam("p_unhold"),
                    spent_usd_micros=ACCOUNTS.c.spent_usd_micros + bindparam("p_spend"), updated_at=bindparam("p_now")))
    _take = (update(HOLDS).returning(*HOLDS.c).where(
        HOLDS.c.hold_id == bindparam("p_hold"), HOLDS.c.status == HoldStatus.open.value,
        HOLDS.c.amount_usd_micros - HOLDS.c.charged_usd_micros - HOLDS.c.released_usd_micros >= bindparam("p_total")))
    take = _take.values(charged_usd_micros=HOLDS.c.charged_usd_micros + bindparam("p_total"))
    take_and_close = _take.values(
        charged_usd_micros=HOLDS.c.charged_usd_micros + bindparam("p_total"),
        released_usd_micros=HOLDS.c.amount_usd_micros - HOLDS.c.charged_usd_micros - bindparam("p_total"),
        status=bindparam("p_status"), closed_at=bindparam("p_now"))
    lock_hold_account = select(ACCOUNTS.c.account_id).where(
        ACCOUNTS.c.account_id == select(HOLDS.c.account_id).where(HOLDS.c.hold_id == bindparam("p_hold")).scalar_subquery()).with_for_update()
    insert_hold = insert(HOLDS)
    insert_entry = insert(ENTRIES)
    remember = {  # store an answer unless the key has one: INSERT … ON CONFLICT DO NOTHING RETURNING id
        "postgresql": postgresql_insert(IDEMPOTENCY).on_conflict_do_nothing().returning(IDEMPOTENCY.c.id),
        "sqlite": sqlite_insert(IDEMPOTENCY).on_conflict_do_nothing().returning(IDEMPOTENCY.c.id),
    }
    _scope = (IDEMPOTENCY.c.account_id == bindparam("p_account"), IDEMPOTENCY.c.operation == bindparam("p_operation"),
              IDEMPOTENCY.c.key == bindparam("p_key"))
    answered = select(IDEMPOTENCY.c.id).where(*_scope)
    answer = select(IDEMPOTENCY.c.fingerprint, IDEMPOTENCY.c.response).where(*_scope)
    # PostgreSQL's common path (functions created by the migration 7b1e2c9d4f10)
    pg_hold = text("SELECT crucible_ledger_hold(:account, :amount, :hold, :entry, :purpose, :price_version, :key, :fingerprint, :response, "
                   ":now, :expires)")
    pg_take = text("SELECT crucible_ledger_take(:hold, :total, :close_as, CAST(:lines AS jsonb), :release_entry, :purpose, :price_version, "
                   ":key, :operation, :fingerprint, :now)")


class _Answered(Exception):  # noqa: N818 - control flow, never leaves the Ledger
    """The idempotency key already has an answer: roll back and replay it."""

    def __init__(self, account_id: str) -> None:
        self.account_id = account_id


def _reraise_unless_key_taken(exc: IntegrityError) -> None:
    """Re-raise ``exc`` unless it is the idempotency record's unique key (a concurrent request with the same key won)."""
    if "uq_idempotency_records_scope" not in str(exc.orig):
        raise exc


def _raise_if_answered(s: Session, account_id: str, operation: str, key: str) -> None:
    """On a path that would fail: if this key was answered before, replay that answer instead of failing."""
    if s.execute(SQL.answered, {"p_account": account_id, "p_operation": operation, "p_key": key}).first() is not None:
        raise _Answered(account_id)


def _lock_hold_account(s: Session, hold_id: str) -> str:
    """Lock the account of hold ``hold_id`` (accounts are always locked before their holds); its id. ``NotFound`` if no such hold."""
    account_id = s.execute(SQL.lock_hold_account, {"p_hold": hold_id}).scalar()
    if account_id is None:
        raise NotFound(f"no hold {hold_id}", hold_id=hold_id)
    return account_id


def _lock_account(s: Session, account_id: str, *, missing_ok: bool = False) -> models.Account | None:
    """The account row, locked for the rest of the transaction (fresh from the database)."""
    acct = s.get(models.Account, account_id, with_for_update=True, populate_existing=True)
    if acct is None and not missing_ok:
        raise NotFound(f"no ledger account {account_id}", account_id=account_id)
    return acct


def _require_account(s: Session, account_id: str) -> None:
    if s.get(models.Account, account_id) is None:
        raise NotFound(f"no ledger account {account_id}", account_id=account_id)


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
        created_at=e.created_at,
    )

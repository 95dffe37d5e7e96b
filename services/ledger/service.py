"""The budget ledger's logic: accounts, holds, charges, balances and usage. No HTTP here.

Every mutating call is one transaction that first locks the account row (``SELECT … FOR UPDATE`` on
PostgreSQL; on SQLite every transaction is ``BEGIN IMMEDIATE``, which serializes writers), then looks up
its idempotency key, then checks the balance and writes entries and the cached totals together. So all
mutations of one account are serialized, no check can be raced past, and nothing is ever half-written.

Idempotency keys are scoped to (account, operation): ``hold.create``, ``hold.charge``, ``hold.settle``,
``hold.release``, ``charge.create``. A repeat with the same key and the same request returns the stored
first answer and writes nothing; the same key with a different request is a 409. Failed calls (402, 409,
404) store nothing, so they may be retried with the same key.

A hold placed with ``ttl_s`` expires: once ``expires_at`` has passed, what is left on it is released and
it is closed as ``expired``. Expiry happens when a new hold or charge on the account would not be covered
otherwise, and in a periodic sweep (:meth:`Ledger.expire_holds`), so a holder that dies never locks money for longer
than its ttl.

Entry arithmetic (all amounts are non-negative; the type gives the sign):
``budget = Σ grant``, ``spent = Σ charge``,
``held = Σ hold − Σ release − Σ charge with a hold_id``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel
from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.common.db import Database, utcnow
from services.common.errors import Conflict, IdempotencyKeyReused, NotFound, PaymentRequired
from services.common.ids import new_id
from services.ledger import models
from services.ledger.pricing import PriceBook, PricedItem
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
    UsageBucket,
    UsageKind,
)

ResponseT = TypeVar("ResponseT", bound=BaseModel)


class BudgetMismatch(Conflict):
    """The account exists with a different budget."""

    code, title = "account_exists", "The account already exists with a different budget"


class HoldClosed(Conflict):
    """The hold is settled or released; it takes no more charges."""

    code, title = "hold_closed", "The hold is already closed"


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
        ).where(models.Entry.account_id == account_id)
    ).one()
    grant, hold, release, charge, charge_from_holds = (int(v) for v in row)
    return Totals(grant, hold - release - charge_from_holds, charge)


def _fingerprint(operation: str, target: str, body: BaseModel) -> str:
    payload = {"operation": operation, "target": target, "body": body.model_dump(mode="json", exclude={"idempotency_key"})}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Ledger:
    """The ledger over one database and one price table; each method is one transaction."""

    def __init__(self, db: Database, prices: PriceBook) -> None:
        self.db = db
        self.prices = prices

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
        s.add(self._entry(acct.account_id, EntryType.grant, body.budget_usd_micros, now, purpose="budget"))
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
                select(models.Entry.account_id, models.Entry.kind, func.sum(models.Entry.amount_usd_micros), func.sum(models.Entry.quantity))
                .where(models.Entry.type == EntryType.charge.value, models.Entry.account_id.in_(ids))
                .group_by(models.Entry.account_id, models.Entry.kind)
            )
            for account_id, kind, amount, quantity in rows:
                spent[account_id][kind] = int(amount or 0)
                usage[account_id][kind] = int(quantity or 0)
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
        """Reserve the priced cost of ``body.usage``; ``PaymentRequired`` if the free balance cannot cover it."""
        with self.db.session() as s:
            acct = _lock_account(s, body.account_id)
            op = _Op(s, acct.account_id, "hold.create", body.idempotency_key, _fingerprint("hold.create", acct.account_id, body))
            if (replay := op.replay(Hold)) is not None:
                return replay
            priced = self.prices.price(body.usage)
            amount = sum(p.amount_usd_micros for p in priced)
            now = utcnow()
            if amount > acct.remaining_usd_micros:  # expired holds matter only when they block this one
                self._expire(s, acct, now)
            _require_funds(acct, amount)
            hold = models.Hold(
                hold_id=new_id("hold"),
                account_id=acct.account_id,
                amount_usd_micros=amount,
                charged_usd_micros=0,
                released_usd_micros=0,
                status=HoldStatus.open.value,
                purpose=body.purpose,
                price_version=self.prices.version,
                created_at=now,
                expires_at=now + dt.timedelta(seconds=body.ttl_s) if body.ttl_s else None,
            )
            s.add(hold)
            s.flush()
            s.add(self._entry(acct.account_id, EntryType.hold, amount, now, hold_id=hold.hold_id, purpose=body.purpose, key=body.idempotency_key))
            acct.held_usd_micros += amount
            acct.updated_at = now
            return op.remember(_hold_out(hold))

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
        """Charge usage against an open hold; ``HoldExceeded`` if it costs more than is left on it."""
        with self.db.session() as s:
            acct, hold = _lock_hold(s, hold_id)
            op = _Op(s, acct.account_id, "hold.charge", body.idempotency_key, _fingerprint("hold.charge", hold_id, body))
            if (replay := op.replay(Hold)) is not None:
                return replay
            _require_open(hold)
            now = utcnow()
            self._charge_against(s, acct, hold, self.prices.price(body.usage), body.purpose or hold.purpose, body.idempotency_key, now)
            return op.remember(_hold_out(hold))

    def settle_hold(self, hold_id: str, body: HoldSettle) -> Hold:
        """Charge the final usage against the hold, release what is left and close it as ``settled``."""
        with self.db.session() as s:
            acct, hold = _lock_hold(s, hold_id)
            op = _Op(s, acct.account_id, "hold.settle", body.idempotency_key, _fingerprint("hold.settle", hold_id, body))
            if (replay := op.replay(Hold)) is not None:
                return replay
            _require_open(hold)
            now = utcnow()
            self._charge_against(s, acct, hold, self.prices.price(body.usage), body.purpose or hold.purpose, body.idempotency_key, now)
            self._close(s, acct, hold, HoldStatus.settled, body.idempotency_key, now)
            return op.remember(_hold_out(hold))

    def release_hold(self, hold_id: str, body: HoldRelease) -> Hold:
        """Release what is left on the hold and close it as ``released``."""
        with self.db.session() as s:
            acct, hold = _lock_hold(s, hold_id)
            op = _Op(s, acct.account_id, "hold.release", body.idempotency_key, _fingerprint("hold.release", hold_id, body))
            if (replay := op.replay(Hold)) is not None:
                return replay
            _require_open(hold)
            self._close(s, acct, hold, HoldStatus.released, body.idempotency_key, utcnow())
            return op.remember(_hold_out(hold))

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
            self._close(s, acct, hold, HoldStatus.expired, f"expire:{hold.hold_id}", now)
        return len(expired)

    def _charge_against(
        self, s: Session, acct: models.Account, hold: models.Hold, priced: list[PricedItem], purpose: str, key: str, now: dt.datetime
    ) -> list[models.Entry]:
        total = sum(p.amount_usd_micros for p in priced)
        if total > hold.left_usd_micros:
            raise HoldExceeded(
                f"usage costs {total} micro-USD but hold {hold.hold_id} has {hold.left_usd_micros} left",
                hold_id=hold.hold_id,
                hold_remaining_usd_micros=hold.left_usd_micros,
                required_usd_micros=total,
            )
        entries = [self._charge_entry(acct.account_id, p, now, purpose=purpose, key=key, hold_id=hold.hold_id) for p in priced]
        s.add_all(entries)
        hold.charged_usd_micros += total
        acct.held_usd_micros -= total
        acct.spent_usd_micros += total
        acct.updated_at = now
        return entries

    def _close(self, s: Session, acct: models.Account, hold: models.Hold, status: HoldStatus, key: str, now: dt.datetime) -> None:
        left = hold.left_usd_micros
        if left:
            s.add(self._entry(acct.account_id, EntryType.release, left, now, hold_id=hold.hold_id, purpose=hold.purpose, key=key))
        hold.released_usd_micros += left
        hold.status = status.value
        hold.closed_at = now
        acct.held_usd_micros -= left
        acct.updated_at = now

    # -- direct charges ---------------------------------------------------------------------------

    def charge(self, body: ChargeCreate) -> Charge:
        """Charge usage from the free balance; ``PaymentRequired`` if it cannot be covered."""
        with self.db.session() as s:
            acct = _lock_account(s, body.account_id)
            op = _Op(s, acct.account_id, "charge.create", body.idempotency_key, _fingerprint("charge.create", acct.account_id, body))
            if (replay := op.replay(Charge)) is not None:
                return replay
            priced = self.prices.price(body.usage)
            total = sum(p.amount_usd_micros for p in priced)
            now = utcnow()
            if total > acct.remaining_usd_micros:
                self._expire(s, acct, now)
            _require_funds(acct, total)
            entries = [self._charge_entry(acct.account_id, p, now, purpose=body.purpose, key=body.idempotency_key) for p in priced]
            s.add_all(entries)
            acct.spent_usd_micros += total
            acct.updated_at = now
            return op.remember(
                Charge(
                    account_id=acct.account_id,
                    amount_usd_micros=total,
                    lines=[
                        ChargeLine(
                            entry_id=e.id,
                            kind=p.kind,
                            quantity=p.quantity,
                            model=p.model,
                            usd_micros_per_million_units=p.usd_micros_per_million_units,
                            amount_usd_micros=p.amount_usd_micros,
                        )
                        for e, p in zip(entries, priced, strict=True)
                    ],
                    purpose=body.purpose,
                    price_version=self.prices.version,
                    remaining_usd_micros=acct.remaining_usd_micros,
                    created_at=now,
                )
            )

    # -- entries ----------------------------------------------------------------------------------

    def _entry(
        self,
        account_id: str,
        type_: EntryType,
        amount: int,
        now: dt.datetime,
        *,
        hold_id: str | None = None,
        purpose: str | None = None,
        key: str | None = None,
    ) -> models.Entry:
        return models.Entry(
            id=new_id("ent"),
            account_id=account_id,
            type=type_.value,
            amount_usd_micros=amount,
            hold_id=hold_id,
            purpose=purpose,
            price_version=self.prices.version,
            idempotency_key=key,
            created_at=now,
        )

    def _charge_entry(
        self, account_id: str, p: PricedItem, now: dt.datetime, *, purpose: str, key: str, hold_id: str | None = None
    ) -> models.Entry:
        entry = self._entry(account_id, EntryType.charge, p.amount_usd_micros, now, hold_id=hold_id, purpose=purpose, key=key)
        entry.kind, entry.quantity, entry.model = p.kind.value, p.quantity, p.model
        return entry


class _Op:
    """One idempotent operation: replays the stored answer or stores the new one in the same transaction."""

    def __init__(self, s: Session, account_id: str, operation: str, key: str, fingerprint: str) -> None:
        self.s, self.account_id, self.operation, self.key, self.fingerprint = s, account_id, operation, key, fingerprint

    def replay(self, model: type[ResponseT]) -> ResponseT | None:
        """The first answer given for this key, ``None`` if the key is new; ``IdempotencyKeyReused`` if the request differs."""
        rec = self.s.scalar(
            select(models.IdempotencyRecord).where(
                models.IdempotencyRecord.account_id == self.account_id,
                models.IdempotencyRecord.operation == self.operation,
                models.IdempotencyRecord.key == self.key,
            )
        )
        if rec is None:
            return None
        if rec.fingerprint != self.fingerprint:
            raise IdempotencyKeyReused(
                f"idempotency key {self.key!r} was already used for a different {self.operation} request",
                field="idempotency_key",
            )
        return model.model_validate_json(rec.response)

    def remember(self, response: ResponseT) -> ResponseT:
        """Store ``response`` as the answer for this key and return it."""
        self.s.add(
            models.IdempotencyRecord(
                account_id=self.account_id,
                operation=self.operation,
                key=self.key,
                fingerprint=self.fingerprint,
                response=response.model_dump_json(),
                created_at=utcnow(),
            )
        )
        self.s.flush()
        return response


def _lock_account(s: Session, account_id: str, *, missing_ok: bool = False) -> models.Account | None:
    """The account row, locked for the rest of the transaction (fresh from the database)."""
    acct = s.get(models.Account, account_id, with_for_update=True, populate_existing=True)
    if acct is None and not missing_ok:
        raise NotFound(f"no ledger account {account_id}", account_id=account_id)
    return acct


def _require_account(s: Session, account_id: str) -> None:
    if s.get(models.Account, account_id) is None:
        raise NotFound(f"no ledger account {account_id}", account_id=account_id)


def _lock_hold(s: Session, hold_id: str) -> tuple[models.Account, models.Hold]:
    """Lock the hold's account, then read the hold (so its state is read under the lock)."""
    account_id = s.scalar(select(models.Hold.account_id).where(models.Hold.hold_id == hold_id))
    if account_id is None:
        raise NotFound(f"no hold {hold_id}", hold_id=hold_id)
    acct = _lock_account(s, account_id)
    hold = s.get(models.Hold, hold_id, populate_existing=True)
    return acct, hold


def _require_funds(acct: models.Account, required: int) -> None:
    if required > acct.remaining_usd_micros:
        raise PaymentRequired(
            f"this costs {required} micro-USD but account {acct.account_id} has {acct.remaining_usd_micros} left",
            account_id=acct.account_id,
            remaining_usd_micros=acct.remaining_usd_micros,
            required_usd_micros=required,
        )


def _require_open(hold: models.Hold) -> None:
    if hold.status != HoldStatus.open.value:
        raise HoldClosed(f"hold {hold.hold_id} is {hold.status}", hold_id=hold.hold_id, status=hold.status)


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

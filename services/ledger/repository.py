"""Every query of the budget ledger: accounts, holds, entries, idempotency records and registered model prices.

Each function takes the caller's session (the caller holds the transaction) and is named for what it asks; the
PostgreSQL one-call path takes the caller's ``call`` instead (one statement in its own transaction, see
:func:`call_alone`). The rules (what a hold or a charge costs, when to refuse, what to answer, replays) are in
:mod:`services.ledger.service`. One module rather than one per aggregate: the four tables change together in one
transaction under one lock order, and their statements share the table handles and the free-balance expression.
Lookups by id raise ``NotFound`` for an account or a hold; lookups a request names by one of its fields (the entry
of ``after`` or ``entry_id``) return ``None`` and the service says which field. Amounts are micro-USD (integers),
quantities are in their usage kind's unit (tokens, seconds, GB-hours).

Invariants these statements keep, backed by the check constraints and triggers of ``models.py``:

- Lock order: an account's row is locked before any of its holds changes (:func:`account_for_update`,
  :func:`lock_account_of_hold`, the conditional UPDATE of :func:`reserve`, and the same order in the PostgreSQL
  functions), so all mutations of one account are serialized.
- Check and write are one statement: :func:`reserve` adds to held or spent only ``WHERE budget − held − spent >=
  amount``; :func:`take_from_hold` charges a hold only while it is open and covers the charge. No check can be raced past.
- Entries are only ever inserted (:func:`append_entries`), and the cached totals move in the same transaction
  (:func:`reserve`, :func:`shift_totals`), so :func:`recompute_balance` (from the entries alone) equals the account row.
- An idempotency record is inserted last and ``ON CONFLICT DO NOTHING`` (:func:`remember_answer`): a concurrent
  request with the same key waits on the unique index until the first commits, then finds the key taken.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import ColumnElement, Engine, Executable, bindparam, case, create_engine, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from services.common.errors import NotFound
from services.common.ids import new_id
from services.ledger import models
from services.ledger.pricing import PricedItem
from services.ledger.schemas import EntryType, Hold, HoldStatus

ACCOUNTS = models.Account.__table__
HOLDS = models.Hold.__table__
ENTRIES = models.Entry.__table__
IDEMPOTENCY = models.IdempotencyRecord.__table__
FREE = ACCOUNTS.c.budget_usd_micros - ACCOUNTS.c.held_usd_micros - ACCOUNTS.c.spent_usd_micros

TotalColumn = Literal["held_usd_micros", "spent_usd_micros"]
Call = Callable[[Executable, dict[str, Any]], Any]  # one statement in its own transaction; its scalar result


# The hot path's statements, built once with bound parameters (``p_*``) so each call only binds values.
_RESERVE = {  # add p_amount to held or spent if the free balance covers it; returns the free balance after
    column: update(ACCOUNTS).where(ACCOUNTS.c.account_id == bindparam("p_account"), bindparam("p_amount") <= FREE)
    .values({column: ACCOUNTS.c[column] + bindparam("p_amount"), "updated_at": bindparam("p_now")}).returning(FREE)
    for column in ("held_usd_micros", "spent_usd_micros")
}
_SHIFT = (update(ACCOUNTS).where(ACCOUNTS.c.account_id == bindparam("p_account"))
          .values(held_usd_micros=ACCOUNTS.c.held_usd_micros + bindparam("p_held"),
                  spent_usd_micros=ACCOUNTS.c.spent_usd_micros + bindparam("p_spent"), updated_at=bindparam("p_now")).returning(FREE))
_TAKE_ANY = (update(HOLDS).returning(*HOLDS.c).where(
    HOLDS.c.hold_id == bindparam("p_hold"), HOLDS.c.status == HoldStatus.open.value,
    HOLDS.c.amount_usd_micros - HOLDS.c.charged_usd_micros - HOLDS.c.released_usd_micros >= bindparam("p_total")))
_TAKE = _TAKE_ANY.values(charged_usd_micros=HOLDS.c.charged_usd_micros + bindparam("p_total"))
_TAKE_AND_CLOSE = _TAKE_ANY.values(  # an open hold has released nothing yet (a check constraint), so this releases amount − charged
    charged_usd_micros=HOLDS.c.charged_usd_micros + bindparam("p_total"),
    released_usd_micros=HOLDS.c.amount_usd_micros - HOLDS.c.charged_usd_micros - bindparam("p_total"),
    status=bindparam("p_status"), closed_at=bindparam("p_now"))
_LOCK_HOLD_ACCOUNT = select(ACCOUNTS.c.account_id).where(
    ACCOUNTS.c.account_id == select(HOLDS.c.account_id).where(HOLDS.c.hold_id == bindparam("p_hold")).scalar_subquery()).with_for_update()
_INSERT_HOLD = insert(HOLDS)
_INSERT_ENTRY = insert(ENTRIES)
_REMEMBER = {  # store an answer unless the key has one: INSERT … ON CONFLICT DO NOTHING RETURNING id
    "postgresql": postgresql_insert(IDEMPOTENCY).on_conflict_do_nothing().returning(IDEMPOTENCY.c.id),
    "sqlite": sqlite_insert(IDEMPOTENCY).on_conflict_do_nothing().returning(IDEMPOTENCY.c.id),
}
_SCOPE = (IDEMPOTENCY.c.account_id == bindparam("p_account"), IDEMPOTENCY.c.operation == bindparam("p_operation"),
          IDEMPOTENCY.c.key == bindparam("p_key"))
_ANSWERED = select(IDEMPOTENCY.c.id).where(*_SCOPE)
_ANSWER = select(IDEMPOTENCY.c.fingerprint, IDEMPOTENCY.c.response).where(*_SCOPE)
# PostgreSQL's common path (functions created by the migration 7b1e2c9d4f10)
_PG_HOLD = text("SELECT crucible_ledger_hold(:account, :amount, :hold, :entry, :purpose, :price_version, :key, :fingerprint, :response, "
                ":now, :expires)")
_PG_TAKE = text("SELECT crucible_ledger_take(:hold, :total, :close_as, CAST(:lines AS jsonb), :release_entry, :purpose, :price_version, "
                ":key, :operation, :fingerprint, :now)")


# --------------------------------------------------------------------------- accounts


def account(s: Session, account_id: str) -> models.Account:
    """The account's row (its cached totals, micro-USD); ``NotFound`` if there is none."""
    acct = s.get(models.Account, account_id)
    if acct is None:
        raise _no_account(account_id)
    return acct


def account_for_update_or_none(s: Session, account_id: str) -> models.Account | None:
    """The account's row fresh from the database and locked for the rest of the transaction; ``None`` if there is none."""
    return s.get(models.Account, account_id, with_for_update=True, populate_existing=True)


def account_for_update(s: Session, account_id: str) -> models.Account:
    """As :func:`account_for_update_or_none`, but ``NotFound`` if there is no such account."""
    acct = account_for_update_or_none(s, account_id)
    if acct is None:
        raise _no_account(account_id)
    return acct


def accounts(s: Session) -> list[models.Account]:
    """Every account's row, oldest first."""
    return list(s.scalars(select(models.Account).order_by(models.Account.created_at, models.Account.account_id)))


def insert_account(s: Session, account_id: str, budget_usd_micros: int, now: dt.datetime) -> models.Account | None:
    """Insert an account with nothing held or spent (in a savepoint); the new row, or ``None`` if the same account was
    opened concurrently and committed first (PostgreSQL; the savepoint is rolled back, the transaction goes on)."""
    acct = models.Account(account_id=account_id, budget_usd_micros=budget_usd_micros, held_usd_micros=0, spent_usd_micros=0,
                          created_at=now, updated_at=now)
    try:
        with s.begin_nested():
            s.add(acct)
            s.flush()
    except IntegrityError:
        return None
    return acct


def reserve(s: Session, account_id: str, column: TotalColumn, amount_usd_micros: int, now: dt.datetime) -> int | None:
    """Add ``amount_usd_micros`` to the account's ``column`` (held or spent) if its free balance covers it, in one
    conditional UPDATE that also locks the row; the free balance after it (micro-USD), or ``None`` if nothing was
    changed (no such account, or not enough free balance)."""
    return s.execute(_RESERVE[column], {"p_account": account_id, "p_amount": amount_usd_micros, "p_now": now}).scalar()


def shift_totals(s: Session, account_id: str, *, held_delta: int = 0, spent_delta: int = 0, now: dt.datetime) -> int:
    """Add the signed deltas (micro-USD) to the account's cached held and spent totals; the free balance after it.
    The caller holds the account's lock and writes the entries that explain the change in the same transaction
    (a total going negative or past the budget violates a check constraint: ``IntegrityError``)."""
    params = {"p_account": account_id, "p_held": held_delta, "p_spent": spent_delta, "p_now": now}
    return s.execute(_SHIFT, params).scalar_one()


def lock_account_of_hold(s: Session, hold_id: str) -> str:
    """Lock the account of hold ``hold_id`` (accounts are locked before their holds); its id. ``NotFound`` if no such hold."""
    account_id = s.execute(_LOCK_HOLD_ACCOUNT, {"p_hold": hold_id}).scalar()
    if account_id is None:
        raise _no_hold(hold_id)
    return account_id


@dataclass(frozen=True)
class Totals:
    """An account's budget, held and spent amounts (micro-USD)."""

    budget_usd_micros: int
    held_usd_micros: int
    spent_usd_micros: int


def recompute_balance(s: Session, account_id: str) -> Totals:
    """Rebuild an account's totals from its entries alone (to check them against the cached row):
    ``budget = Σ grant``, ``held = Σ hold − Σ release − Σ charge with a hold_id``, ``spent = Σ charge − Σ refund``."""
    amount = models.Entry.amount_usd_micros
    kind = models.Entry.type

    def total(cond: ColumnElement[bool]) -> ColumnElement[int]:
        return func.coalesce(func.sum(case((cond, amount), else_=0)), 0)

    row = s.execute(
        select(
            total(kind == EntryType.grant.value),
            total(kind == EntryType.hold.value),
            total(kind == EntryType.release.value),
            total(kind == EntryType.charge.value),
            total((kind == EntryType.charge.value) & models.Entry.hold_id.is_not(None)),
            total(kind == EntryType.refund.value),
        ).where(models.Entry.account_id == account_id)
    ).one()
    grant, hold_, release, charge, charge_from_holds, refund = (int(v) for v in row)
    return Totals(grant, hold_ - release - charge_from_holds, charge - refund)


# --------------------------------------------------------------------------- holds


def hold(s: Session, hold_id: str) -> models.Hold:
    """The hold's row, fresh from the database; ``NotFound`` if there is none."""
    row = s.get(models.Hold, hold_id, populate_existing=True)
    if row is None:
        raise _no_hold(hold_id)
    return row


def holds_of_account(s: Session, account_id: str, status: HoldStatus | None = None) -> list[models.Hold]:
    """The account's holds, oldest first, only those in ``status`` if given."""
    query = select(models.Hold).where(models.Hold.account_id == account_id)
    if status is not None:
        query = query.where(models.Hold.status == status.value)
    return list(s.scalars(query.order_by(models.Hold.created_at, models.Hold.hold_id)))


def _expired(now: dt.datetime) -> tuple[ColumnElement[bool], ...]:
    return models.Hold.status == HoldStatus.open.value, models.Hold.expires_at <= now


def accounts_with_expired_holds(s: Session, now: dt.datetime) -> list[str]:
    """The ids of the accounts with an open hold whose ``expires_at`` is ``now`` or earlier."""
    return list(s.scalars(select(models.Hold.account_id).distinct().where(*_expired(now))))


def expired_hold_ids(s: Session, account_id: str, now: dt.datetime) -> list[str]:
    """The account's open holds whose ``expires_at`` is ``now`` or earlier, oldest first (the caller holds the account's lock)."""
    query = select(models.Hold.hold_id).where(models.Hold.account_id == account_id, *_expired(now))
    return list(s.scalars(query.order_by(models.Hold.created_at, models.Hold.hold_id)))


def insert_hold(s: Session, new: Hold) -> None:
    """Insert the hold ``new`` (its amount must already be added to the account's held total)."""
    s.execute(_INSERT_HOLD, new.model_dump() | {"status": new.status.value})


def take_from_hold(s: Session, hold_id: str, total_usd_micros: int, *, close_as: HoldStatus | None, now: dt.datetime) -> Hold | None:
    """Add ``total_usd_micros`` to the hold's charged amount if it is open and has that much left; with ``close_as``
    also release all that is left after it and close the hold with that status at ``now``. The hold after it, or
    ``None`` if nothing was changed (not open, or too little left). The caller holds the account's lock."""
    stmt, params = (_TAKE, {}) if close_as is None else (_TAKE_AND_CLOSE, {"p_status": close_as.value, "p_now": now})
    row = s.execute(stmt, {"p_hold": hold_id, "p_total": total_usd_micros, **params}).first()
    return None if row is None else Hold.model_validate(row._asdict())


def account_of_hold(s: Session, hold_id: str) -> str | None:
    """The id of the account hold ``hold_id`` belongs to (no lock); ``None`` if there is no such hold."""
    return s.scalar(select(HOLDS.c.account_id).where(HOLDS.c.hold_id == hold_id))


# --------------------------------------------------------------------------- entries


def append_entries(s: Session, entries: list[dict[str, Any]]) -> None:
    """Insert entries, in order (each a dict of every column of ``entries`` but ``seq``: ``id``, ``account_id``, ``type``,
    ``amount_usd_micros``, ``kind``, ``quantity`` in the kind's unit, ``model``, ``hold_id``, ``purpose``, ``price_version``,
    ``idempotency_key``, ``refund_of``, ``created_at``). Nothing to do for none. Entries are never updated or deleted."""
    if entries:
        s.execute(_INSERT_ENTRY, entries)


def entry_seq(s: Session, account_id: str, entry_id: str) -> int | None:
    """The append position of the account's entry ``entry_id``; ``None`` if the account has no such entry."""
    return s.scalar(select(models.Entry.seq).where(models.Entry.id == entry_id, models.Entry.account_id == account_id))


def entries_in_order(s: Session, account_id: str, *, after_seq: int | None, limit: int) -> list[models.Entry]:
    """The account's first ``limit`` entries in append order, after position ``after_seq`` if given."""
    query = select(models.Entry).where(models.Entry.account_id == account_id)
    if after_seq is not None:
        query = query.where(models.Entry.seq > after_seq)
    return list(s.scalars(query.order_by(models.Entry.seq).limit(limit)))


def charge_entry(s: Session, account_id: str, entry_id: str) -> models.Entry | None:
    """The account's ``charge`` entry ``entry_id``; ``None`` if it has no such entry or the entry is not a charge."""
    return s.scalar(select(models.Entry).where(models.Entry.id == entry_id, models.Entry.account_id == account_id,
                                               models.Entry.type == EntryType.charge.value))


def refunded_usd_micros(s: Session, charge_id: str) -> int:
    """How much of charge entry ``charge_id`` its ``refund`` entries gave back (micro-USD, 0 if none)."""
    return int(s.scalar(select(func.coalesce(func.sum(models.Entry.amount_usd_micros), 0))
                        .where(models.Entry.refund_of == charge_id, models.Entry.type == EntryType.refund.value)))


def charges_and_refunds_by_kind(s: Session, account_ids: list[str]) -> list[tuple[str, str, str, int, int]]:
    """Per account, entry type (``charge`` or ``refund``) and usage kind: ``(account_id, type, kind, Σ amount_usd_micros,
    Σ quantity)``, quantities in the kind's unit. Accounts without such entries have no rows."""
    if not account_ids:
        return []
    rows = s.execute(
        select(models.Entry.account_id, models.Entry.type, models.Entry.kind, func.sum(models.Entry.amount_usd_micros), func.sum(models.Entry.quantity))
        .where(models.Entry.type.in_([EntryType.charge.value, EntryType.refund.value]), models.Entry.account_id.in_(account_ids))
        .group_by(models.Entry.account_id, models.Entry.type, models.Entry.kind)
    )
    return [(account_id, type_, kind, int(amount or 0), int(quantity or 0)) for account_id, type_, kind, amount, quantity in rows]


def charges_in_order(s: Session, account_id: str) -> list[tuple[dt.datetime, str, int | None, int]]:
    """The account's ``charge`` entries in append order: ``(created_at, kind, quantity, amount_usd_micros)``."""
    rows = s.execute(
        select(models.Entry.created_at, models.Entry.kind, models.Entry.quantity, models.Entry.amount_usd_micros)
        .where(models.Entry.account_id == account_id, models.Entry.type == EntryType.charge.value)
        .order_by(models.Entry.seq)
    )
    return [tuple(r) for r in rows]  # type: ignore[misc]


# --------------------------------------------------------------------------- idempotency records


def remember_answer(s: Session, account_id: str, operation: str, key: str, fingerprint: str, response: str, now: dt.datetime) -> bool:
    """Store ``response`` (JSON) as the answer to (account, ``operation``, ``key``) with the request's ``fingerprint``,
    unless the key has an answer already (a concurrent holder of the key is waited for); whether it was stored."""
    stmt = _REMEMBER[s.get_bind().dialect.name]
    params = {"account_id": account_id, "operation": operation, "key": key, "fingerprint": fingerprint, "response": response, "created_at": now}
    return s.execute(stmt, params).first() is not None


def is_answered(s: Session, account_id: str, operation: str, key: str) -> bool:
    """Whether (account, ``operation``, ``key``) has a stored answer."""
    return s.execute(_ANSWERED, {"p_account": account_id, "p_operation": operation, "p_key": key}).first() is not None


def stored_answer(s: Session, account_id: str, operation: str, key: str) -> tuple[str, str]:
    """The stored ``(fingerprint, response JSON)`` of (account, ``operation``, ``key``); ``NoResultFound`` if there is none."""
    rec = s.execute(_ANSWER, {"p_account": account_id, "p_operation": operation, "p_key": key}).one()
    return rec.fingerprint, rec.response


# --------------------------------------------------------------------------- registered model prices


def registered_prices(s: Session) -> list[models.ModelPrice]:
    """Every registered model's price rows (micro-USD per 1,000,000 units of a kind)."""
    return list(s.scalars(select(models.ModelPrice)))


def put_model_price(s: Session, model: str, kind: str, usd_micros_per_million_units: int, now: dt.datetime) -> None:
    """Store ``model``'s price of ``kind``, replacing the one it had; a row with the same price is left as it is."""
    row = s.get(models.ModelPrice, (model, kind))
    if row is None:
        s.add(models.ModelPrice(model=model, kind=kind, usd_micros_per_million_units=usd_micros_per_million_units, updated_at=now))
    elif row.usd_micros_per_million_units != usd_micros_per_million_units:
        row.usd_micros_per_million_units, row.updated_at = usd_micros_per_million_units, now


# --------------------------------------------------------------------------- PostgreSQL: the common path in one call


class KeyTaken(Exception):  # noqa: N818 - an answer, not a failure
    """The one-call path found its idempotency key answered already (a concurrent request with the key won); nothing was written."""


def autocommit_engine(url: URL) -> Engine:
    """The one-call path's own pool (autocommit: each call is its own transaction), without a ping per checkout."""
    return create_engine(url, isolation_level="AUTOCOMMIT", pool_size=5, max_overflow=5)


def call_alone(engine: Engine, statement: Executable, params: dict[str, Any]) -> Any:
    """Run one statement in its own transaction on ``engine`` (autocommit); its scalar result.

    A pooled connection that turns out dead (the server restarted) invalidates the pool and the call is made once
    more on a new connection: nothing was applied, since the statement never reached the server or died with its
    transaction."""
    try:
        with engine.connect() as conn:
            return conn.execute(statement, params).scalar()
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
    with engine.connect() as conn:
        return conn.execute(statement, params).scalar()


def place_hold_in_one_call(call: Call, new: Hold, *, entry_id: str, key: str, fingerprint: str) -> bool:
    """``crucible_ledger_hold``: reserve ``new.amount_usd_micros`` from the account's free balance, insert the hold,
    its ``hold`` entry ``entry_id`` and the answer (``new`` as JSON) to (account, ``hold.create``, ``key``), all in
    one transaction. ``False`` if the common path does not apply (no such account, or the free balance does not cover
    it) and nothing was written. ``KeyTaken`` if the key was answered already."""
    return _unless_key_taken(call, _PG_HOLD, {
        "account": new.account_id, "amount": new.amount_usd_micros, "hold": new.hold_id, "entry": entry_id, "purpose": new.purpose,
        "price_version": new.price_version, "key": key, "fingerprint": fingerprint, "response": new.model_dump_json(),
        "now": new.created_at, "expires": new.expires_at})


def take_in_one_call(
    call: Call, hold_id: str, priced: list[PricedItem], *, close_as: HoldStatus | None, purpose: str | None, price_version: str,
    key: str, operation: str, fingerprint: str, now: dt.datetime,
) -> Hold | None:
    """``crucible_ledger_take``: as :func:`take_from_hold` after :func:`lock_account_of_hold`, with a ``charge`` entry per
    priced item (``purpose`` or the hold's), a ``release`` entry for what closing releases, the cached totals, and the
    answer (the hold after it) to (account, ``operation``, ``key``), all in one transaction. The hold after it, or
    ``None`` if the common path does not apply (no such hold, not open, too little left) and nothing was written.
    ``KeyTaken`` if the key was answered already."""
    lines = [{"id": new_id("ent"), "amount": p.amount_usd_micros, "kind": p.kind.value, "quantity": p.quantity, "model": p.model} for p in priced]
    answer = _unless_key_taken(call, _PG_TAKE, {
        "hold": hold_id, "total": sum(p.amount_usd_micros for p in priced), "close_as": close_as.value if close_as else None,
        "lines": json.dumps(lines), "release_entry": new_id("ent"), "purpose": purpose, "price_version": price_version, "key": key,
        "operation": operation, "fingerprint": fingerprint, "now": now})
    return None if answer is None else Hold.model_validate_json(answer)


def _unless_key_taken(call: Call, statement: Executable, params: dict[str, Any]) -> Any:
    """``call(statement, params)``; ``KeyTaken`` for a violation of the idempotency records' unique key, any other error as it is."""
    try:
        return call(statement, params)
    except IntegrityError as exc:
        if "uq_idempotency_records_scope" not in str(exc.orig):
            raise
        raise KeyTaken from exc


def _no_account(account_id: str) -> NotFound:
    return NotFound(f"no ledger account {account_id}", account_id=account_id)


def _no_hold(hold_id: str) -> NotFound:
    return NotFound(f"no hold {hold_id}", hold_id=hold_id)

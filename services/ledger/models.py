"""Ledger tables: accounts (cached balance), holds, append-only entries and idempotency records.

The entries are the ledger; ``accounts`` caches budget/held/spent and is updated in the same transaction
as the entries it summarizes (``repository.recompute_balance`` rebuilds it from the entries). Check
constraints make an overdraft impossible even if the code were wrong: ``held + spent <= budget``.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, CheckConstraint, ForeignKey, Index, Integer, MetaData, String, Text, UniqueConstraint, event
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.common.db import UTCDateTime

Money = BigInteger
AutoId = BigInteger().with_variant(Integer, "sqlite")  # SQLite autoincrements only INTEGER PRIMARY KEY


class LedgerBase(DeclarativeBase):
    """The ledger's own metadata (named constraints, so SQLite batch migrations can alter them)."""

    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class Account(LedgerBase):
    """One run's budget with its cached held and spent totals."""

    __tablename__ = "accounts"
    __table_args__ = (
        CheckConstraint("budget_usd_micros >= 0", name="budget_nonnegative"),
        CheckConstraint("held_usd_micros >= 0", name="held_nonnegative"),
        CheckConstraint("spent_usd_micros >= 0", name="spent_nonnegative"),
        CheckConstraint("held_usd_micros + spent_usd_micros <= budget_usd_micros", name="no_overdraft"),
    )

    account_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    budget_usd_micros: Mapped[int] = mapped_column(Money)
    held_usd_micros: Mapped[int] = mapped_column(Money, default=0)
    spent_usd_micros: Mapped[int] = mapped_column(Money, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)

    @property
    def remaining_usd_micros(self) -> int:
        return self.budget_usd_micros - self.held_usd_micros - self.spent_usd_micros


class Hold(LedgerBase):
    """A reservation against an account; ``amount = charged + released + left`` (left is 0 once closed)."""

    __tablename__ = "holds"
    __table_args__ = (
        CheckConstraint("status IN ('open', 'settled', 'released', 'expired')", name="status_known"),
        CheckConstraint("charged_usd_micros >= 0 AND released_usd_micros >= 0", name="parts_nonnegative"),
        CheckConstraint("charged_usd_micros + released_usd_micros <= amount_usd_micros", name="within_amount"),
        CheckConstraint("status <> 'open' OR released_usd_micros = 0", name="open_releases_nothing"),
    )

    hold_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.account_id"), index=True)
    amount_usd_micros: Mapped[int] = mapped_column(Money)
    charged_usd_micros: Mapped[int] = mapped_column(Money, default=0)
    released_usd_micros: Mapped[int] = mapped_column(Money, default=0)
    status: Mapped[str] = mapped_column(String(16))
    purpose: Mapped[str] = mapped_column(String(500))
    price_version: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True, index=True)
    closed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)

    @property
    def left_usd_micros(self) -> int:
        return self.amount_usd_micros - self.charged_usd_micros - self.released_usd_micros


class Entry(LedgerBase):
    """An append-only ledger entry; ``seq`` is the append order. Never updated or deleted."""

    __tablename__ = "entries"
    __table_args__ = (
        CheckConstraint("type IN ('grant', 'hold', 'release', 'charge', 'refund')", name="type_known"),
        CheckConstraint("amount_usd_micros >= 0", name="amount_nonnegative"),
        Index("ix_entries_account_seq", "account_id", "seq"),
    )

    seq: Mapped[int] = mapped_column(AutoId, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.account_id"))
    type: Mapped[str] = mapped_column(String(16))
    amount_usd_micros: Mapped[int] = mapped_column(Money)
    kind: Mapped[str | None] = mapped_column(String(32), nullable=True)
    quantity: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    hold_id: Mapped[str | None] = mapped_column(ForeignKey("holds.hold_id"), nullable=True, index=True)
    purpose: Mapped[str | None] = mapped_column(String(500), nullable=True)
    price_version: Mapped[str] = mapped_column(String(64))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    refund_of: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)  # refunds: the charge entry's id
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)


class IdempotencyRecord(LedgerBase):
    """The first answer to a mutating call, keyed by (account, operation, key), with its request's fingerprint."""

    __tablename__ = "idempotency_records"
    __table_args__ = (UniqueConstraint("account_id", "operation", "key", name="uq_idempotency_records_scope"),)

    id: Mapped[int] = mapped_column(AutoId, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.account_id"))
    operation: Mapped[str] = mapped_column(String(32))
    key: Mapped[str] = mapped_column(String(200))
    fingerprint: Mapped[str] = mapped_column(String(64))
    response: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)


@event.listens_for(Entry, "before_update")
@event.listens_for(Entry, "before_delete")
def _entries_are_append_only(_mapper, _connection, target: Entry) -> None:  # noqa: ANN001
    raise RuntimeError(f"ledger entry {target.id} is append-only: it cannot be updated or deleted")


class ModelPrice(LedgerBase):
    """A registered base model's price of one token kind (``PUT /internal/prices/models/{model}``, sent by inference when
    the model is registered); it replaces ``prices.yaml``'s row for that model and kind (``pricing.with_registered``)."""

    __tablename__ = "model_prices"
    __table_args__ = (CheckConstraint("usd_micros_per_million_units >= 0", name="price_nonnegative"),)

    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(40), primary_key=True)
    usd_micros_per_million_units: Mapped[int] = mapped_column(Money)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)


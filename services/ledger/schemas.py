"""Wire models of the ledger's internal API. Money is integer micro-USD (``*_usd_micros``), times are UTC.

Request models forbid unknown fields, so a misspelt amount or key is a 422 naming it instead of being
silently ignored.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_QUANTITY = 10**12
MAX_BUDGET_USD_MICROS = 10**15  # one billion dollars

AccountId = Annotated[
    str,
    Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:\-]+$", examples=["run_01jd3k5n8q2x7v4w9z6y3t1r0s"]),
]
IdempotencyKey = Annotated[
    str,
    Field(min_length=1, max_length=200, description="Repeat the call with the same key to get the original answer; a different body with the same key is refused with 409.", examples=["job_01jd3k5n8q2x7v4w9z6y3t1r0s:hold"]),
]
Purpose = Annotated[str, Field(min_length=1, max_length=500, examples=["training job job_01jd3k5n8q2x7v4w9z6y3t1r0s"])]


class UsageKind(StrEnum):
    """What is metered. Quantities are integers in the kind's unit (tokens, seconds, GB-hours)."""

    training_tokens = "training_tokens"
    prefill_tokens = "prefill_tokens"  # prompt tokens computed anew
    cached_prefill_tokens = "cached_prefill_tokens"  # prompt tokens served from the prefix cache
    decode_tokens = "decode_tokens"
    sandbox_seconds = "sandbox_seconds"
    storage_gb_hours = "storage_gb_hours"
    merged_parameters = "merged_parameters"  # a merge job: parameters read from its input checkpoints


KIND_UNITS: dict[UsageKind, str] = {
    UsageKind.training_tokens: "token",
    UsageKind.prefill_tokens: "token",
    UsageKind.cached_prefill_tokens: "token",
    UsageKind.decode_tokens: "token",
    UsageKind.sandbox_seconds: "second",
    UsageKind.storage_gb_hours: "GB-hour",
    UsageKind.merged_parameters: "parameter",
}


class HoldStatus(StrEnum):
    open = "open"
    settled = "settled"
    released = "released"
    expired = "expired"  # released by the ledger when its ttl ran out (the holder died or forgot it)


class EntryType(StrEnum):
    """Entry types of the append-only ledger and their effect on an account.

    ``grant`` adds to the budget; ``hold`` reserves; ``release`` returns reserved money; ``charge`` spends
    (from its hold when it has ``hold_id``, else from the free balance); ``refund`` gives back (part of) the
    charge named by ``refund_of``.
    """

    grant = "grant"
    hold = "hold"
    release = "release"
    charge = "charge"
    refund = "refund"


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UsageItem(_Request):
    """One metered quantity. ``model`` picks a model-specific price row; ``null`` (or an unlisted model) uses the kind's default row."""

    kind: UsageKind = Field(examples=["decode_tokens"])
    quantity: int = Field(ge=0, le=MAX_QUANTITY, examples=[1200])
    model: str | None = Field(None, min_length=1, max_length=200, examples=["smollm2-135m-instruct"])


class AccountCreate(_Request):
    """Open an account (one per run) with its whole budget."""

    account_id: AccountId
    budget_usd_micros: int = Field(ge=0, le=MAX_BUDGET_USD_MICROS, examples=[5_000_000])


class Account(BaseModel):
    """An account's budget and cached balance."""

    account_id: str = Field(examples=["run_01jd3k5n8q2x7v4w9z6y3t1r0s"])
    budget_usd_micros: int = Field(examples=[5_000_000])
    held_usd_micros: int = Field(examples=[0])
    spent_usd_micros: int = Field(examples=[0])
    remaining_usd_micros: int = Field(description="budget − held − spent", examples=[5_000_000])
    created_at: dt.datetime


class Balance(BaseModel):
    """What a run has left and what it spent, by usage kind (every kind is listed, zero if unused)."""

    account_id: str = Field(examples=["run_01jd3k5n8q2x7v4w9z6y3t1r0s"])
    budget_usd_micros: int = Field(examples=[5_000_000])
    held_usd_micros: int = Field(examples=[1_200_000])
    spent_usd_micros: int = Field(examples=[350_480])
    remaining_usd_micros: int = Field(description="budget − held − spent", examples=[3_449_520])
    spent_by_kind: dict[str, int] = Field(examples=[{"training_tokens": 350_000, "prefill_tokens": 80, "decode_tokens": 400, "sandbox_seconds": 0, "storage_gb_hours": 0}])
    usage_by_kind: dict[str, int] = Field(examples=[{"training_tokens": 175_000, "prefill_tokens": 800, "decode_tokens": 1000, "sandbox_seconds": 0, "storage_gb_hours": 0}])
    price_version: str = Field(description="Version of the price table now in force.", examples=["2026-11-30"])


class Entry(BaseModel):
    """One append-only ledger entry. ``amount_usd_micros`` is never negative; ``type`` gives its sign."""

    id: str = Field(examples=["ent_01jd3k5n8q2x7v4w9z6y3t1r0s"])
    account_id: str
    type: EntryType
    amount_usd_micros: int = Field(examples=[400])
    kind: UsageKind | None = Field(None, description="Charges only.")
    quantity: int | None = Field(None, description="Charges only.")
    model: str | None = None
    hold_id: str | None = None
    purpose: str | None = None
    price_version: str = Field(examples=["2026-11-30"])
    idempotency_key: str | None = None
    refund_of: str | None = Field(None, description="Refunds only: the charge entry refunded.")
    created_at: dt.datetime


class UsageBucket(BaseModel):
    """Charged usage of one kind within one UTC hour."""

    hour: dt.datetime = Field(description="Start of the hour, UTC.", examples=["2025-07-01T13:00:00Z"])
    kind: UsageKind
    quantity: int = Field(examples=[1000])
    amount_usd_micros: int = Field(examples=[400])


class HoldCreate(_Request):
    """Reserve the priced cost of an estimated usage (an upper bound) before long work starts."""

    account_id: AccountId
    usage: list[UsageItem] = Field(min_length=1, max_length=100)
    purpose: Purpose
    idempotency_key: IdempotencyKey
    ttl_s: int | None = Field(
        None, ge=1, le=30 * 24 * 3600, examples=[600],
        description="Seconds until the ledger releases the hold by itself (status `expired`) if it is still open; "
                    "guards against holders that die before settling. Omitted: the hold stays open until settled or released.",
    )


class HoldCharge(_Request):
    """Charge actual usage against an open hold; the total may not exceed what is left on the hold."""

    usage: list[UsageItem] = Field(min_length=1, max_length=100)
    idempotency_key: IdempotencyKey
    purpose: Purpose | None = Field(None, description="Recorded on the entries; defaults to the hold's purpose.")


class HoldSettle(_Request):
    """Charge the final usage (may be empty) against the hold and release the rest."""

    usage: list[UsageItem] = Field(default_factory=list, max_length=100)
    idempotency_key: IdempotencyKey
    purpose: Purpose | None = Field(None, description="Recorded on the entries; defaults to the hold's purpose.")


class HoldRelease(_Request):
    """Release whatever is left on the hold without charging."""

    idempotency_key: IdempotencyKey


class Hold(BaseModel):
    """A reservation. ``amount = charged + released + (what is left while open)``."""

    hold_id: str = Field(examples=["hold_01jd3k5n8q2x7v4w9z6y3t1r0s"])
    account_id: str = Field(examples=["run_01jd3k5n8q2x7v4w9z6y3t1r0s"])
    amount_usd_micros: int = Field(examples=[1_200_000])
    charged_usd_micros: int = Field(examples=[0])
    released_usd_micros: int = Field(examples=[0])
    status: HoldStatus
    purpose: str = Field(examples=["training job job_01jd3k5n8q2x7v4w9z6y3t1r0s"])
    price_version: str = Field(examples=["2026-11-30"])
    created_at: dt.datetime
    expires_at: dt.datetime | None = None
    closed_at: dt.datetime | None = None


class ChargeCreate(_Request):
    """Charge usage straight from the free balance (no hold)."""

    account_id: AccountId
    usage: list[UsageItem] = Field(min_length=1, max_length=100)
    purpose: Purpose
    idempotency_key: IdempotencyKey


class RefundCreate(_Request):
    """Give back (part of) a charge, e.g. work lost to a platform fault. Lowers the account's spent total."""

    account_id: AccountId
    entry_id: str = Field(min_length=1, max_length=40, description="The charge entry to refund.", examples=["ent_01jd3k5n8q2x7v4w9z6y3t1r0s"])
    amount_usd_micros: int | None = Field(None, ge=1, le=MAX_BUDGET_USD_MICROS, description="Omitted: all of the charge not refunded yet.", examples=[400])
    reason: Purpose
    idempotency_key: IdempotencyKey


class Refund(BaseModel):
    """A refund entry and the account's remaining balance right after it."""

    entry_id: str = Field(examples=["ent_01jd3k5n8q2x7v4w9z6y3t1r0s"])
    account_id: str
    refund_of: str = Field(description="The charge entry refunded.")
    amount_usd_micros: int = Field(examples=[400])
    reason: str
    remaining_usd_micros: int = Field(examples=[4_999_600])
    created_at: dt.datetime


class ChargeLine(BaseModel):
    """One priced usage item and the entry that records it."""

    entry_id: str = Field(examples=["ent_01jd3k5n8q2x7v4w9z6y3t1r0s"])
    kind: UsageKind
    quantity: int = Field(examples=[1000])
    model: str | None = None
    usd_micros_per_million_units: int = Field(examples=[400_000])
    amount_usd_micros: int = Field(examples=[400])


class Charge(BaseModel):
    """A direct charge: its lines, its total and the account's remaining balance right after it."""

    account_id: str
    amount_usd_micros: int = Field(examples=[400])
    lines: list[ChargeLine]
    purpose: str
    price_version: str = Field(examples=["2026-11-30"])
    remaining_usd_micros: int = Field(examples=[4_999_600])
    created_at: dt.datetime


class Price(BaseModel):
    """Price of one usage kind, for one model or for every model without its own row (``"*"``)."""

    model_config = ConfigDict(extra="forbid")

    kind: UsageKind
    model: str = Field("*", min_length=1, max_length=200, examples=["smollm2-135m-instruct"])
    usd_micros_per_million_units: int = Field(ge=0, le=10**12, description="Micro-USD per 1,000,000 units; an item costs ceil(quantity × this / 1,000,000).", examples=[400_000])
    unit: str | None = Field(None, description="The kind's unit (filled in by the ledger).", examples=["token"])


class PriceTable(BaseModel):
    """The price table in force; its ``version`` is stored on every entry priced with it."""

    model_config = ConfigDict(extra="forbid")

    version: str = Field(min_length=1, max_length=64, examples=["2026-11-30"])
    prices: list[Price]


TOKEN_KINDS = (UsageKind.training_tokens, UsageKind.prefill_tokens, UsageKind.cached_prefill_tokens, UsageKind.decode_tokens)


class ModelPrices(BaseModel):
    """One base model's prices, registered with the model (its card's ``prices``): micro-USD per 1,000,000 tokens per
    token kind. They replace the model's rows of ``prices.yaml`` for those kinds; kinds left out keep the table's."""

    model_config = ConfigDict(extra="forbid")

    prices: dict[Literal["training_tokens", "prefill_tokens", "cached_prefill_tokens", "decode_tokens"], int] = Field(
        min_length=1, examples=[{"prefill_tokens": 200_000, "decode_tokens": 800_000}])

    @field_validator("prices")
    @classmethod
    def _in_range(cls, prices: dict[str, int]) -> dict[str, int]:
        for kind, value in prices.items():
            if not 0 <= value <= 10**12:
                raise ValueError(f"{kind}: a price is 0 to 10^12 micro-USD per 1,000,000 tokens")
        return prices


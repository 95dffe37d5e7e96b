"""The price table: integer micro-USD per 1,000,000 units of each usage kind, per model with a ``"*"`` default.

An item costs ``ceil(quantity × usd_micros_per_million_units / 1_000_000)`` micro-USD, computed in
integers, so a non-zero usage at a non-zero price is never free. The table is read from ``prices.yaml``
(or the file named by ``CRUCIBLE_LEDGER_PRICES``) and must give every kind a ``"*"`` row.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from services.ledger.schemas import KIND_UNITS, Price, PriceTable, UsageItem, UsageKind

DEFAULT_PRICES_PATH = Path(__file__).with_name("prices.yaml")
UNITS_PER_PRICE = 1_000_000
DEFAULT_MODEL = "*"


@dataclass(frozen=True)
class PricedItem:
    """A usage item with the price row that applied and its cost."""

    kind: UsageKind
    quantity: int
    model: str | None
    usd_micros_per_million_units: int
    amount_usd_micros: int


class PriceBook:
    """A validated price table that prices usage items."""

    def __init__(self, table: PriceTable) -> None:
        rows: dict[tuple[UsageKind, str], Price] = {}
        for row in table.prices:
            key = (row.kind, row.model)
            if key in rows:
                raise ValueError(f"price table {table.version}: duplicate row for kind {row.kind} model {row.model!r}")
            rows[key] = row.model_copy(update={"unit": KIND_UNITS[row.kind]})
        missing = [k.value for k in UsageKind if (k, DEFAULT_MODEL) not in rows]
        if missing:
            raise ValueError(f"price table {table.version}: no default ('*') row for {', '.join(missing)}")
        self.version = table.version
        self._rows = rows

    def table(self) -> PriceTable:
        """The table as served by ``GET /internal/prices`` (kinds in declaration order, defaults first)."""
        order = {k: i for i, k in enumerate(UsageKind)}
        rows = sorted(self._rows.values(), key=lambda r: (order[r.kind], r.model != DEFAULT_MODEL, r.model))
        return PriceTable(version=self.version, prices=rows)

    def unit_price(self, kind: UsageKind, model: str | None) -> int:
        """Micro-USD per 1,000,000 units of ``kind`` for ``model`` (its own row, else the ``"*"`` row)."""
        row = self._rows.get((kind, model)) if model else None
        return (row or self._rows[(kind, DEFAULT_MODEL)]).usd_micros_per_million_units

    def price(self, usage: Iterable[UsageItem]) -> list[PricedItem]:
        """Price each item; amounts round up to the next micro-dollar."""
        out = []
        for item in usage:
            unit = self.unit_price(item.kind, item.model)
            amount = -(-item.quantity * unit // UNITS_PER_PRICE)
            out.append(PricedItem(item.kind, item.quantity, item.model, unit, amount))
        return out


def load_prices(path: Path | None = None) -> PriceBook:
    """Read and validate the price table at ``path`` (default: this folder's ``prices.yaml``)."""
    path = path or DEFAULT_PRICES_PATH
    data = yaml.safe_load(path.read_text())
    if isinstance(data, dict) and "version" in data:
        data["version"] = str(data["version"])
    return PriceBook(PriceTable.model_validate(data))


def with_registered(base: PriceBook, registered: Iterable[Price]) -> PriceBook:
    """``base`` with the rows of registered models (``Ledger.register_model_prices``) in place of its rows for the same
    kind and model. The version is ``base``'s plus a digest of the registered rows (``2026-11-30+3f2a9c1e``), so every
    entry names the exact table that priced it."""
    extra = sorted(registered, key=lambda r: (r.model, r.kind))
    if not extra:
        return base
    rows = {(r.kind, r.model): r for r in base.table().prices}
    rows.update({(r.kind, r.model): r for r in extra})
    digest = hashlib.sha256(json.dumps([r.model_dump(mode="json", exclude={"unit"}) for r in extra], sort_keys=True).encode()).hexdigest()[:8]
    return PriceBook(PriceTable(version=f"{base.version}+{digest}", prices=[r.model_copy(update={"unit": None}) for r in rows.values()]))


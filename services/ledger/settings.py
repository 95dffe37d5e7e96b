"""Ledger settings: the shared ``CRUCIBLE_*`` settings plus the price table path."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from services.common.settings import ServiceSettings
from services.ledger.pricing import DEFAULT_PRICES_PATH


class LedgerSettings(ServiceSettings):
    """``CRUCIBLE_LEDGER_PRICES`` overrides the bundled ``prices.yaml``."""

    ledger_prices: Path = Field(DEFAULT_PRICES_PATH, description="Price table YAML (env CRUCIBLE_LEDGER_PRICES).")
    ledger_hold_sweep_s: float = Field(15.0, gt=0, description="Seconds between sweeps that release expired holds.")

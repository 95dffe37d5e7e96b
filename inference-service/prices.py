"""Registered base models' prices on the ledger: a model card's ``prices`` become the ledger's price-table rows for
that model (``PUT /internal/prices/models/{model}``), when the model is registered and, for the models prepared
before inference started (``crucible up``'s models file, a built-in card), once the ledger answers."""

from __future__ import annotations

import threading
import time

import structlog

from services.common.errors import UpstreamProblem, UpstreamUnavailable
from services.common.llms import ModelCard
from services.ledger.client import LedgerClient
from services.ledger.schemas import ModelPrices

log = structlog.get_logger("inference")


def register_prices(ledger: LedgerClient, card: ModelCard) -> None:
    """Put ``card``'s prices on the ledger's table (nothing if it has none); idempotent."""
    if card.prices is not None and card.prices.rows():
        ledger.register_model_prices(card.name, ModelPrices(prices=card.prices.rows()))  # type: ignore[arg-type]


def register_prices_soon(ledger: LedgerClient, cards: list[ModelCard], retry_s: float = 5.0, give_up_s: float = 600.0) -> threading.Thread:
    """Register the prices of ``cards`` in a background thread, retrying while the ledger is away (it may start after
    inference); a refusal is logged, not retried."""
    def work() -> None:
        deadline = time.monotonic() + give_up_s
        for card in cards:
            while True:
                try:
                    register_prices(ledger, card)
                    break
                except UpstreamUnavailable:
                    if time.monotonic() > deadline:
                        log.error("ledger away; model prices not registered", model=card.name)
                        return
                    time.sleep(retry_s)
                except UpstreamProblem as exc:
                    log.error("ledger refused model prices", model=card.name, detail=exc.problem.get("detail"))
                    break
                except Exception:  # noqa: BLE001 - e.g. the client closed at shutdown: nothing left to do
                    log.exception("model prices not registered", model=card.name)
                    return

    thread = threading.Thread(target=work, name="register-model-prices", daemon=True)
    thread.start()
    return thread

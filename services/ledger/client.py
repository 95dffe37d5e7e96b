"""The ledger's typed client: the only code that spells the ledger's ``/internal/…`` paths.

Methods are named as the routes in :mod:`services.ledger.api`, take and return :mod:`services.ledger.schemas`
models, and raise what the transport raises: ``UpstreamProblem`` carrying the ledger's problem+json (402 when
the budget cannot cover a hold or charge, 409 for a closed hold or a reused idempotency key, 404, 422) and
``UpstreamUnavailable`` (503) while the ledger cannot be reached. Money is integer micro-USD throughout.

The client retries a refused or timed-out call for up to ``settings.ledger_timeout_s`` seconds (a restart takes
a few), which is safe because every mutating call is idempotent: holds, charges, settles, releases and refunds
carry idempotency keys, and opening an existing account with the same budget returns it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import structlog

from services.common.errors import UpstreamProblem
from services.common.http import ServiceAPI, ServiceClient, Transport
from services.common.settings import ServiceSettings
from services.ledger.schemas import (
    Account,
    AccountCreate,
    Balance,
    Charge,
    ChargeCreate,
    Entry,
    Hold,
    HoldCharge,
    HoldCreate,
    HoldRelease,
    HoldSettle,
    HoldStatus,
    ModelPrices,
    PriceTable,
    Refund,
    RefundCreate,
    UsageBucket,
    UsageItem,
)

_log = structlog.get_logger("ledger.client")


class LedgerClient(ServiceAPI):
    """The ledger's internal API; with an :class:`AsyncServiceClient` transport every method returns an awaitable."""

    @classmethod
    def connect(cls, settings: ServiceSettings, transport: type[Transport] = ServiceClient, **overrides: Any) -> LedgerClient:
        """A client of ``settings.ledger_url`` with this service's token that retries (6 more attempts) while the
        ledger is unreachable, for at most ``settings.ledger_timeout_s`` seconds in all; ``overrides`` go to the
        transport (e.g. ``timeout_s``)."""
        options = {"name": "ledger", "timeout_s": settings.ledger_timeout_s, "retries": 6} | overrides
        return cls(transport(settings.ledger_url, settings.service_token, **options))

    def open_account(self, body: AccountCreate) -> Account:
        """Open a run's account with its whole budget; the same budget again returns it, another one is a 409."""
        return self._call("POST", "/internal/accounts", Account, body=body)

    def list_balances(self) -> list[Balance]:
        """Every account's balance, oldest first (for operators)."""
        return self._call("GET", "/internal/accounts", list[Balance])

    def get_balance(self, account_id: str) -> Balance:
        """Budget, held, spent and remaining micro-USD of ``account_id``, by usage kind; 404 if unknown."""
        return self._call("GET", f"/internal/accounts/{account_id}", Balance)

    def list_entries(self, account_id: str, *, after: str | None = None, limit: int = 1000) -> list[Entry]:
        """The account's append-only entries in written order, after entry ``after`` (at most ``limit``, ≤ 10,000)."""
        return self._call("GET", f"/internal/accounts/{account_id}/entries", list[Entry], params={"after": after, "limit": limit})

    def usage(self, account_id: str) -> list[UsageBucket]:
        """Charged usage by UTC hour and kind, oldest first."""
        return self._call("GET", f"/internal/accounts/{account_id}/usage", list[UsageBucket])

    def list_holds(self, account_id: str, *, status: HoldStatus | None = None) -> list[Hold]:
        """The account's holds, oldest first, only those with ``status`` if given."""
        return self._call("GET", f"/internal/accounts/{account_id}/holds", list[Hold], params={"status": status})

    def prices(self) -> PriceTable:
        """The price table in force (micro-USD per 1,000,000 units, per kind and model)."""
        return self._call("GET", "/internal/prices", PriceTable)

    def register_model_prices(self, model: str, body: ModelPrices) -> PriceTable:
        """Price base model ``model`` with ``body`` from now on (replacing its ``prices.yaml`` rows for those kinds); the
        table in force. Idempotent."""
        return self._call("PUT", f"/internal/prices/models/{quote(model, safe='')}", PriceTable, body=body)

    def create_hold(self, body: HoldCreate) -> Hold:
        """Reserve the priced cost of an estimated usage; 402 if the free balance cannot cover it."""
        return self._call("POST", "/internal/holds", Hold, body=body)

    def get_hold(self, hold_id: str) -> Hold:
        """The hold as it is now; 404 if unknown."""
        return self._call("GET", f"/internal/holds/{hold_id}", Hold)

    def charge_hold(self, hold_id: str, body: HoldCharge) -> Hold:
        """Charge actual usage against an open hold (409 once closed or when it would exceed the hold)."""
        return self._call("POST", f"/internal/holds/{hold_id}/charges", Hold, body=body)

    def settle_hold(self, hold_id: str, body: HoldSettle) -> Hold:
        """Charge the final usage against the hold and release the rest (409 once the hold is closed otherwise)."""
        return self._call("POST", f"/internal/holds/{hold_id}/settle", Hold, body=body)

    def release_hold(self, hold_id: str, body: HoldRelease) -> Hold:
        """Release what is left on the hold without charging."""
        return self._call("POST", f"/internal/holds/{hold_id}/release", Hold, body=body)

    def create_charge(self, body: ChargeCreate) -> Charge:
        """Charge usage straight from the free balance (no hold); 402 if it cannot cover it."""
        return self._call("POST", "/internal/charges", Charge, body=body)

    def create_refund(self, body: RefundCreate) -> Refund:
        """Give back (part of) a charge entry; never more than was charged (409)."""
        return self._call("POST", "/internal/refunds", Refund, body=body)

    def settle_or_charge(self, hold_id: str, usage: list[UsageItem], idempotency_key: str) -> None:
        """Settle hold ``hold_id`` with ``usage`` (charged) and release the rest; idempotent under ``idempotency_key``.

        Work is never free: if the hold was released or expired before the work it covered was settled, the usage
        is charged from the run's free balance instead (key ``late:<idempotency_key>``); if even that cannot be
        covered (402) the shortfall is logged as an error. A hold settled earlier is left as is. Blocking
        transport only. Raises ``UpstreamUnavailable`` while the ledger cannot be reached (callers retry later).
        """
        try:
            self.settle_hold(hold_id, HoldSettle(usage=usage, idempotency_key=idempotency_key))
            return
        except UpstreamProblem as exc:
            if exc.status != 409:
                raise
        hold = self.get_hold(hold_id)
        if hold.status == HoldStatus.settled or not usage:
            return
        try:
            self.create_charge(ChargeCreate(account_id=hold.account_id, usage=usage, purpose=f"{hold.purpose} (after its hold closed)",
                                            idempotency_key=f"late:{idempotency_key}"))
        except UpstreamProblem as exc:
            if exc.status != 402:
                raise
            _log.error("work done after its hold closed could not be charged", hold_id=hold_id,
                       usage=[u.model_dump(mode="json") for u in usage], detail=exc.detail)

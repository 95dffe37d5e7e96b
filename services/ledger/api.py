"""The ledger's internal HTTP API: thin routes over :class:`services.ledger.service.Ledger`.

Every route requires the service token (a run key is refused with 401). Errors are raised, never
formatted here; the shared handler renders them as problem+json.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi import status as http_status

from services.common.auth import service_caller
from services.common.errors import NotFound, PaymentRequired, Unauthorized, Unprocessable, problem_responses
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
)
from services.ledger.service import BudgetMismatch, HoldClosed, HoldExceeded, IdempotencyKeyReused, Ledger, RefundExceedsCharge


def get_ledger(request: Request) -> Ledger:
    return request.app.state.ledger


LedgerDep = Annotated[Ledger, Depends(get_ledger)]

router = APIRouter(prefix="/internal", tags=["ledger"], dependencies=[Depends(service_caller)])


@router.post(
    "/accounts",
    summary="Open an account",
    status_code=http_status.HTTP_201_CREATED,
    responses={200: {"description": "The account already existed with this budget", "model": Account}}
    | problem_responses(Unauthorized, BudgetMismatch, Unprocessable),
)
def open_account(body: AccountCreate, response: Response, ledger: LedgerDep) -> Account:
    """Open a run's account with its whole budget (201). Repeating it with the same budget returns the
    account (200); a different budget is a 409."""
    account, created = ledger.open_account(body)
    if not created:
        response.status_code = http_status.HTTP_200_OK
    return account


@router.get("/accounts", summary="List balances", responses=problem_responses(Unauthorized))
def list_balances(ledger: LedgerDep) -> list[Balance]:
    """Every account's balance (for operators), oldest first."""
    return ledger.balances()


@router.get("/accounts/{account_id}", summary="Get a balance", responses=problem_responses(Unauthorized, NotFound))
def get_balance(account_id: str, ledger: LedgerDep) -> Balance:
    """Budget, held, spent and remaining micro-USD, with spending and usage by kind. Works after exhaustion."""
    return ledger.balance(account_id)


@router.get("/accounts/{account_id}/entries", summary="List ledger entries", responses=problem_responses(Unauthorized, NotFound, Unprocessable))
def list_entries(
    account_id: str,
    ledger: LedgerDep,
    after: Annotated[str | None, Query(description="Return entries appended after this entry id.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> list[Entry]:
    """The account's append-only entries in the order they were written."""
    return ledger.entries(account_id, after=after, limit=limit)


@router.get("/accounts/{account_id}/usage", summary="Usage by hour", responses=problem_responses(Unauthorized, NotFound, Unprocessable))
def usage(account_id: str, ledger: LedgerDep, bucket: Literal["hour"] = "hour") -> list[UsageBucket]:
    """Charged usage aggregated by UTC hour and kind, oldest first."""
    return ledger.usage_by_hour(account_id)


@router.get("/accounts/{account_id}/holds", summary="List holds", responses=problem_responses(Unauthorized, NotFound, Unprocessable))
def list_holds(account_id: str, ledger: LedgerDep, status: HoldStatus | None = None) -> list[Hold]:
    """The account's holds, oldest first, optionally only those with ``status`` (e.g. stray open holds)."""
    return ledger.holds(account_id, status)


@router.get("/prices", summary="Get the price table", responses=problem_responses(Unauthorized))
def prices(ledger: LedgerDep) -> PriceTable:
    """The price table in force: micro-USD per 1,000,000 units, per kind and model (``"*"`` = default)."""
    return ledger.prices.table()


@router.put("/prices/models/{model}", summary="Register a model's prices", responses=problem_responses(Unauthorized, Unprocessable))
def register_model_prices(model: Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$", description="A base model's name (not `*`).")],
                          body: ModelPrices, ledger: LedgerDep) -> PriceTable:
    """A registered base model's prices (micro-USD per 1,000,000 tokens, per token kind), sent by inference when the
    model is registered: they replace the model's rows of ``prices.yaml`` for those kinds, and the table's ``version``
    changes (every entry names the table that priced it). The table in force is returned."""
    return ledger.register_model_prices(model, body)


@router.post(
    "/holds",
    summary="Place a hold",
    status_code=http_status.HTTP_201_CREATED,
    responses=problem_responses(Unauthorized, PaymentRequired, NotFound, IdempotencyKeyReused, Unprocessable),
)
def create_hold(body: HoldCreate, ledger: LedgerDep) -> Hold:
    """Reserve the priced cost of an estimated usage before long work starts. 402 (with
    ``remaining_usd_micros`` and ``required_usd_micros``) if the free balance cannot cover it."""
    return ledger.create_hold(body)


@router.get("/holds/{hold_id}", summary="Get a hold", responses=problem_responses(Unauthorized, NotFound))
def get_hold(hold_id: str, ledger: LedgerDep) -> Hold:
    """The hold as it is now."""
    return ledger.get_hold(hold_id)


@router.post(
    "/holds/{hold_id}/charges",
    summary="Charge against a hold",
    responses=problem_responses(Unauthorized, NotFound, HoldExceeded, HoldClosed, IdempotencyKeyReused, Unprocessable),
)
def charge_hold(hold_id: str, body: HoldCharge, ledger: LedgerDep) -> Hold:
    """Charge actual usage against an open hold and return the updated hold. 409 ``hold_exceeded`` if it
    costs more than is left on the hold, 409 ``hold_closed`` if the hold is settled or released."""
    return ledger.charge_hold(hold_id, body)


@router.post(
    "/holds/{hold_id}/settle",
    summary="Settle a hold",
    responses=problem_responses(Unauthorized, NotFound, HoldExceeded, HoldClosed, IdempotencyKeyReused, Unprocessable),
)
def settle_hold(hold_id: str, body: HoldSettle, ledger: LedgerDep) -> Hold:
    """Charge the final usage (may be empty) against the hold, release the rest, mark it settled.
    Repeating with the same key returns the same hold; a closed hold with a new key is a 409."""
    return ledger.settle_hold(hold_id, body)


@router.post(
    "/holds/{hold_id}/release",
    summary="Release a hold",
    responses=problem_responses(Unauthorized, NotFound, HoldClosed, IdempotencyKeyReused, Unprocessable),
)
def release_hold(hold_id: str, body: HoldRelease, ledger: LedgerDep) -> Hold:
    """Release whatever is left on the hold without charging; the hold becomes released."""
    return ledger.release_hold(hold_id, body)


@router.post(
    "/charges",
    summary="Charge directly",
    status_code=http_status.HTTP_201_CREATED,
    responses=problem_responses(Unauthorized, PaymentRequired, NotFound, IdempotencyKeyReused, Unprocessable),
)
def create_charge(body: ChargeCreate, ledger: LedgerDep) -> Charge:
    """Charge usage from the free balance, without a hold. 402 with ``remaining_usd_micros`` if it cannot
    be covered."""
    return ledger.charge(body)


@router.post(
    "/refunds",
    summary="Refund a charge",
    status_code=http_status.HTTP_201_CREATED,
    responses=problem_responses(Unauthorized, NotFound, RefundExceedsCharge, IdempotencyKeyReused, Unprocessable),
)
def create_refund(body: RefundCreate, ledger: LedgerDep) -> Refund:
    """Give back (part of) charge entry ``entry_id`` as a ``refund`` entry: spent goes down, usage stays.
    404 if the entry is not a charge of the account; 409 ``refund_exceeds_charge`` past what is left of it."""
    return ledger.refund(body)

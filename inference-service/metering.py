"""How a call is paid on the ledger (DESIGN §4): its :class:`Metering` (from the request's headers) and its
:class:`Payment` (the holds and charges of one admitted call).

A call with no prior hold places a hold for its worst case (prompt tokens + ``n`` × max completion tokens, priced by
the ledger) before anything is generated (the ledger's 402 passes through), then settles the actual tokens. A call
made inside a longer piece of work (an evaluation) names that work's hold and is charged against it afterwards, once
per idempotency key. Official test grading is unmetered. The actual tokens are the engine's result, streamed or not:
a stream whose client went away is charged for the tokens generated until then, no more and no fewer; a call that
generated nothing releases its own hold.

A call may be billed for a prompt other than the one the engine runs (``billed_prompt_tokens``): a candidate of the
evaluator track runs the run's messages under its own hidden harness, and the run pays for (and is told of) the
tokens of its own messages only, never a prompt-cache hit on the harness's prefix, at one model's prices for every
candidate (``billed_model``) (DESIGN §1: no public answer depends on a sealed system's hidden part).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import structlog

from services.common.auth import RunContext
from services.common.errors import Unprocessable, UpstreamProblem
from services.ledger.client import LedgerClient
from services.ledger.schemas import HoldCharge, HoldCreate, HoldRelease, HoldSettle, UsageItem, UsageKind

HOLD_TTL_S = 900  # a completion's own hold expires if this process dies before settling it
log = structlog.get_logger("inference")


@dataclass
class Metering:
    """How one call is paid: ``hold_id`` (an evaluation's hold, charged once per ``idempotency_key``), ``metered``
    (False: official test grading), ``context_tokens`` (a benchmark's smaller context), ``billed_prompt_tokens``
    (held, charged and reported as the prompt's tokens, none of them cached, instead of the prompt the engine runs),
    ``billed_model`` (priced as this model's tokens instead of the one that runs)."""

    hold_id: str | None = None
    metered: bool = True
    idempotency_key: str | None = None
    context_tokens: int | None = None
    billed_prompt_tokens: int | None = None
    billed_model: str | None = None

    def billed(self, prompt_tokens: int, cached_prompt_tokens: int) -> tuple[int, int]:
        """(prompt tokens, of which cached) as the call is charged and reported: the engine's, or the billed prompt's."""
        return (prompt_tokens, cached_prompt_tokens) if self.billed_prompt_tokens is None else (self.billed_prompt_tokens, 0)


def usage_items(base: str, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int = 0) -> list[UsageItem]:
    """Ledger usage items of one call on base model ``base`` (quantities in tokens): prompt tokens computed
    anew, prompt tokens from the prefix cache (only when the engine reports any), generated tokens."""
    cached = [UsageItem(kind=UsageKind.cached_prefill_tokens, quantity=cached_prompt_tokens, model=base)] if cached_prompt_tokens else []
    return [
        UsageItem(kind=UsageKind.prefill_tokens, quantity=prompt_tokens - cached_prompt_tokens, model=base),
        *cached,
        UsageItem(kind=UsageKind.decode_tokens, quantity=completion_tokens, model=base),
    ]


@dataclass
class Payment:
    """The ledger side of one call (``call_id``) on base model ``base``: its own hold, if it placed one
    (:meth:`hold`), then exactly one of :meth:`settle` (what the engine generated) or :meth:`release` (nothing).
    Every ledger call carries an idempotency key derived from the call's id (an evaluation's charge: from its
    ``idempotency_key``)."""

    ledger: LedgerClient
    call_id: str
    base: str
    metering: Metering
    own_hold: str | None = None

    @property
    def hold_id(self) -> str | None:
        """The hold the call is charged against: the evaluation's, or its own."""
        return self.metering.hold_id or self.own_hold

    async def hold(self, ctx: RunContext | None, prompt_tokens: int, completion_tokens: int) -> None:
        """Hold the worst case on the run's account if the call is metered and names no hold; ``Unprocessable``
        (``model``) for a metered call without a run, the ledger's 402 when the budget cannot cover it."""
        if not self.metering.metered or self.metering.hold_id is not None:
            return
        if ctx is None:
            raise Unprocessable("a metered completion needs a run context", field="model")
        hold = await asyncio.to_thread(self.ledger.create_hold, HoldCreate(
            account_id=ctx.run_id, purpose=f"inference {self.call_id}", usage=usage_items(self.base, prompt_tokens, completion_tokens),
            idempotency_key=f"hold:{self.call_id}", ttl_s=HOLD_TTL_S,
        ))
        self.own_hold = hold.hold_id

    async def release(self) -> None:
        """Release the call's own hold (nothing was generated); nothing else to undo."""
        if self.own_hold:
            await asyncio.to_thread(self.ledger.release_hold, self.own_hold, HoldRelease(idempotency_key=f"release:{self.call_id}"))

    async def settle(self, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int) -> None:
        """Charge the tokens generated: settle the call's own hold, or charge the evaluation's (a repeated call with the
        same idempotency key is charged once); nothing for an unmetered call."""
        usage = usage_items(self.base, prompt_tokens, completion_tokens, cached_prompt_tokens)
        if self.own_hold:
            await asyncio.to_thread(self.ledger.settle_hold, self.own_hold, HoldSettle(usage=usage, idempotency_key=f"settle:{self.call_id}"))
        elif self.metering.metered and self.metering.hold_id:
            key = f"charge:{self.metering.idempotency_key or self.call_id}"
            try:
                await asyncio.to_thread(self.ledger.charge_hold, self.metering.hold_id, HoldCharge(usage=usage, idempotency_key=key))
            except UpstreamProblem as exc:
                if exc.code != "idempotency_key_reused":
                    raise
                # this call (same key) was charged once already, for tokens that differed slightly: not again
                log.warning("repeated call already charged", idempotency_key=self.metering.idempotency_key, hold_id=self.metering.hold_id)

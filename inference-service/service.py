"""Inference logic: resolve a model name to base + adapter, meter the call on the ledger, generate.

Metering (DESIGN §4): a call with no prior hold places a hold for its worst case (prompt tokens +
max completion tokens, priced by the ledger), generates, then settles the actual tokens. A call made
inside a longer piece of work (an evaluation) names that work's hold and is charged against it afterwards.
Official test grading is unmetered. If the budget cannot cover the worst case, nothing is generated (402).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from inference_service.models import CompletionLog
from inference_service.schemas import ModelDetail
from trainer_service.client import TrainerClient

from services.common import artifacts
from services.common.auth import RunContext
from services.common.contracts import ChatChoice, ChatCompletion, ChatCompletionRequest, ChatMessage, ModelOut, PromptTokensDetails, Usage
from services.common.db import Database, utcnow
from services.common.errors import NotFound, Unprocessable, UpstreamProblem
from services.common.ids import has_prefix
from services.common.llms import BASE_MODELS, base_model_dir
from services.common.settings import ServiceSettings
from services.ledger.client import LedgerClient
from services.ledger.schemas import HoldCharge, HoldCreate, HoldRelease, HoldSettle, UsageItem, UsageKind

if TYPE_CHECKING:
    from inference_service.engine import MicroBatcher

DEFAULT_MAX_TOKENS = 256
HOLD_TTL_S = 900  # a completion's own hold expires if this process dies before settling it
log = structlog.get_logger("inference")


@dataclass(frozen=True)
class ResolvedModel:
    """A model name as served: its base model, and the checkpoint's adapter (name and local folder) if any."""

    base: str
    adapter_name: str | None
    adapter_dir: Path | None


class ContextExceeded(Unprocessable):
    """The prompt and ``max_tokens`` do not fit the context window."""

    code, title = "context_exceeded", "The prompt and max_tokens exceed the context length"


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
class Inference:
    """The inference service of one process: settings, database, the ledger and trainer clients, and the
    loaded engines (``batchers``: base model name → its :class:`~inference_service.engine.MicroBatcher`)."""

    settings: ServiceSettings
    db: Database
    ledger: LedgerClient
    trainer: TrainerClient
    batchers: dict[str, MicroBatcher] = field(default_factory=dict)

    def load_engines(self) -> None:
        """Load one transformers engine (with its micro-batcher) per base model prepared under ``settings.models_dir``."""
        from inference_service.engine import MicroBatcher, TransformersEngine

        for name in BASE_MODELS:
            try:
                path = base_model_dir(name, self.settings.models_dir)
            except FileNotFoundError:
                continue
            self.batchers[name] = MicroBatcher(TransformersEngine(path))

    async def aclose(self) -> None:
        """Stop the engines' batchers and close the clients and the database."""
        for batcher in self.batchers.values():
            await batcher.aclose()
        self.ledger.close()
        self.trainer.close()
        self.db.engine.dispose()

    def list_models(self) -> list[ModelOut]:
        """Servable base models, OpenAI ``model`` objects."""
        return [ModelOut(id=name) for name in self.batchers]

    def resolve_model(self, ctx: RunContext | None, model: str) -> ResolvedModel:
        """A base name or one of the run's ``ckpt_…``; anything else → ``Unprocessable`` naming ``model``."""
        if has_prefix(model, "ckpt"):
            try:
                rec = self.trainer.get_checkpoint(ctx, model)
            except UpstreamProblem as exc:
                if exc.status == 404:
                    raise Unprocessable(f"unknown model {model!r}", field="model") from exc
                raise
            if rec.base_model not in self.batchers:
                raise Unprocessable(f"base model {rec.base_model!r} of {model} is not loaded", field="model")
            return ResolvedModel(rec.base_model, model, artifacts.local_path(rec.uri))
        if model not in self.batchers:
            raise Unprocessable(f"unknown model {model!r}; served: {', '.join(sorted(self.batchers))} or a checkpoint id", field="model")
        return ResolvedModel(model, None, None)

    def describe_model(self, ctx: RunContext | None, model: str) -> ModelDetail:
        """The model object for ``model``; ``NotFound`` if it is neither a served base nor the run's checkpoint."""
        try:
            resolved = self.resolve_model(ctx, model)
        except Unprocessable as exc:
            raise NotFound(exc.detail) from exc
        return ModelDetail(id=model, base_model=resolved.base, adapter=resolved.adapter_name)

    async def chat_completion(
        self, ctx: RunContext | None, req: ChatCompletionRequest, *, hold_id: str | None, metered: bool, idempotency_key: str | None = None,
        context_tokens: int | None = None,
    ) -> ChatCompletion:
        """Serve one OpenAI chat completion for ``ctx``'s run.

        ``hold_id``: charge the actual tokens against this existing hold (evaluations), with the ledger key
        ``charge:<idempotency_key>`` when one is given (a repeated call is charged once). ``metered=False``:
        no charge (official test grading). Otherwise hold the worst case, generate, settle. ``context_tokens``:
        the context length to run with, if smaller than the model's. Raises ``Unprocessable`` (model, or a
        metered call without a run), ``ContextExceeded`` (messages), and passes the ledger's 402 through before
        any generation happens.
        """
        from inference_service.engine import GenerationRequest

        resolved = self.resolve_model(ctx, req.model)
        batcher = self.batchers[resolved.base]
        messages = [m.model_dump() for m in req.messages]
        tools = req.tool_dicts()
        limit = req.completion_limit(DEFAULT_MAX_TOKENS)
        call_id = f"chatcmpl-{uuid.uuid4().hex}"
        own_hold: str | None = None
        prompt_tokens = batcher.engine.count_prompt_tokens(messages, tools)
        context = min(batcher.engine.context_tokens, context_tokens or batcher.engine.context_tokens)
        if prompt_tokens + limit > context:
            raise ContextExceeded(f"the prompt is {prompt_tokens} tokens; with max_tokens {limit} it exceeds the context of {context} tokens",
                                  field="messages", prompt_tokens=prompt_tokens, context_tokens=context)
        if metered and hold_id is None:
            if ctx is None:
                raise Unprocessable("a metered completion needs a run context", field="model")
            hold = await asyncio.to_thread(self.ledger.create_hold, HoldCreate(
                account_id=ctx.run_id, purpose=f"inference {call_id}", usage=usage_items(resolved.base, prompt_tokens, limit),
                idempotency_key=f"hold:{call_id}", ttl_s=HOLD_TTL_S,
            ))
            own_hold = hold.hold_id
        start = time.perf_counter()
        try:
            result = await batcher.submit(
                GenerationRequest(messages=messages, max_tokens=limit, temperature=req.temperature, top_p=req.top_p, stop=req.stop_list(),
                                  seed=req.seed, tools=tools),
                resolved.adapter_name, resolved.adapter_dir,
            )
        except BaseException:
            if own_hold:
                await asyncio.to_thread(self.ledger.release_hold, own_hold, HoldRelease(idempotency_key=f"release:{call_id}"))
            raise
        usage = usage_items(resolved.base, result.prompt_tokens, result.completion_tokens, result.cached_prompt_tokens)
        if own_hold:
            await asyncio.to_thread(self.ledger.settle_hold, own_hold, HoldSettle(usage=usage, idempotency_key=f"settle:{call_id}"))
        elif metered and hold_id:
            try:
                await asyncio.to_thread(self.ledger.charge_hold, hold_id, HoldCharge(usage=usage, idempotency_key=f"charge:{idempotency_key or call_id}"))
            except UpstreamProblem as exc:
                if exc.code != "idempotency_key_reused":
                    raise
                # this call (same key) was charged once already, for tokens that differed slightly: not again
                log.warning("repeated call already charged", idempotency_key=idempotency_key, hold_id=hold_id)
        latency_ms = int((time.perf_counter() - start) * 1000)
        await asyncio.to_thread(self._log, call_id, ctx, req.model, result.prompt_tokens, result.completion_tokens, metered, hold_id or own_hold,
                                latency_ms)
        return ChatCompletion(
            id=call_id, created=int(time.time()), model=req.model,
            choices=[ChatChoice(index=0, message=ChatMessage(role="assistant", content=result.text), finish_reason=result.finish_reason)],
            usage=Usage(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                        total_tokens=result.prompt_tokens + result.completion_tokens,
                        prompt_tokens_details=PromptTokensDetails(cached_tokens=result.cached_prompt_tokens)),
        )

    def _log(self, call_id: str, ctx: RunContext | None, model: str, prompt_tokens: int, completion_tokens: int, metered: bool,
             hold_id: str | None, latency_ms: int) -> None:
        with self.db.session() as s:
            s.add(CompletionLog(id=call_id, run_id=ctx.run_id if ctx else None, model=model, prompt_tokens=prompt_tokens,
                                completion_tokens=completion_tokens, metered=metered, hold_id=hold_id, latency_ms=latency_ms, created_at=utcnow()))

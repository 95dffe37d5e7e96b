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
from typing import Any

import structlog
from inference_service.models import CompletionLog

from services.common import artifacts
from services.common.auth import RunContext
from services.common.llms import BASE_MODELS, base_model_dir
from services.common.contracts import ChatChoice, ChatCompletion, ChatCompletionRequest, ChatMessage, PromptTokensDetails, Usage
from services.common.db import Database, utcnow
from services.common.errors import NotFound, Unprocessable, UpstreamProblem
from services.common.http import ServiceClient, ledger_client
from services.common.ids import has_prefix
from services.common.lazy import once
from services.common.settings import ServiceSettings

DEFAULT_MAX_TOKENS = 256
HOLD_TTL_S = 900  # a completion's own hold expires if this process dies before settling it
log = structlog.get_logger("inference")


@dataclass
class Runtime:
    """Settings, database, clients and the loaded engines of this process."""

    settings: ServiceSettings
    db: Database
    ledger: ServiceClient
    trainer: ServiceClient
    batchers: dict[str, Any] = field(default_factory=dict)  # base model name -> MicroBatcher


@once
def runtime() -> Runtime:
    s = ServiceSettings()
    return Runtime(
        settings=s,
        db=Database(s.database_url_for("inference")),
        ledger=ledger_client(s),
        trainer=ServiceClient(s.trainer_url, s.service_token, name="trainer", timeout_s=s.http_timeout_s),
    )


def load_engines() -> None:
    """Load one transformers engine (with its micro-batcher) per prepared base model."""
    from inference_service.engine import MicroBatcher, TransformersEngine

    rt = runtime()
    for name in BASE_MODELS:
        try:
            path = base_model_dir(name, rt.settings.models_dir)
        except FileNotFoundError:
            continue
        rt.batchers[name] = MicroBatcher(TransformersEngine(path))


def list_models() -> list[dict[str, Any]]:
    """Servable base models, OpenAI ``model`` objects."""
    return [{"id": name, "object": "model", "owned_by": "crucible"} for name in runtime().batchers]


@dataclass(frozen=True)
class ResolvedModel:
    base: str
    adapter_name: str | None
    adapter_dir: Path | None


def resolve_model(ctx: RunContext | None, model: str) -> ResolvedModel:
    """A base name or one of the run's ``ckpt_…``; anything else → ``Unprocessable`` naming ``model``."""
    rt = runtime()
    if has_prefix(model, "ckpt"):
        try:
            rec = rt.trainer.get(f"/internal/checkpoints/{model}", ctx=ctx)
        except UpstreamProblem as exc:
            if exc.status == 404:
                raise Unprocessable(f"unknown model {model!r}", field="model") from exc
            raise
        if rec["base_model"] not in rt.batchers:
            raise Unprocessable(f"base model {rec['base_model']!r} of {model} is not loaded", field="model")
        return ResolvedModel(rec["base_model"], model, artifacts.local_path(rec["uri"]))
    if model not in rt.batchers:
        raise Unprocessable(f"unknown model {model!r}; served: {', '.join(sorted(rt.batchers))} or a checkpoint id", field="model")
    return ResolvedModel(model, None, None)


def describe_model(ctx: RunContext | None, model: str) -> dict[str, Any]:
    """The model object for ``model``; ``NotFound`` if it is neither a served base nor the run's checkpoint."""
    try:
        resolved = resolve_model(ctx, model)
    except Unprocessable as exc:
        raise NotFound(exc.detail) from exc
    return {"id": model, "object": "model", "owned_by": "crucible", "base_model": resolved.base, "adapter": resolved.adapter_name}


class ContextExceeded(Unprocessable):
    """The prompt and ``max_tokens`` do not fit the context window."""

    code, title = "context_exceeded", "The prompt and max_tokens exceed the context length"


def _usage(base: str, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int = 0) -> list[dict[str, Any]]:
    """Ledger usage items of one call: prompt tokens computed anew, prompt tokens from the prefix cache (when
    the engine reports any), generated tokens."""
    cached = [{"kind": "cached_prefill_tokens", "quantity": cached_prompt_tokens, "model": base}] if cached_prompt_tokens else []
    return [
        {"kind": "prefill_tokens", "quantity": prompt_tokens - cached_prompt_tokens, "model": base},
        *cached,
        {"kind": "decode_tokens", "quantity": completion_tokens, "model": base},
    ]


async def chat_completion(
    ctx: RunContext | None, req: ChatCompletionRequest, *, hold_id: str | None, metered: bool, idempotency_key: str | None = None,
    context_tokens: int | None = None,
) -> ChatCompletion:
    """Serve one OpenAI chat completion for ``ctx``'s run.

    ``hold_id``: charge the actual tokens against this existing hold (evaluations), with the ledger key
    ``charge:<idempotency_key>`` when one is given (a repeated call is charged once). ``metered=False``:
    no charge (official test grading). Otherwise hold the worst case, generate, settle. Raises
    ``Unprocessable`` (model), and passes the ledger's 402 through before any generation happens.
    """
    from inference_service.engine import GenerationRequest

    rt = runtime()
    resolved = resolve_model(ctx, req.model)
    batcher = rt.batchers[resolved.base]
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
        hold = await asyncio.to_thread(rt.ledger.post, "/internal/holds", json={
            "account_id": ctx.run_id, "purpose": f"inference {call_id}",
            "usage": _usage(resolved.base, prompt_tokens, limit), "idempotency_key": f"hold:{call_id}",
            "ttl_s": HOLD_TTL_S,
        })
        own_hold = hold["hold_id"]
    start = time.perf_counter()
    try:
        result = await batcher.submit(
            GenerationRequest(messages=messages, max_tokens=limit, temperature=req.temperature, top_p=req.top_p, stop=req.stop_list(), seed=req.seed,
                              tools=tools),
            resolved.adapter_name, resolved.adapter_dir,
        )
    except BaseException:
        if own_hold:
            await asyncio.to_thread(rt.ledger.post, f"/internal/holds/{own_hold}/release", json={"idempotency_key": f"release:{call_id}"})
        raise
    usage = _usage(resolved.base, result.prompt_tokens, result.completion_tokens, result.cached_prompt_tokens)
    if own_hold:
        await asyncio.to_thread(rt.ledger.post, f"/internal/holds/{own_hold}/settle", json={"usage": usage, "idempotency_key": f"settle:{call_id}"})
    elif metered and hold_id:
        try:
            await asyncio.to_thread(rt.ledger.post, f"/internal/holds/{hold_id}/charges",
                                    json={"usage": usage, "idempotency_key": f"charge:{idempotency_key or call_id}"})
        except UpstreamProblem as exc:
            if exc.code != "idempotency_key_reused":
                raise
            # this call (same key) was charged once already, for tokens that differed slightly: not again
            log.warning("repeated call already charged", idempotency_key=idempotency_key, hold_id=hold_id)
    latency_ms = int((time.perf_counter() - start) * 1000)
    await asyncio.to_thread(_log, call_id, ctx, req.model, result.prompt_tokens, result.completion_tokens, metered, hold_id or own_hold, latency_ms)
    return ChatCompletion(
        id=call_id, created=int(time.time()), model=req.model,
        choices=[ChatChoice(index=0, message=ChatMessage(role="assistant", content=result.text), finish_reason=result.finish_reason)],
        usage=Usage(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens, total_tokens=result.prompt_tokens + result.completion_tokens,
                    prompt_tokens_details=PromptTokensDetails(cached_tokens=result.cached_prompt_tokens)),
    )


def _log(call_id: str, ctx: RunContext | None, model: str, prompt_tokens: int, completion_tokens: int, metered: bool, hold_id: str | None, latency_ms: int) -> None:
    with runtime().db.session() as s:
        s.add(CompletionLog(id=call_id, run_id=ctx.run_id if ctx else None, model=model, prompt_tokens=prompt_tokens,
                            completion_tokens=completion_tokens, metered=metered, hold_id=hold_id, latency_ms=latency_ms, created_at=utcnow()))



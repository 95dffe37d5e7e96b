"""Inference logic: resolve a model name to base + checkpoint (a LoRA adapter or full weights), meter the call on the
ledger, generate on the engine.

Metering (DESIGN §4): a call with no prior hold places a hold for its worst case (prompt tokens + ``n`` × max
completion tokens, priced by the ledger), generates, then settles the actual tokens. A call made inside a longer
piece of work (an evaluation) names that work's hold and is charged against it afterwards. Official test grading
is unmetered. If the budget cannot cover the worst case, nothing is generated (402). The actual tokens are the
engine's result, streamed or not: a client that goes away mid-stream stops the generation and is charged for the
tokens generated until then, no more and no fewer.

The OpenAI protocol on top of the engine seam (:mod:`inference_service.engines.base`) lives here: chat requests
become a :class:`~inference_service.engines.base.GenerationRequest` (tools rendered, ``tool_choice`` and
``response_format`` as a JSON schema), a request needing a feature the engine lacks is a 422 naming the field (a
full-weight checkpoint on an engine that serves none: ``model``), and answers become OpenAI objects (tool calls parsed,
log-probabilities, stream chunks).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from inference_service.chat import may_become_tool_call, parse_tool_calls, tool_call_schema
from inference_service.engines.base import (
    Adapter,
    Delta,
    Engine,
    Feature,
    Generation,
    GenerationRequest,
    GenerationResult,
    SchemaNotServed,
    TokenLogprob,
)
from inference_service.models import CompletionLog
from inference_service.schemas import ModelDetail
from inference_service.settings import InferenceSettings
from pydantic import BaseModel
from trainer_service.client import TrainerClient

from services.common import artifacts
from services.common.auth import RunContext
from services.common.db import Database, utcnow
from services.common.errors import NotFound, Unprocessable, UpstreamProblem
from services.common.ids import has_prefix
from services.common.llms import ModelCard, UnknownBaseModel, model_card, prepare_model, registry
from services.common.openai_protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatTokenLogprob,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkDelta,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    MessageToolCall,
    ModelOut,
    NamedToolChoice,
    PromptTokensDetails,
    ToolCallDelta,
    ToolCallFunction,
    TopLogprob,
    Usage,
)
from services.ledger.client import LedgerClient
from services.ledger.schemas import HoldCharge, HoldCreate, HoldRelease, HoldSettle, UsageItem, UsageKind

HOLD_TTL_S = 900  # a completion's own hold expires if this process dies before settling it
log = structlog.get_logger("inference")

# the wire field that asks for each optional engine feature (chat, then text completions)
_FEATURE_FIELDS = {
    Feature.logprobs: "logprobs", Feature.prompt_logprobs: "echo", Feature.guided_json: "response_format",
    Feature.penalties: "frequency_penalty", Feature.logit_bias: "logit_bias", Feature.seed: "seed", Feature.full_weights: "model",
}


@dataclass(frozen=True)
class ResolvedModel:
    """A model name as served: its base model and, for a checkpoint, the checkpoint (``adapter``: a LoRA adapter on
    the base, or full weights of it, by the trainer's record's ``kind``)."""

    base: str
    adapter: Adapter | None

    def needs(self) -> set[Feature]:
        """The optional engine features serving this model takes (a full-weight checkpoint: ``full_weights``)."""
        return self.adapter.needs() if self.adapter is not None else set()


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
class Metering:
    """How one call is paid: ``hold_id`` (an evaluation's hold, charged once per ``idempotency_key``), ``metered``
    (False: official test grading), ``context_tokens`` (a benchmark's smaller context)."""

    hold_id: str | None = None
    metered: bool = True
    idempotency_key: str | None = None
    context_tokens: int | None = None


@dataclass
class _Call:
    """One admitted call: resolved, checked, held; ``generations`` run on ``engine`` and are settled together."""

    id: str
    ctx: RunContext | None
    model: str
    resolved: ResolvedModel
    engine: Engine
    requests: list[GenerationRequest]
    prompt_tokens: list[int]
    metering: Metering
    field: str  # the wire field of the prompt (``messages`` or ``prompt``)
    own_hold: str | None = None
    started: float = field(default_factory=time.perf_counter)
    generations: list[Generation] = field(default_factory=list)


@dataclass
class Inference:
    """The inference service of one process: settings, database, the ledger and trainer clients, and the loaded
    engines (base model name → its :class:`~inference_service.engines.base.Engine`)."""

    settings: InferenceSettings
    db: Database
    ledger: LedgerClient
    trainer: TrainerClient
    engines: dict[str, Engine] = field(default_factory=dict)
    cards: dict[str, ModelCard] = field(default_factory=dict)  # the served base models' cards (services.common.llms)
    _background: set[asyncio.Task[Any]] = field(default_factory=set)
    _registering: threading.Lock = field(default_factory=threading.Lock)

    def load_engines(self) -> None:
        """Load one engine of ``settings.engine``'s kind per base model prepared under ``settings.models_dir``."""
        from inference_service.engines import load_engines

        self.cards.update(registry(self.settings.models_dir))
        self.engines.update(load_engines(self.settings))

    def register_model(self, card: ModelCard) -> ModelCard:
        """Prepare ``card`` into ``settings.models_dir`` (once) and serve it from now on, without a restart: one engine
        of ``settings.engine``'s kind is loaded for it unless it is served already (a card differing only in metadata
        replaces the served one's); the card's prices go on the ledger's table first. Blocking (minutes for a large GGUF):
        call it in a thread. Raises what :func:`services.common.llms.prepare_model` raises, and the ledger's errors."""
        from inference_service.engines import load_engine
        from inference_service.prices import register_prices

        prepare_model(card, self.settings.models_dir)
        register_prices(self.ledger, card)  # before it is served: never at the default prices
        with self._registering:
            if card.name not in self.engines:
                self.engines[card.name] = load_engine(card.name, self.settings)
            self.cards[card.name] = card
        return card

    async def aclose(self) -> None:
        """Settle what is still settling, stop the engines, close the clients and the database."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        for engine in self.engines.values():
            await engine.aclose()
        self.ledger.close()
        self.trainer.close()
        self.db.engine.dispose()

    # ------------------------------------------------------------------ models

    def list_models(self) -> list[ModelOut]:
        """Servable base models, OpenAI ``model`` objects: those loaded, then those registered in the models folder since
        this process started (by another replica; loaded on first use)."""
        return [ModelOut(id=name) for name in [*self.engines, *(n for n in registry(self.settings.models_dir) if n not in self.engines)]]

    def _serve_registered(self, name: str) -> bool:
        """Whether base model ``name`` is served, loading its engine first if it was registered in the models folder since
        this process started (by another replica of inference)."""
        if name in self.engines:
            return True
        try:
            card = model_card(name, self.settings.models_dir)
        except UnknownBaseModel:
            return False
        self.register_model(card)
        return True

    def resolve_model(self, ctx: RunContext | None, model: str) -> ResolvedModel:
        """A base name or one of the run's ``ckpt_…``; anything else → ``Unprocessable`` naming ``model``."""
        if has_prefix(model, "ckpt"):
            try:
                rec = self.trainer.get_checkpoint(ctx, model)
            except UpstreamProblem as exc:
                if exc.status == 404:
                    raise Unprocessable(f"unknown model {model!r}", field="model") from exc
                raise
            if not self._serve_registered(rec.base_model):
                raise Unprocessable(f"base model {rec.base_model!r} of {model} is not loaded", field="model")
            return ResolvedModel(rec.base_model, Adapter(model, artifacts.local_path(rec.uri), kind=rec.kind))
        if not self._serve_registered(model):
            raise Unprocessable(f"unknown model {model!r}; served: {', '.join(sorted(self.engines))} or a checkpoint id", field="model")
        return ResolvedModel(model, None)

    def describe_model(self, ctx: RunContext | None, model: str) -> ModelDetail:
        """The model object for ``model``; ``NotFound`` if it is neither a served base nor the run's checkpoint."""
        try:
            resolved = self.resolve_model(ctx, model)
        except Unprocessable as exc:
            raise NotFound(exc.detail) from exc
        return ModelDetail(id=model, base_model=resolved.base, adapter=resolved.adapter.name if resolved.adapter else None)

    # ------------------------------------------------------------------ chat completions

    async def chat_completion(self, ctx: RunContext | None, req: ChatCompletionRequest, metering: Metering) -> ChatCompletion:
        """Serve one OpenAI chat completion for ``ctx``'s run (not streamed).

        Raises ``Unprocessable`` (the model; a feature the engine lacks, naming its field; a metered call without a
        run), ``ContextExceeded`` (messages), and passes the ledger's 402 through before anything is generated.
        """
        call = await self._admit(ctx, req.model, [_chat_request(req)], metering, field="messages", refused=_chat_refusal(req),
                                 limit_field=_limit_field(req))
        result = await self._run(call)
        choices = [_chat_choice(req, i, choice) for i, choice in enumerate(result.choices)]
        return ChatCompletion(id=call.id, created=int(time.time()), model=req.model, choices=choices, usage=_usage([result]))

    async def chat_completion_stream(self, ctx: RunContext | None, req: ChatCompletionRequest, metering: Metering) -> AsyncIterator[str]:
        """Admit a streamed chat completion (errors as :meth:`chat_completion`, raised here, before any event) and
        return its server-sent events: ``data: <chat.completion.chunk>`` lines, then ``data: [DONE]``."""
        call = await self._admit(ctx, req.model, [_chat_request(req)], metering, field="messages", refused=_chat_refusal(req),
                                 limit_field=_limit_field(req))
        return self._events(call, _ChatStream(req, call.id))

    # ------------------------------------------------------------------ text completions

    async def completion(self, ctx: RunContext | None, req: CompletionRequest, metering: Metering) -> Completion:
        """Serve one OpenAI text completion (``/v1/completions``; not streamed); errors as :meth:`chat_completion`,
        ``ContextExceeded`` naming ``prompt``."""
        call = await self._admit(ctx, req.model, _completion_requests(req), metering, field="prompt", refused=_completion_refusal(req))
        results = await asyncio.gather(*(g.result() for g in await self._start(call)))
        await self._settle(call, results)
        choices = [_completion_choice(req, prompt_i * req.n + j, result, choice)
                   for prompt_i, result in enumerate(results) for j, choice in enumerate(result.choices)]
        return Completion(id=call.id, created=int(time.time()), model=req.model, choices=choices, usage=_usage(results))

    async def completion_stream(self, ctx: RunContext | None, req: CompletionRequest, metering: Metering) -> AsyncIterator[str]:
        """Admit a streamed text completion and return its server-sent events (one prompt per streamed request)."""
        if len(req.prompts()) > 1:
            raise Unprocessable("a streamed completion takes one prompt", field="prompt")
        call = await self._admit(ctx, req.model, _completion_requests(req), metering, field="prompt", refused=_completion_refusal(req))
        return self._events(call, _CompletionStream(req, call.id))

    # ------------------------------------------------------------------ admission, generation, settlement

    async def _admit(self, ctx: RunContext | None, model: str, requests: list[GenerationRequest], metering: Metering, *, field: str,
                     refused: Callable[[Feature], str], limit_field: str = "max_tokens") -> _Call:
        """Resolve the model, check the engine serves the requests, fit them in the context, hold the worst case."""
        resolved = await asyncio.to_thread(self.resolve_model, ctx, model)
        engine = self.engines[resolved.base]
        if Feature.full_weights in resolved.needs() - engine.features:
            raise Unprocessable(f"{model} is a full-weight checkpoint, which this deployment's engine ({self.settings.engine}) does not serve: "
                                "full checkpoints are served by the transformers engine (CRUCIBLE_ENGINE=transformers); LoRA checkpoints by "
                                "every engine", field="model")
        for request in requests:
            missing = sorted(request.needs() - engine.features)
            if missing:
                name = refused(missing[0])
                raise Unprocessable(f"{name}: this deployment's engine does not serve it ({missing[0].value})", field=name)
        for request in requests:
            if request.json_schema is not None:
                try:
                    await asyncio.to_thread(engine.check_schema, request.json_schema)
                except SchemaNotServed as exc:
                    name = refused(Feature.guided_json)
                    raise Unprocessable(f"{name}: {exc}", field=name) from exc
        try:
            prompts = [await asyncio.to_thread(engine.prompt_ids, r) for r in requests]
        except ValueError as exc:
            raise Unprocessable(str(exc), field=getattr(exc, "field", field)) from exc
        prompt_tokens = [len(p) for p in prompts]
        card = self.cards.get(resolved.base)
        context = min(engine.context_tokens, (card and card.context_tokens) or engine.context_tokens, metering.context_tokens or engine.context_tokens)
        limits = []
        for request, tokens in zip(requests, prompt_tokens, strict=True):
            limit = request.max_tokens if request.max_tokens is not None else context - tokens
            if tokens + limit > context or (request.max_tokens is None and limit < 1):
                asked = "" if request.max_tokens is None else f"; with max_tokens {limit}"
                at_fault = limit_field if request.max_tokens is not None and tokens < context else field  # the prompt alone fits
                raise ContextExceeded(f"the prompt is {tokens} tokens{asked} it exceeds the context of {context} tokens",
                                      field=at_fault, prompt_tokens=tokens, context_tokens=context)
            limits.append(limit)
        # rendered once: the engine gets the token ids (chat messages and tools are in them)
        requests = [replace(r, max_tokens=limit, prompt=ids, messages=None, tools=None) for r, limit, ids in zip(requests, limits, prompts, strict=True)]
        call = _Call(id=f"{'chatcmpl' if field == 'messages' else 'cmpl'}-{uuid.uuid4().hex}", ctx=ctx, model=model, resolved=resolved,
                     engine=engine, requests=requests, prompt_tokens=prompt_tokens, metering=metering, field=field)
        if metering.metered and metering.hold_id is None:
            if ctx is None:
                raise Unprocessable("a metered completion needs a run context", field="model")
            worst = sum(tokens + r.n * (r.max_tokens or 0) for r, tokens in zip(requests, prompt_tokens, strict=True))
            hold = await asyncio.to_thread(self.ledger.create_hold, HoldCreate(
                account_id=ctx.run_id, purpose=f"inference {call.id}", usage=usage_items(resolved.base, sum(prompt_tokens), worst - sum(prompt_tokens)),
                idempotency_key=f"hold:{call.id}", ttl_s=HOLD_TTL_S,
            ))
            call.own_hold = hold.hold_id
        return call

    async def _start(self, call: _Call) -> list[Generation]:
        """Submit the call's requests; if one is refused, cancel the rest and release the hold. ``Unprocessable`` for
        a request the engine refuses, naming the prompt's field (JSON schemas were checked when it was admitted)."""
        try:
            for request in call.requests:
                call.generations.append(await call.engine.submit(request, call.resolved.adapter))
        except BaseException as exc:
            for generation in call.generations:
                generation.cancel()
            await self._release(call)
            if isinstance(exc, ValueError):
                raise Unprocessable(str(exc), field=call.field) from exc
            raise
        return call.generations

    async def _run(self, call: _Call) -> GenerationResult:
        (generation,) = await self._start(call)
        try:
            result = await generation.result()
        except BaseException:
            generation.cancel()
            await self._release(call)
            raise
        await self._settle(call, [result])
        return result

    async def _release(self, call: _Call) -> None:
        if call.own_hold:
            await asyncio.to_thread(self.ledger.release_hold, call.own_hold, HoldRelease(idempotency_key=f"release:{call.id}"))

    async def _settle(self, call: _Call, results: list[GenerationResult]) -> None:
        """Charge the tokens the engine reports (settle the call's own hold, or charge the evaluation's), and log."""
        prompt = sum(r.prompt_tokens for r in results)
        completion = sum(r.completion_tokens for r in results)
        usage = usage_items(call.resolved.base, prompt, completion, sum(r.cached_prompt_tokens for r in results))
        metering = call.metering
        if call.own_hold:
            await asyncio.to_thread(self.ledger.settle_hold, call.own_hold, HoldSettle(usage=usage, idempotency_key=f"settle:{call.id}"))
        elif metering.metered and metering.hold_id:
            try:
                await asyncio.to_thread(self.ledger.charge_hold, metering.hold_id,
                                        HoldCharge(usage=usage, idempotency_key=f"charge:{metering.idempotency_key or call.id}"))
            except UpstreamProblem as exc:
                if exc.code != "idempotency_key_reused":
                    raise
                # this call (same key) was charged once already, for tokens that differed slightly: not again
                log.warning("repeated call already charged", idempotency_key=metering.idempotency_key, hold_id=metering.hold_id)
        latency_ms = int((time.perf_counter() - call.started) * 1000)
        await asyncio.to_thread(self._log, call, prompt, completion, latency_ms)

    def _log(self, call: _Call, prompt_tokens: int, completion_tokens: int, latency_ms: int) -> None:
        with self.db.session() as s:
            s.add(CompletionLog(id=call.id, run_id=call.ctx.run_id if call.ctx else None, model=call.model, prompt_tokens=prompt_tokens,
                                completion_tokens=completion_tokens, metered=call.metering.metered,
                                hold_id=call.metering.hold_id or call.own_hold, latency_ms=latency_ms, created_at=utcnow()))

    async def _events(self, call: _Call, stream: _ChatStream | _CompletionStream) -> AsyncIterator[str]:
        """Server-sent events of a streamed call. If the client goes away (the iterator is closed or cancelled), the
        generation is stopped and settled in the background for exactly the tokens it generated."""
        (generation,) = await self._start(call)
        finished = False
        try:
            for event in stream.opening():
                yield _sse(event)
            async for delta in generation.deltas():
                for event in stream.delta(delta):
                    yield _sse(event)
            result = await generation.result()
            for event in stream.closing(result):
                yield _sse(event)
            finished = True
            await asyncio.shield(self._settle(call, [result]))
            yield "data: [DONE]\n\n"
        except Exception as exc:  # noqa: BLE001 - the generation failed once the stream had begun: end the stream with an error event
            log.exception("generation failed mid-stream", call_id=call.id)
            error = {"message": f"the generation failed: {type(exc).__name__}", "type": "server_error", "code": "generation_failed"}
            yield f"data: {json.dumps({'error': error})}\n\n"  # as OpenAI and vLLM report an error inside a stream
            yield "data: [DONE]\n\n"
        finally:
            if not finished:
                generation.cancel()
                task = asyncio.get_running_loop().create_task(self._settle_when_done(call, generation))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    async def _settle_when_done(self, call: _Call, generation: Generation) -> None:
        try:
            result = await generation.result()
        except Exception:  # noqa: BLE001 - nothing generated is charged; the hold is released
            log.exception("stream failed", call_id=call.id)
            await self._release(call)
            return
        await self._settle(call, [result])
        log.info("stream ended early", call_id=call.id, completion_tokens=result.completion_tokens)


def _sse(event: BaseModel) -> str:
    return f"data: {event.model_dump_json(exclude_none=False)}\n\n"


def _usage(results: list[GenerationResult]) -> Usage:
    prompt = sum(r.prompt_tokens for r in results)
    completion = sum(r.completion_tokens for r in results)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(r.cached_prompt_tokens for r in results)))


# ---------------------------------------------------------------------- chat: request and answer


def _tool_mode(req: ChatCompletionRequest) -> str | None:
    """``None`` without tools; else ``none``, ``auto``, ``required`` or ``named``."""
    if not req.tools:
        return None
    if isinstance(req.tool_choice, NamedToolChoice):
        return "named"
    return req.tool_choice or "auto"


def _chat_request(req: ChatCompletionRequest) -> GenerationRequest:
    """The engine request of a chat completion: ``max_tokens`` is set later (to the context's end if omitted)."""
    tools = req.tool_dicts()
    mode = _tool_mode(req)
    schema: dict[str, Any] | None = None
    if mode == "required":
        schema = tool_call_schema(tools or [])
        if req.parallel_tool_calls is False:
            schema["maxItems"] = 1
    elif mode == "named":
        assert isinstance(req.tool_choice, NamedToolChoice)
        schema = tool_call_schema(tools or [], req.tool_choice.function.name)
    elif req.response_format is not None and req.response_format.type == "json_object":
        schema = {"type": "object"}
    elif req.response_format is not None and req.response_format.type == "json_schema":
        schema = req.response_format.json_schema.schema_
    top = req.top_logprobs or 0
    return GenerationRequest(
        messages=[m.as_dict() for m in req.messages], tools=tools, max_tokens=req.completion_limit(), n=req.n, temperature=req.temperature,
        top_p=req.top_p, seed=req.seed, stop=req.stop_list(), logprobs=top if req.logprobs else None, json_schema=schema,
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty, logit_bias=req.bias_by_id(), stream=req.stream,
    )


def _limit_field(req: ChatCompletionRequest) -> str:
    return "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"


def _chat_refusal(req: ChatCompletionRequest) -> Callable[[Feature], str]:
    def name(feature: Feature) -> str:
        if feature is Feature.guided_json and _tool_mode(req) in ("required", "named"):
            return "tool_choice"
        if feature is Feature.penalties and not req.frequency_penalty:
            return "presence_penalty"
        return _FEATURE_FIELDS[feature]
    return name


def _token_logprob(entry: TokenLogprob) -> ChatTokenLogprob:
    return ChatTokenLogprob(token=entry.token, logprob=entry.logprob, bytes=entry.bytes,
                            top_logprobs=[TopLogprob(token=t, logprob=lp, bytes=b) for t, lp, b in entry.top])


def _calls(req: ChatCompletionRequest, text: str) -> tuple[str | None, list[MessageToolCall]]:
    """Content and tool calls of a finished answer under the request's ``tool_choice``."""
    mode = _tool_mode(req)
    tools = req.tool_dicts() or []
    if mode in (None, "none"):
        return text, []
    if mode == "named":
        assert isinstance(req.tool_choice, NamedToolChoice)
        try:
            arguments = json.loads(text)
        except ValueError:
            return text, []  # cut short by max_tokens: the text as it is
        wire = json.dumps(arguments, ensure_ascii=False)
        return None, [MessageToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=ToolCallFunction(name=req.tool_choice.function.name, arguments=wire))]
    content, calls = parse_tool_calls(text if mode == "auto" else f"<tool_call>{text}</tool_call>", tools)
    if mode == "required" and not calls:
        return text, []
    if req.parallel_tool_calls is False:
        calls = calls[:1]
    return content, [MessageToolCall(id=c.id, function=ToolCallFunction(name=c.name, arguments=c.arguments)) for c in calls]


def _chat_choice(req: ChatCompletionRequest, index: int, choice: Any) -> ChatChoice:
    content, calls = _calls(req, choice.text)
    logprobs = ChoiceLogprobs(content=[_token_logprob(e) for e in choice.logprobs]) if choice.logprobs is not None else None
    return ChatChoice(index=index, message=AssistantMessage(content=content, tool_calls=calls or None),
                      finish_reason="tool_calls" if calls else choice.finish_reason, logprobs=logprobs)


class _ChatStream:
    """Turns engine deltas into ``chat.completion.chunk`` events. Content streams as it comes; with tools, text that
    may still become a tool call is held back until it cannot (then streamed as content) or the choice ends (then
    sent as one ``tool_calls`` delta, as parsed for the whole answer)."""

    def __init__(self, req: ChatCompletionRequest, call_id: str) -> None:
        self.req, self.id, self.created = req, call_id, int(time.time())
        self.mode = _tool_mode(req)
        self.held = {i: "" for i in range(req.n)}
        self.holding = {i: self.mode in ("auto", "required", "named") for i in range(req.n)}

    def _chunk(self, choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.req.model, choices=choices, usage=usage)

    def opening(self) -> list[ChatCompletionChunk]:
        return [self._chunk([ChunkChoice(index=i, delta=ChunkDelta(role="assistant", content="")) for i in range(self.req.n)])]

    def delta(self, delta: Delta) -> list[ChatCompletionChunk]:
        """Content as it comes (the choice's end is sent by :meth:`closing`: its calls need the whole text)."""
        i = delta.index
        logprobs = ChoiceLogprobs(content=[_token_logprob(e) for e in delta.logprobs]) if delta.logprobs else None
        text = delta.text
        if self.holding[i]:
            self.held[i] += text
            if self.mode == "auto" and not may_become_tool_call(self.held[i]):
                text, self.held[i], self.holding[i] = self.held[i], "", False
            else:
                text = ""
        if not text and logprobs is None:
            return []
        return [self._chunk([ChunkChoice(index=i, delta=ChunkDelta(content=text), logprobs=logprobs)])]

    def closing(self, result: GenerationResult) -> list[ChatCompletionChunk]:
        events = []
        for i, choice in enumerate(result.choices):
            if self.holding[i]:
                content, calls = _calls(self.req, choice.text)
                tool_deltas = [ToolCallDelta(index=k, id=c.id, type="function", function=c.function) for k, c in enumerate(calls)] or None
                events.append(self._chunk([ChunkChoice(index=i, delta=ChunkDelta(content=content, tool_calls=tool_deltas),
                                                       finish_reason="tool_calls" if calls else choice.finish_reason)]))
            else:
                events.append(self._chunk([ChunkChoice(index=i, delta=ChunkDelta(), finish_reason=choice.finish_reason)]))
        if self.req.stream_options and self.req.stream_options.include_usage:
            events.append(self._chunk([], _usage([result])))
        return events


# ---------------------------------------------------------------------- text completions: request and answer


def _completion_requests(req: CompletionRequest) -> list[GenerationRequest]:
    top = req.logprobs
    return [GenerationRequest(
        prompt=prompt, max_tokens=req.max_tokens, n=req.n, temperature=req.temperature, top_p=req.top_p, seed=req.seed, stop=req.stop_list(),
        logprobs=top, prompt_logprobs=top if req.echo and top is not None else None, presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty, logit_bias=req.bias_by_id(), stream=req.stream,
    ) for prompt in req.prompts()]


def _completion_refusal(req: CompletionRequest) -> Callable[[Feature], str]:
    def name(feature: Feature) -> str:
        if feature is Feature.penalties and not req.frequency_penalty:
            return "presence_penalty"
        return _FEATURE_FIELDS[feature]
    return name


def _completion_logprobs(entries: list[TokenLogprob | None], first_text: str = "", offset: int = 0) -> CompletionLogprobs:
    """Per entry: token, log-probability, alternatives, character offset in the choice's text (the first entry's is
    ``offset``). A missing entry (the first prompt token, which has no log-probability) shows ``first_text``."""
    out = CompletionLogprobs()
    for entry in entries:
        token = entry.token if entry else first_text
        out.tokens.append(token)
        out.token_logprobs.append(entry.logprob if entry else None)
        out.top_logprobs.append({t: lp for t, lp, _ in entry.top} if entry else None)
        out.text_offset.append(offset)
        offset += len(token)
    return out


def _completion_choice(req: CompletionRequest, index: int, result: GenerationResult, choice: Any) -> CompletionChoice:
    prefix = ""
    logprobs = None
    if req.echo:
        prompt = req.prompts()[index // req.n]
        prefix = prompt if isinstance(prompt, str) else (result.prompt_text or "")
    if req.logprobs is not None:
        entries: list[TokenLogprob | None] = []
        if req.echo:
            entries.extend(result.prompt_logprobs or [])
        entries.extend(choice.logprobs or [])
        logprobs = _completion_logprobs(entries, _first_token_text(prefix, result) if req.echo else "")
    return CompletionChoice(index=index, text=prefix + choice.text, logprobs=logprobs, finish_reason=choice.finish_reason)


def _first_token_text(prefix: str, result: GenerationResult) -> str:
    """The echoed prompt's first token's text: what the other prompt tokens' texts leave of ``prefix``."""
    rest = "".join(e.token for e in (result.prompt_logprobs or [])[1:] if e)
    return prefix[: max(0, len(prefix) - len(rest))]


class _CompletionStream:
    """Turns engine deltas into streamed ``text_completion`` events (one prompt)."""

    def __init__(self, req: CompletionRequest, call_id: str) -> None:
        self.req, self.id, self.created = req, call_id, int(time.time())
        self.offsets = [0] * req.n  # characters of each choice's text sent so far (``text_offset`` counts from its start)

    def _event(self, choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.req.model, choices=choices, usage=usage)

    def opening(self) -> list[Completion]:
        return []  # echo is not streamed (refused when the request is read)

    def delta(self, delta: Delta) -> list[Completion]:
        logprobs = _completion_logprobs(list(delta.logprobs), offset=self.offsets[delta.index]) if delta.logprobs else None
        self.offsets[delta.index] += len(delta.text)
        return [self._event([CompletionChoice(index=delta.index, text=delta.text, logprobs=logprobs, finish_reason=delta.finish_reason)])]

    def closing(self, result: GenerationResult) -> list[Completion]:
        if self.req.stream_options and self.req.stream_options.include_usage:
            return [self._event([], _usage([result]))]
        return []

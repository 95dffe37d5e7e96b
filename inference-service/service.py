"""The inference service object: the base models it serves (their engines and cards; a model name resolved to its base
model and checkpoint) and how one call runs on them, from admission to settlement.

A call is admitted (:mod:`.admission`: the engine serves what it asks, it fits the context), its worst case held
(:mod:`.metering`: unless an evaluation's hold pays for it, or it is unmetered), generated on the engine, answered
(:mod:`.responses`: the whole answer, or server-sent events) and settled for exactly the tokens the engine reports,
then logged (:mod:`.repository`). A call that generates nothing (refused by the engine, failed) releases its hold; a
stream whose client goes away stops the generation, which is settled in the background for the tokens it generated.
OpenAI requests become engine requests in :mod:`.engine_requests`; the engines are behind
:mod:`inference_service.engines.base`.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

import structlog
from inference_service import repository, responses
from inference_service.admission import check_features, check_schemas, context_window, fit_context, prompt_ids
from inference_service.engine_requests import Refusal, chat_limit_field, chat_refusal, chat_request, completion_refusal, completion_requests
from inference_service.engines import load_engine, load_engines
from inference_service.engines.base import Adapter, Engine, Feature, Generation, GenerationRequest, GenerationResult
from inference_service.metering import Metering, Payment
from inference_service.prices import register_prices
from inference_service.responses import DONE, ChatStream, CompletionStream, error_event, sse
from inference_service.schemas import ModelDetail, PromptTokens
from inference_service.settings import InferenceSettings
from trainer_service.client import TrainerClient

from services.common import artifacts
from services.common.auth import RunContext
from services.common.db import Database
from services.common.errors import NotFound, Unprocessable, UpstreamProblem
from services.common.ids import has_prefix
from services.common.llms import ModelCard, UnknownBaseModel, model_card, prepare_model, registry
from services.common.openai_protocol import ChatCompletion, ChatCompletionRequest, Completion, CompletionRequest, ModelOut
from services.ledger.client import LedgerClient

log = structlog.get_logger("inference")


@dataclass(frozen=True)
class ResolvedModel:
    """A model name as served: its base model and, for a checkpoint, the checkpoint (``adapter``: a LoRA adapter on
    the base, or full weights of it, by the trainer's record's ``kind``)."""

    base: str
    adapter: Adapter | None

    def needs(self) -> set[Feature]:
        """The optional engine features serving this model takes (a full-weight checkpoint: ``full_weights``)."""
        return self.adapter.needs() if self.adapter is not None else set()


@dataclass
class _Call:
    """One admitted call: resolved, checked, held; ``generations`` run on ``engine`` and are settled together."""

    id: str
    ctx: RunContext | None
    model: str
    resolved: ResolvedModel
    engine: Engine
    requests: list[GenerationRequest]  # rendered: token ids, ``max_tokens`` set
    payment: Payment
    field: str  # the wire field of the prompt (``messages`` or ``prompt``)
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
        """Load one engine of ``settings.engine``'s kind per base model prepared under ``settings.models_dir``. First the
        transformers names the request threads use later are resolved here, in one thread: transformers' lazily
        imported names raise ``ImportError`` when two threads resolve them at once."""
        from transformers import (  # noqa: F401
            AutoConfig,
            AutoModelForCausalLM,
            AutoTokenizer,
            GenerationConfig,
            LogitsProcessorList,
            StoppingCriteriaList,
        )

        self.cards.update(registry(self.settings.models_dir))
        self.engines.update(load_engines(self.settings))

    def register_model(self, card: ModelCard) -> ModelCard:
        """Prepare ``card`` into ``settings.models_dir`` (once) and serve it from now on, without a restart: one engine
        of ``settings.engine``'s kind is loaded for it unless it is served already (a card differing only in metadata
        replaces the served one's); the card's prices go on the ledger's table first. Blocking (minutes for a large GGUF):
        call it in a thread. Raises what :func:`services.common.llms.prepare_model` raises, and the ledger's errors."""
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

    # ------------------------------------------------------------------ chat and text completions

    async def chat_completion(self, ctx: RunContext | None, req: ChatCompletionRequest, metering: Metering) -> ChatCompletion:
        """Serve one OpenAI chat completion for ``ctx``'s run (not streamed).

        Raises ``Unprocessable`` (the model; a feature the engine lacks, naming its field; a metered call without a
        run), ``ContextExceeded`` (messages), and passes the ledger's 402 through before anything is generated.
        """
        call = await self._admit(ctx, req.model, [chat_request(req)], metering, field="messages", refused=chat_refusal(req),
                                 limit_field=chat_limit_field(req))
        (result,) = await self._run(call)
        return responses.chat_completion(req, call.id, result, metering.billed_prompt_tokens)

    async def chat_completion_stream(self, ctx: RunContext | None, req: ChatCompletionRequest, metering: Metering) -> AsyncIterator[str]:
        """Admit a streamed chat completion (errors as :meth:`chat_completion`, raised here, before any event) and
        return its server-sent events: ``data: <chat.completion.chunk>`` lines, then ``data: [DONE]``."""
        call = await self._admit(ctx, req.model, [chat_request(req)], metering, field="messages", refused=chat_refusal(req),
                                 limit_field=chat_limit_field(req))
        return self._events(call, ChatStream(req, call.id, metering.billed_prompt_tokens))

    async def completion(self, ctx: RunContext | None, req: CompletionRequest, metering: Metering) -> Completion:
        """Serve one OpenAI text completion (``/v1/completions``; not streamed); errors as :meth:`chat_completion`,
        ``ContextExceeded`` naming ``prompt``."""
        call = await self._admit(ctx, req.model, completion_requests(req), metering, field="prompt", refused=completion_refusal(req))
        return responses.completion(req, call.id, await self._run(call))

    async def completion_stream(self, ctx: RunContext | None, req: CompletionRequest, metering: Metering) -> AsyncIterator[str]:
        """Admit a streamed text completion and return its server-sent events (one prompt per streamed request)."""
        if len(req.prompts()) > 1:
            raise Unprocessable("a streamed completion takes one prompt", field="prompt")
        call = await self._admit(ctx, req.model, completion_requests(req), metering, field="prompt", refused=completion_refusal(req))
        return self._events(call, CompletionStream(req, call.id))

    async def chat_prompt_tokens(self, ctx: RunContext | None, reqs: list[ChatCompletionRequest], metering: Metering) -> PromptTokens:
        """Each chat request's prompt tokens as its model renders it, and the context it would run in (``metering``'s
        context cap applies); nothing is generated or charged. ``Unprocessable`` as :meth:`chat_completion` admits."""
        counts, contexts = [], []
        for req in reqs:
            resolved = await asyncio.to_thread(self.resolve_model, ctx, req.model)
            engine = self.engines[resolved.base]
            (ids,) = await prompt_ids(engine, [chat_request(req)], "messages")
            counts.append(len(ids))
            contexts.append(context_window(engine, self.cards.get(resolved.base), metering.context_tokens))
        return PromptTokens(prompt_tokens=counts, context_tokens=contexts)

    # ------------------------------------------------------------------ admission, generation, settlement

    async def _admit(self, ctx: RunContext | None, model: str, requests: list[GenerationRequest], metering: Metering, *, field: str,
                     refused: Refusal, limit_field: str = "max_tokens") -> _Call:
        """Resolve the model, check the engine serves the requests, fit them in the context, hold the worst case."""
        resolved = await asyncio.to_thread(self.resolve_model, ctx, model)
        engine = self.engines[resolved.base]
        check_features(engine, self.settings.engine, model, resolved.needs(), requests, refused)
        await check_schemas(engine, requests, refused)
        prompts = await prompt_ids(engine, requests, field)
        context = context_window(engine, self.cards.get(resolved.base), metering.context_tokens)
        requests = fit_context(requests, prompts, context, field=field, limit_field=limit_field)
        call_id = f"{'chatcmpl' if field == 'messages' else 'cmpl'}-{uuid.uuid4().hex}"
        priced = (await asyncio.to_thread(self.resolve_model, ctx, metering.billed_model)).base if metering.billed_model else resolved.base
        payment = Payment(self.ledger, call_id, priced, metering)
        await payment.hold(ctx, metering.billed(sum(len(p) for p in prompts), 0)[0], sum(r.n * (r.max_tokens or 0) for r in requests))
        return _Call(id=call_id, ctx=ctx, model=model, resolved=resolved, engine=engine, requests=requests, payment=payment, field=field)

    async def _start(self, call: _Call) -> list[Generation]:
        """Submit the call's requests; if one is refused, cancel the rest and release the hold. ``Unprocessable`` for
        a request the engine refuses, naming the prompt's field (JSON schemas were checked when it was admitted)."""
        try:
            for request in call.requests:
                call.generations.append(await call.engine.submit(request, call.resolved.adapter))
        except BaseException as exc:
            for generation in call.generations:
                generation.cancel()
            await call.payment.release()
            if isinstance(exc, ValueError):
                raise Unprocessable(str(exc), field=call.field) from exc
            raise
        return call.generations

    async def _run(self, call: _Call) -> list[GenerationResult]:
        """Generate the whole answer and settle it; if a generation fails (or the caller goes away), stop them all
        and release the hold."""
        generations = await self._start(call)
        try:
            results = list(await asyncio.gather(*(g.result() for g in generations)))
        except BaseException:
            for generation in generations:
                generation.cancel()
            await call.payment.release()
            raise
        await self._settle(call, results)
        return results

    async def _settle(self, call: _Call, results: list[GenerationResult]) -> None:
        """Charge the tokens the engine reports (:meth:`~inference_service.metering.Payment.settle`), and log the call."""
        prompt, cached = call.payment.metering.billed(sum(r.prompt_tokens for r in results), sum(r.cached_prompt_tokens for r in results))
        completion_tokens = sum(r.completion_tokens for r in results)
        await call.payment.settle(prompt, completion_tokens, cached)
        latency_ms = int((time.perf_counter() - call.started) * 1000)
        await asyncio.to_thread(repository.log_completion, self.db, call_id=call.id, run_id=call.ctx.run_id if call.ctx else None,
                                model=call.model, prompt_tokens=prompt, completion_tokens=completion_tokens, metered=call.payment.metering.metered,
                                hold_id=call.payment.hold_id, latency_ms=latency_ms)

    async def _events(self, call: _Call, stream: ChatStream | CompletionStream) -> AsyncIterator[str]:
        """Server-sent events of a streamed call. If the client goes away (the iterator is closed or cancelled), the
        generation is stopped and settled in the background for exactly the tokens it generated."""
        (generation,) = await self._start(call)
        finished = False
        try:
            for event in stream.opening():
                yield sse(event)
            async for delta in generation.deltas():
                for event in stream.delta(delta):
                    yield sse(event)
            result = await generation.result()
            for event in stream.closing(result):
                yield sse(event)
            finished = True
            await asyncio.shield(self._settle(call, [result]))
            yield DONE
        except Exception as exc:  # noqa: BLE001 - the generation failed once the stream had begun: end the stream with an error event
            log.exception("generation failed mid-stream", call_id=call.id)
            yield error_event(exc)
            yield DONE
        finally:
            if not finished:
                generation.cancel()
                self._in_background(self._settle_when_done(call, generation))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` past the request that started it (:meth:`aclose` waits for it)."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _settle_when_done(self, call: _Call, generation: Generation) -> None:
        """Settle a stream that ended early once its generation stops (release the hold if it failed)."""
        try:
            result = await generation.result()
        except Exception:  # noqa: BLE001 - nothing generated is charged; the hold is released
            log.exception("stream failed", call_id=call.id)
            await call.payment.release()
            return
        await self._settle(call, [result])
        log.info("stream ended early", call_id=call.id, completion_tokens=result.completion_tokens)

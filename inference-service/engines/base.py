"""The engine seam: what the inference service asks of an engine, whatever runs the model.

An engine serves one base model and its checkpoints: LoRA adapters on it, and (with :attr:`Feature.full_weights`) full-weight
checkpoints of it, each served as its own model. The service turns an OpenAI request into a
:class:`GenerationRequest`, checks it against the engine's :attr:`Engine.features` (a request needing a feature
the engine lacks is a 422 naming the wire field), meters it, and calls :meth:`Engine.submit`, which answers with a
:class:`Generation`: text deltas as they are produced (for ``stream``), the final :class:`GenerationResult`, and a
way to stop early (a client that went away). Metering reads token counts from the result alone, so it is exact
whatever the engine, streamed or not, finished or cancelled.

Engines: ``transformers`` (:mod:`inference_service.engines.transformers`), ``vllm`` (in-process,
:mod:`inference_service.engines.vllm`), ``upstream`` (an OpenAI-compatible server such as ``vllm serve``,
:mod:`inference_service.engines.upstream`).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol


class Feature(enum.StrEnum):
    """Optional parts of the protocol an engine may serve; the service refuses requests needing one it lacks."""

    logprobs = "logprobs"  # per generated token: its log-probability and the top alternatives
    prompt_logprobs = "prompt_logprobs"  # per prompt token (``/v1/completions`` with ``echo`` and ``logprobs``)
    guided_json = "guided_json"  # output constrained to a JSON schema (``response_format``, forced tool calls)
    penalties = "penalties"  # presence and frequency penalties, OpenAI's definition
    logit_bias = "logit_bias"  # additive bias per token id
    seed = "seed"  # reproducible sampling
    full_weights = "full_weights"  # serve a full-weight checkpoint of a base model (``Adapter.kind == "full"``)


class SchemaNotServed(ValueError):
    """Raised by :meth:`Engine.check_schema` for a JSON schema the engine cannot decode under (an unresolvable
    ``$ref``, an unsatisfiable range, a pattern its grammar engine does not take); a 422 on the field the schema
    came from."""


@dataclass(frozen=True)
class Adapter:
    """A checkpoint of the base model to serve: ``name`` (the checkpoint id; always the same weights), its local
    folder, and its ``kind``.

    ``lora``: a PEFT LoRA adapter applied on the base model (the folder holds ``adapter_config.json`` and its weights).
    ``full``: full weights of the base model's architecture, as transformers' ``save_pretrained`` writes them
    (``config.json``, ``model.safetensors`` or its shards with ``model.safetensors.index.json``; other files, such as
    the trainer's ``training_state.pt`` or a ``generation_config.json``, are not read). It is served as a model of its
    own, with the base model's tokenizer, chat template, end-of-turn tokens and context window; only engines with
    :attr:`Feature.full_weights` serve one."""

    name: str
    path: Path
    kind: Literal["lora", "full"] = "lora"

    def needs(self) -> set[Feature]:
        """The optional features serving this checkpoint takes."""
        return {Feature.full_weights} if self.kind == "full" else set()


@dataclass
class GenerationRequest:
    """One generation, engine-neutral.

    The prompt is either chat ``messages`` (``{"role", "content", …}`` dicts, rendered by the model's chat template
    with ``tools``, OpenAI tool objects) or a raw ``prompt`` (text, or token ids), for ``/v1/completions``.

    ``max_tokens``: cap on new tokens per choice; ``None`` runs to the end of the context. ``n`` choices are drawn
    independently. ``temperature == 0`` is greedy (``top_p`` and ``seed`` then do nothing). ``stop`` strings end a
    choice before their first occurrence. ``logprobs``: ``None`` for none, ``k >= 0`` for each new token's
    log-probability and its ``k`` most likely alternatives; ``prompt_logprobs`` the same for prompt tokens.
    ``json_schema``: constrain the output to this JSON schema (``{}`` is any JSON value; ``{"type": "object"}`` any
    object). ``presence_penalty``/``frequency_penalty`` as OpenAI defines them (subtracted from the logits of tokens
    already generated: once, and once per occurrence); ``logit_bias`` added to the logits of those token ids.
    Log-probabilities are the model's own (before penalties, bias, temperature and top-p). ``stream``: produce
    :class:`Delta` objects as tokens come (otherwise only the result).
    """

    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    max_tokens: int | None = None
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    json_schema: dict[str, Any] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    stream: bool = False

    def needs(self) -> set[Feature]:
        """The optional features this request uses."""
        needed = set()
        if self.logprobs is not None:
            needed.add(Feature.logprobs)
        if self.prompt_logprobs is not None:
            needed.add(Feature.prompt_logprobs)
        if self.json_schema is not None:
            needed.add(Feature.guided_json)
        if self.presence_penalty or self.frequency_penalty:
            needed.add(Feature.penalties)
        if self.logit_bias:
            needed.add(Feature.logit_bias)
        if self.seed is not None and self.temperature > 0:
            needed.add(Feature.seed)
        return needed


@dataclass
class TokenLogprob:
    """One token's log-probability (natural log) and the ``top`` most likely tokens at its position
    (``(token, logprob)`` pairs, most likely first). ``token`` is the token's text; ``bytes`` its UTF-8 bytes
    (a token may hold part of a character)."""

    token: str
    logprob: float
    bytes: list[int]
    top: list[tuple[str, float, list[int]]] = field(default_factory=list)


@dataclass
class Choice:
    """One of a request's ``n`` answers. ``completion_tokens`` counts the tokens generated for it (the end-of-turn
    token included, up to the token that completed a stop string); ``finish_reason`` is ``stop`` (end of turn, a
    stop string, the end of a JSON schema), ``length`` (``max_tokens`` or the context's end) or, when the engine was
    stopped early, ``stop``. ``logprobs``: one per generated token whose text is in ``text`` (the end-of-turn token has
    none, as in OpenAI's answers), if asked."""

    text: str
    completion_tokens: int
    finish_reason: Literal["stop", "length"]
    logprobs: list[TokenLogprob] | None = None


@dataclass
class GenerationResult:
    """The answer to one :class:`GenerationRequest`: its ``choices`` (``n``, in order), the prompt's token count
    (counted once, whatever ``n``), how many of them an engine with a prefix cache served from it (charged at the
    cached price), and, if asked, the prompt's text and per-token log-probabilities (the first token has none)."""

    choices: list[Choice]
    prompt_tokens: int
    cached_prompt_tokens: int = 0
    prompt_text: str | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @property
    def completion_tokens(self) -> int:
        """Tokens generated over all choices (what OpenAI's ``usage.completion_tokens`` reports)."""
        return sum(c.completion_tokens for c in self.choices)


@dataclass
class Delta:
    """New output of choice ``index``: ``text`` and its tokens' ``logprobs`` (if asked); the last delta of a choice
    carries its ``finish_reason``."""

    index: int
    text: str
    logprobs: list[TokenLogprob] | None = None
    finish_reason: Literal["stop", "length"] | None = None


class Generation:
    """A generation in progress: iterate :meth:`deltas` to stream it, await :meth:`result` for the whole answer,
    :meth:`cancel` to stop it early (the result then holds what was generated up to that point).

    Engines feed it from any thread through :meth:`push` and :meth:`finish`/:meth:`fail` (thread-safe: they hop
    onto the event loop the generation was created on).
    """

    def __init__(self, on_cancel: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._deltas: asyncio.Queue[Delta | None] = asyncio.Queue()
        self._result: asyncio.Future[GenerationResult] = self._loop.create_future()
        self._on_cancel = on_cancel
        self.cancelled = False

    def _soon(self, callback: Any, *args: Any) -> None:
        if not self._loop.is_closed():  # nobody is waiting on a closed loop
            self._loop.call_soon_threadsafe(callback, *args)

    def push(self, delta: Delta) -> None:
        self._soon(self._deltas.put_nowait, delta)

    def finish(self, result: GenerationResult) -> None:
        def done() -> None:
            self._deltas.put_nowait(None)
            if not self._result.done():
                self._result.set_result(result)

        self._soon(done)

    def fail(self, error: BaseException) -> None:
        def done() -> None:
            self._deltas.put_nowait(None)
            if not self._result.done():
                self._result.set_exception(error)

        self._soon(done)

    def cancel(self) -> None:
        """Stop generating: the engine ends every choice at its next token (idempotent)."""
        if not self.cancelled:
            self.cancelled = True
            if self._on_cancel is not None:
                self._on_cancel()

    async def deltas(self) -> AsyncIterator[Delta]:
        """The deltas in order, until the generation ends (then await :meth:`result`)."""
        while (delta := await self._deltas.get()) is not None:
            yield delta

    async def result(self) -> GenerationResult:
        """The whole answer; raises what the engine raised."""
        return await asyncio.shield(self._result)


class Engine(Protocol):
    """One base model served, with its checkpoints (hot-loaded on first use, least recently used unloaded): LoRA
    adapters, and full-weight ones if :attr:`features` has :attr:`Feature.full_weights`."""

    features: frozenset[Feature]

    @property
    def context_tokens(self) -> int:
        """The model's context window in tokens (prompt + completion)."""

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """Token ids of the request's prompt once rendered (chat template, tools), the same for every engine
        (:meth:`~inference_service.chat.ChatRenderer.prompt_ids`). Raises ``ValueError`` for a token id outside the
        vocabulary. Callable while generating. The service renders each prompt once, here, and submits its token ids."""

    def check_schema(self, schema: dict[str, Any]) -> None:
        """Raise :class:`SchemaNotServed` if this engine cannot decode under the JSON ``schema``. Called when a
        request is admitted, before its hold and before a stream begins; an engine that can only tell at
        :meth:`submit` does nothing here."""

    async def submit(self, request: GenerationRequest, adapter: Adapter | None = None) -> Generation:
        """Start generating ``request`` on the base model or the checkpoint ``adapter``. Raises ``ValueError`` for a
        request the model cannot serve (e.g. a raw token id outside the vocabulary), or for a full-weight checkpoint on
        an engine without :attr:`Feature.full_weights` (the service refuses those before)."""

    async def aclose(self) -> None:
        """Stop: cancel what is pending and release the model."""

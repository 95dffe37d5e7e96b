"""The transformers engine: batched generation on the base model, a LoRA adapter or a full-weight checkpoint, with every
feature of the seam.

:class:`TransformersEngine` holds one float32 copy of the base model, up to ``max_loaded_adapters`` PEFT LoRA
adapters on it, and up to ``max_loaded_full_checkpoints`` full-weight checkpoints, each a float32 model object of its
own (least recently used unloaded first, and its memory freed; a new checkpoint is loaded on first use, no restart).
A full checkpoint shares everything but its weights with the base: tokenizer, chat template, end-of-turn tokens,
context window and generation defaults (its own ``generation_config.json`` is not read: decoding is the request's).
Concurrent requests are micro-batched: the first waiting request opens a window that stays open while requests keep
arriving (each within ``max_wait_ms`` of the last, up to ``max_window_ms`` in all and ``max_batch_size`` rows; a
request with ``n`` choices is ``n`` rows), the batch is split by model (the base, each adapter, each full
checkpoint: requests for different models never share a ``generate`` call) and seed, and each part runs as one
``model.generate`` call on one worker thread, the same code whichever model it runs on. The base model runs with every
adapter disabled, so its output never depends on which adapters or checkpoints were used before. A request that
cannot be prepared (a JSON schema xgrammar refuses) fails alone; a checkpoint that cannot be loaded fails the requests
for it alone.

Per-row control inside one ``generate`` call (:class:`_Rows`): a logits processor reads each row's raw
log-probabilities (``logprobs``), then applies its penalties, ``logit_bias``, JSON-schema mask (xgrammar, the
grammar engine vLLM uses), temperature and top-p; a streamer takes each new token, detokenizes incrementally,
finds stop strings and pushes deltas; a stopping criterion ends rows that are done or cancelled.

Greedy decoding (``temperature == 0``) is deterministic for a given batch; float rounding differs slightly between
batch shapes, so in rare near-ties the same prompt may decode differently in a different batch. Sampling with a
``seed`` is reproducible for the same batch (seeded requests are batched only with requests of the same seed).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import json
import logging
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from inference_service.chat import ChatRenderer, end_of_turn_ids
from inference_service.engines import register_engine
from inference_service.engines.base import (
    Adapter,
    Choice,
    Delta,
    Feature,
    Generation,
    GenerationRequest,
    GenerationResult,
    SchemaNotServed,
    TokenLogprob,
)
from transformers import LogitsProcessor, StoppingCriteria

from services.common.llms import cpu_threads

if TYPE_CHECKING:
    from inference_service.settings import InferenceSettings

logger = logging.getLogger(__name__)


class _Detokenizer:
    """Incremental detokenization of one row (the prefix/read-offset window TGI and vLLM use): each new token
    decodes a few tokens, not the whole row, and a token holding part of a character waits for the rest."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.prefix = self.read = 0

    def add(self, token: int) -> str:
        """Append ``token``; return the text it completes (may be empty)."""
        self.tokens.append(token)
        before = self.tokenizer.decode(self.tokens[self.prefix : self.read], skip_special_tokens=True)
        after = self.tokenizer.decode(self.tokens[self.prefix :], skip_special_tokens=True)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.tokens)
            return after[len(before) :]
        return ""


@dataclass
class _Row:
    """One choice being generated: its request, its place in the answer, and what it produced so far."""

    request: GenerationRequest
    generation: Generation
    index: int
    prompt: list[int]
    limit: int
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    sent: int = 0  # characters of ``text`` already pushed as deltas
    logprobs: list[TokenLogprob] = field(default_factory=list)
    unsent_logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: Literal["stop", "length"] | None = None
    finish_sent: bool = False
    detok: _Detokenizer | None = None
    matcher: Any = None
    counts: torch.Tensor | None = None  # occurrences of each token id so far (penalties)
    step_logprobs: torch.Tensor | None = None  # this step's raw log-probabilities (logprobs)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


@dataclass
class _Pending:
    request: GenerationRequest
    adapter: Adapter | None
    generation: Generation
    prompt: list[int]


class TransformersEngine:
    """The model in ``model_dir`` (a prepared Hugging Face folder) and its checkpoints (LoRA adapters and full weights),
    served by transformers.

    Loads the model once in float32 and computes on :func:`~services.common.llms.cpu_threads` threads (every CPU the
    process may run on, unless ``OMP_NUM_THREADS`` caps them).
    """

    features = frozenset(Feature)  # every one, full_weights included

    def __init__(self, model_dir: Path, *, max_batch_size: int = 32, max_loaded_adapters: int = 8, max_loaded_full_checkpoints: int = 2,
                 max_wait_ms: float = 50, max_window_ms: float = 500) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if max_batch_size < 1 or max_loaded_adapters < 1 or max_loaded_full_checkpoints < 1:
            raise ValueError("max_batch_size, max_loaded_adapters and max_loaded_full_checkpoints must be at least 1")
        self.max_batch_size = max_batch_size
        self.max_loaded_adapters = max_loaded_adapters
        self.max_loaded_full_checkpoints = max_loaded_full_checkpoints
        self._max_wait_s = max_wait_ms / 1000
        self._max_window_s = max_window_ms / 1000
        torch.set_num_threads(cpu_threads())
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.renderer = ChatRenderer(self.tokenizer)
        self._model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self._vocab = int(self._model.config.vocab_size)
        self._eos: set[int] = set(end_of_turn_ids(model_dir, self.tokenizer))
        self._pad: int = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self._generation_config = copy.deepcopy(self._model.generation_config)  # the base's defaults, for its full checkpoints too
        self._adapters: OrderedDict[str, str] = OrderedDict()
        self._adapter_serial = 0
        self._full: OrderedDict[str, Any] = OrderedDict()  # loaded full checkpoints (name -> model), least recently used first
        self._lock = threading.Lock()
        self._grammar_compiler: Any = None
        self._grammar_lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._in_flight: list[_Pending] = []

    # ------------------------------------------------------------------ prompts

    @property
    def context_tokens(self) -> int:
        """The model's context window in tokens (prompt + completion)."""
        return int(self._model.config.max_position_embeddings)

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """Token ids of the request's prompt (:meth:`~inference_service.chat.ChatRenderer.prompt_ids`); callable while generating."""
        return self.renderer.prompt_ids(request, self._vocab)

    # ------------------------------------------------------------------ the micro-batcher

    async def submit(self, request: GenerationRequest, adapter: Adapter | None = None) -> Generation:
        """Queue ``request`` for the next batch on the base model or the checkpoint ``adapter`` (LoRA or full);
        returns its :class:`Generation`."""
        prompt = await asyncio.to_thread(self.prompt_ids, request)
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.get_loop() is not loop or self._worker.done():
            # the batcher lives on the loop of its callers (a new loop, e.g. a new asyncio.run, gets a new batcher)
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._run(), name="transformers-engine")
        assert self._queue is not None
        generation = Generation()
        self._queue.put_nowait(_Pending(request, adapter, generation, prompt))
        return generation

    async def _collect(self) -> list[_Pending]:
        """Wait for one request, then gather more while they keep coming: the window closes when none arrived for
        ``max_wait_ms``, when ``max_batch_size`` rows are waiting, or ``max_window_ms`` after the first request.

        Requests of one client rarely arrive at once (each is rendered and admitted on its own; an evaluation's calls
        open their connections one by one), and a batch cut short makes the rest wait for a whole second ``generate``
        call: a fixed 15 ms window split 64 requests sent together into batches of 32 + 32, and an evaluation's 64
        calls into 5 + 32 + 27 (a fifth slower than 32 + 32). Waiting is cheap next to a batch (a decode step of 32
        rows of the 135M model takes about 0.4 s on 2 cores)."""
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        batch = [await self._queue.get()]
        closes = loop.time() + self._max_window_s
        while sum(p.request.n for p in batch) < self.max_batch_size:
            remaining = min(self._max_wait_s, closes - loop.time())
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = self._in_flight = await self._collect()
            groups: dict[tuple[tuple[str, str] | None, int | None], list[_Pending]] = defaultdict(list)
            for pending in batch:  # one group per model (base, adapter or full checkpoint) and seed
                seeded = pending.request.seed if pending.request.temperature > 0 else None
                model = (pending.adapter.kind, pending.adapter.name) if pending.adapter else None
                groups[(model, seeded)].append(pending)
            for group in groups.values():
                live = [p for p in group if not p.generation.cancelled]
                if live:
                    await loop.run_in_executor(self._executor, self._generate, live)

    async def aclose(self) -> None:
        """Stop batching: cancel the requests not answered yet and release the worker thread."""
        if self._worker is not None and self._worker.get_loop() is asyncio.get_running_loop():
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        self._worker = None
        pending = list(self._in_flight)
        if self._queue is not None:
            while not self._queue.empty():
                pending.append(self._queue.get_nowait())
        for p in pending:
            p.generation.fail(RuntimeError("the engine is shutting down"))
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ generation (worker thread)

    def _generate(self, group: list[_Pending]) -> None:
        """Answer ``group`` (one model: the base, an adapter or a full checkpoint; one seed) in runs of at most
        ``max_batch_size`` rows; every request's generation is finished or failed."""
        try:
            with self._lock, self._serving(group[0].adapter) as model:
                rows = []
                for p in list(group):
                    try:
                        rows.extend(self._rows(p))
                    except Exception as error:  # noqa: BLE001 - this request fails alone; the rest of the batch runs
                        logger.exception("a request of the batch could not be prepared")
                        p.generation.fail(error)
                        group.remove(p)
                for start in range(0, len(rows), self.max_batch_size):
                    self._generate_batch(model, rows[start : start + self.max_batch_size])
                prompt_logprobs = {id(p): self._prompt_logprobs(model, p.prompt, p.request.prompt_logprobs)
                                   for p in group if p.request.prompt_logprobs is not None}
        except Exception as error:  # noqa: BLE001 - the error belongs to this group's callers
            logger.exception("generation failed for a group of %d requests", len(group))
            for p in group:
                p.generation.fail(error)
            return
        by_generation: dict[int, list[_Row]] = defaultdict(list)
        for row in rows:
            by_generation[id(row.generation)].append(row)
        for p in group:
            choices = [self._choice(row) for row in by_generation[id(p.generation)]]
            with_prompt = p.request.prompt_logprobs is not None
            p.generation.finish(GenerationResult(
                choices=choices, prompt_tokens=len(p.prompt),
                prompt_text=self.tokenizer.decode(p.prompt) if with_prompt else None,
                prompt_logprobs=prompt_logprobs.get(id(p)),
            ))

    def _rows(self, pending: _Pending) -> list[_Row]:
        request = pending.request
        room = self.context_tokens - len(pending.prompt)
        limit = room if request.max_tokens is None else min(request.max_tokens, room)
        rows = []
        for index in range(request.n):
            row = _Row(request, pending.generation, index, pending.prompt, max(limit, 0))
            if request.stream or request.stop or request.json_schema is not None:
                row.detok = _Detokenizer(self.tokenizer)
            if request.json_schema is not None:
                row.matcher = self._matcher(json.dumps(request.json_schema))
            if request.presence_penalty or request.frequency_penalty:
                row.counts = torch.zeros(self._vocab)
            rows.append(row)
        return rows

    def _grammar(self, schema: str) -> Any:
        """The compiled xgrammar grammar of a JSON schema (``{}``: any JSON value), cached by the compiler;
        :class:`SchemaNotServed` if xgrammar cannot compile it."""
        import xgrammar

        with self._grammar_lock:
            if self._grammar_compiler is None:
                info = xgrammar.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self._vocab, stop_token_ids=sorted(self._eos))
                self._grammar_compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        try:
            return self._grammar_compiler.compile_json_schema(schema, any_whitespace=False)
        except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError (and others) for schemas it cannot decode under
            raise SchemaNotServed(f"the JSON schema cannot be decoded under: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc

    def check_schema(self, schema: dict[str, Any]) -> None:
        """:class:`SchemaNotServed` unless xgrammar compiles ``schema`` (the grammar is cached for the request's rows)."""
        self._grammar(json.dumps(schema))

    def _matcher(self, schema: str) -> Any:
        """A fresh xgrammar matcher for a JSON schema."""
        import xgrammar

        return xgrammar.GrammarMatcher(self._grammar(schema))

    def _generate_batch(self, model: Any, rows: list[_Row]) -> None:
        """One ``model.generate`` call over ``rows`` (left-padded ``[batch, longest_prompt]``), controlled per row;
        ``model`` is what :meth:`_serving` gave."""
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        live = [r for r in rows if r.limit > 0]
        for row in rows:
            if row.limit <= 0:
                row.finish_reason = "length"
        if not live:
            return
        width = max(len(r.prompt) for r in live)
        input_ids = torch.full((len(live), width), self._pad, dtype=torch.long)
        attention_mask = torch.zeros((len(live), width), dtype=torch.long)
        for i, row in enumerate(live):
            input_ids[i, width - len(row.prompt) :] = torch.tensor(row.prompt)
            attention_mask[i, width - len(row.prompt) :] = 1
        control = _Rows(self, live)
        sampling = control.sampling
        seed = next((r.request.seed for r in live if r.request.temperature > 0 and r.request.seed is not None), None)
        config = GenerationConfig(
            max_new_tokens=max(r.limit for r in live), do_sample=sampling, temperature=1.0, top_p=1.0, top_k=None,
            eos_token_id=sorted(self._eos), pad_token_id=self._pad,
        )
        if seed is not None:
            torch.manual_seed(seed)
        started = time.perf_counter()
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, "generation_config": config,
                  "logits_processor": LogitsProcessorList([_Processor(control)]), "stopping_criteria": StoppingCriteriaList([_Stopping(control)]),
                  "streamer": control}
        with torch.inference_mode():
            model.generate(**kwargs)
        for row in live:
            if not row.done:
                row.finish_reason = "length"
            control._push(row)
        seconds = time.perf_counter() - started
        generated = sum(len(r.tokens) for r in live)
        logger.info("generated %d new tokens for %d rows (prompts up to %d tokens) in %.2f s: %.1f tokens/s",
                    generated, len(live), width, seconds, generated / seconds if seconds else 0.0)

    def _choice(self, row: _Row) -> Choice:
        if row.detok is None:
            row.text = self.tokenizer.decode([t for t in row.tokens if t not in self._eos], skip_special_tokens=True)
        return Choice(text=row.text, completion_tokens=len(row.tokens), finish_reason=row.finish_reason or "stop",
                      logprobs=row.logprobs if row.request.logprobs is not None else None)

    def _prompt_logprobs(self, model: Any, prompt: list[int], top: int) -> list[TokenLogprob | None]:
        """Per prompt token, its log-probability given the tokens before it (the first has none), and ``top``
        alternatives: one forward pass of ``model`` (what :meth:`_serving` gave)."""
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        return [None, *(self.token_logprob(logprobs[i - 1], prompt[i], top) for i in range(1, len(prompt)))]

    def token_logprob(self, logprobs: torch.Tensor, token: int, top: int) -> TokenLogprob:
        """``token``'s entry of a log-probability vector, with the ``top`` most likely alternatives."""
        text, raw = self.token_text(token)
        alternatives = []
        if top:
            values, ids = torch.topk(logprobs, top)
            alternatives = [(*self.token_text(int(i)), float(v)) for v, i in zip(values, ids, strict=True)]
        return TokenLogprob(token=text, logprob=float(logprobs[token]), bytes=raw,
                            top=[(t, lp, b) for t, b, lp in alternatives])

    def token_text(self, token: int) -> tuple[str, list[int]]:
        """A token's text and UTF-8 bytes."""
        return _token_text(self.tokenizer, token)

    # ------------------------------------------------------------------ adapters and full checkpoints

    @contextlib.contextmanager
    def _serving(self, adapter: Adapter | None) -> Iterator[Any]:
        """The model object that answers for ``adapter`` while the context lasts (worker thread, under the lock): the
        base with every adapter disabled, the base with that LoRA adapter active, or the full checkpoint's own model."""
        from peft import PeftModel

        if adapter is None:
            if isinstance(self._model, PeftModel):
                with self._model.disable_adapter():
                    yield self._model
            else:
                yield self._model
        elif adapter.kind == "full":
            yield self._full_model(adapter)
        else:
            self._activate_adapter(adapter)
            yield self._model

    def _full_model(self, adapter: Adapter) -> Any:
        """The model of full checkpoint ``adapter``, loading it from its folder if it is not cached (LRU: beyond
        ``max_loaded_full_checkpoints`` the least recently used is dropped and its memory freed). Raises
        ``ValueError`` for weights that are not of the base model's shape (another vocabulary or architecture)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        if adapter.name in self._full:
            self._full.move_to_end(adapter.name)
            return self._full[adapter.name]
        config = AutoConfig.from_pretrained(adapter.path)
        kind, base_kind = (config.model_type, int(config.vocab_size)), (self._model.config.model_type, self._vocab)
        if kind != base_kind:
            raise ValueError(f"checkpoint {adapter.name} is not a full checkpoint of this base model: a {kind[0]} model with {kind[1]} "
                             f"tokens, the base is a {base_kind[0]} model with {base_kind[1]}")
        while len(self._full) >= self.max_loaded_full_checkpoints:  # before loading: never one more in memory than the bound
            self._unload_full(next(iter(self._full)))
        model = AutoModelForCausalLM.from_pretrained(adapter.path, config=config, dtype=torch.float32).eval()
        model.generation_config = copy.deepcopy(self._generation_config)
        self._full[adapter.name] = model
        logger.info("loaded full checkpoint %s from %s", adapter.name, adapter.path)
        return model

    def _unload_full(self, name: str) -> None:
        """Drop full checkpoint ``name``'s model and free its memory."""
        del self._full[name]
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        logger.info("unloaded full checkpoint %s", name)

    def _activate_adapter(self, adapter: Adapter) -> None:
        """Make ``adapter`` the active one, loading it from its folder if it is not cached (LRU eviction)."""
        from peft import PeftModel

        if adapter.name in self._adapters:
            self._adapters.move_to_end(adapter.name)
        else:
            # PEFT keys adapters by module attribute names, so each gets an internal identifier.
            self._adapter_serial += 1
            key = f"adapter_{self._adapter_serial}"
            if isinstance(self._model, PeftModel):
                self._model.load_adapter(adapter.path, adapter_name=key)
            else:
                self._model = PeftModel.from_pretrained(self._model, adapter.path, adapter_name=key).eval()
            self._adapters[adapter.name] = key
            logger.info("loaded adapter %s from %s", adapter.name, adapter.path)
            while len(self._adapters) > self.max_loaded_adapters:
                evicted, evicted_key = self._adapters.popitem(last=False)
                self._model.delete_adapter(evicted_key)
                logger.info("unloaded adapter %s", evicted)
        self._model.set_adapter(self._adapters[adapter.name])


class _Rows:
    """Per-row control of one ``generate`` call: its logits processor, streamer and stopping criterion."""

    def __init__(self, engine: TransformersEngine, rows: list[_Row]) -> None:
        self.engine = engine
        self.rows = rows
        self._prompt_seen = False
        self._bitmask: torch.Tensor | None = None
        self.sampling = any(r.request.temperature > 0 for r in rows)
        self._greedy = [i for i, r in enumerate(rows) if r.request.temperature <= 0]
        self._sampled = [i for i, r in enumerate(rows) if r.request.temperature > 0]
        self._temperatures = torch.tensor([[rows[i].request.temperature] for i in self._sampled])
        self._top_p = [i for i in self._sampled if rows[i].request.top_p < 1.0]
        self._special = [i for i, r in enumerate(rows) if r.request.logprobs is not None or r.counts is not None or r.request.logit_bias]
        if any(r.matcher is not None for r in rows):
            import xgrammar

            self._bitmask = xgrammar.allocate_token_bitmask(len(rows), engine._vocab)

    def process(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Logits processor: ``scores`` ``[batch, vocab]`` are the raw logits of this step. Rows that need nothing
        cost nothing (a greedy batch with no options is returned as is, for ``generate``'s argmax)."""
        scores = scores.float()
        for i in self._special:
            row = self.rows[i]
            if row.done:
                continue
            request = row.request
            if request.logprobs is not None:
                row.step_logprobs = torch.log_softmax(scores[i], dim=-1)
            if row.counts is not None:
                scores[i] -= request.frequency_penalty * row.counts + request.presence_penalty * (row.counts > 0)
            if request.logit_bias:
                ids = torch.tensor([t for t in request.logit_bias if t < scores.shape[1]], dtype=torch.long)
                if len(ids):
                    scores[i, ids] += torch.tensor([request.logit_bias[int(t)] for t in ids])
        if self._bitmask is not None:
            import xgrammar

            indices = [i for i, row in enumerate(self.rows) if row.matcher is not None and not row.done]
            for i in indices:
                self.rows[i].matcher.fill_next_token_bitmask(self._bitmask, i)
            if indices:
                xgrammar.apply_token_bitmask_inplace(scores, self._bitmask, indices=indices)
        if not self.sampling:
            return scores
        if self._greedy:
            greedy = torch.tensor(self._greedy)
            best = scores[greedy].argmax(dim=-1)
            scores[greedy] = float("-inf")
            scores[greedy, best] = 0.0
        if self._sampled:
            sampled = torch.tensor(self._sampled)
            scores[sampled] /= self._temperatures
        for i in self._top_p:
            ordered, order = torch.sort(scores[i], descending=True)
            probs = torch.softmax(ordered, dim=-1)
            cut = probs.cumsum(dim=-1) - probs >= self.rows[i].request.top_p  # keep the smallest set reaching top_p
            scores[i, order[cut]] = float("-inf")
        return scores

    def put(self, value: torch.Tensor) -> None:
        """Streamer: the prompt first, then each step's new token per row."""
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        for row, token in zip(self.rows, value.tolist(), strict=True):
            if not row.done:
                self._take(row, int(token))

    def end(self) -> None:
        """Streamer: generation ended."""

    def stopping(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """Stopping criterion: a row is done when it finished or its request was cancelled."""
        for row in self.rows:
            if not row.done and row.generation.cancelled:
                row.finish_reason = "stop"
        return torch.tensor([row.done for row in self.rows], dtype=torch.bool)

    def _take(self, row: _Row, token: int) -> None:
        """Append one generated token to ``row``: logprob, grammar, end of turn, stop strings, limit, delta."""
        request = row.request
        row.tokens.append(token)
        if request.logprobs is not None and row.step_logprobs is not None and token not in self.engine._eos:  # the end of turn has no text
            entry = self.engine.token_logprob(row.step_logprobs, token, request.logprobs)
            row.logprobs.append(entry)
            row.unsent_logprobs.append(entry)
        if row.counts is not None and token < len(row.counts):
            row.counts[token] += 1
        if row.matcher is not None and not row.matcher.accept_token(token):
            row.finish_reason = "stop"  # cannot happen under the mask; end the row rather than emit invalid JSON
        if token in self.engine._eos:
            row.finish_reason = "stop"
        elif row.detok is not None:
            row.text += row.detok.add(token)
            if request.stop and self._cut_at_stop(row):
                row.finish_reason = "stop"
            if row.matcher is not None and row.matcher.is_terminated():
                row.finish_reason = "stop"
        if not row.done and len(row.tokens) >= row.limit:
            row.finish_reason = "length"
        self._push(row)

    @staticmethod
    def _cut_at_stop(row: _Row) -> bool:
        """Cut ``row.text`` before the first stop string in it, if any (only its tail can hold a new one)."""
        stops = [s for s in row.request.stop or [] if s]
        longest = max((len(s) for s in stops), default=0)
        start = max(0, row.sent - longest)
        found = [i for s in stops if (i := row.text.find(s, start)) >= 0]
        if found:
            row.text = row.text[: min(found)]
            return True
        return False

    def _push(self, row: _Row) -> None:
        """Stream the row's new text (streamed requests only), holding back a tail that may be the start of a stop
        string; the row's last delta carries its finish reason."""
        if not row.request.stream or row.finish_sent:
            return
        hold = 0 if row.done else max((len(s) - 1 for s in row.request.stop or []), default=0)
        end = max(row.sent, len(row.text) - hold)
        if end == row.sent and not row.done and not row.unsent_logprobs:
            return
        logprobs = row.unsent_logprobs if row.request.logprobs is not None else []
        row.generation.push(Delta(index=row.index, text=row.text[row.sent : end], logprobs=logprobs or None, finish_reason=row.finish_reason))
        row.sent, row.unsent_logprobs, row.finish_sent = end, [], row.done


class _Processor(LogitsProcessor):
    def __init__(self, rows: _Rows) -> None:
        self.rows = rows

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return self.rows.process(input_ids, scores)


class _Stopping(StoppingCriteria):
    def __init__(self, rows: _Rows) -> None:
        self.rows = rows

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        return self.rows.stopping(input_ids, scores)


_TOKEN_TEXT: dict[tuple[int, int], tuple[str, list[int]]] = {}


def _token_text(tokenizer: Any, token: int) -> tuple[str, list[int]]:
    key = (id(tokenizer), token)
    if key not in _TOKEN_TEXT:
        text = tokenizer.decode([token])
        _TOKEN_TEXT[key] = (text, list(text.encode("utf-8", "surrogatepass")))
    return _TOKEN_TEXT[key]


@register_engine("transformers")
def load(name: str, model_dir: Path, settings: InferenceSettings) -> TransformersEngine:
    """The transformers engine for one base model."""
    return TransformersEngine(model_dir, max_batch_size=settings.max_batch_size, max_loaded_adapters=settings.max_loaded_adapters,
                              max_loaded_full_checkpoints=settings.max_loaded_full_checkpoints)

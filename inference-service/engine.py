"""The transformers inference engine: batched chat generation on the base model or a per-request LoRA adapter.

:class:`TransformersEngine` holds one float32 copy of the base model and up to ``max_loaded_adapters`` PEFT
LoRA adapters on it (least recently used is unloaded first). A call to :meth:`TransformersEngine.generate`
runs left-padded batches through ``model.generate``; the base model runs with every adapter disabled, so the
base output never depends on which adapters were used before. :class:`MicroBatcher` turns many concurrent
single requests (one per HTTP call) into such batches.

Greedy decoding (``temperature == 0``) is deterministic for a given batch; float rounding differs slightly
between batch shapes, so in rare near-ties the same prompt may decode differently in a different batch.
Sampling with a ``seed`` is reproducible for the same batch (seeded requests are batched only with requests
of the same seed).

Tools (OpenAI ``tools``) are rendered by the model's chat template when it renders them; a template that
ignores them (SmolLM2's does) gets them in the system message instead (:func:`with_tools_message`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections import OrderedDict, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

logger = logging.getLogger(__name__)

TOOLS_HEADER = "Here is a list of functions in JSON format that you can invoke, one per line:"
_PROBE_TOOL = {"type": "function", "function": {"name": "crucible_probe_tool", "description": "", "parameters": {"type": "object", "properties": {}}}}


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template shows a ``tools`` argument to the model (many ignore it)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=True)
    return "crucible_probe_tool" in text


def with_tools_message(messages: list[dict[str, str]], tools: list[dict[str, Any]]) -> list[dict[str, str]]:
    """``messages`` with ``tools`` described in the system message, for chat templates that ignore tools.

    The description is :data:`TOOLS_HEADER` followed by one line per tool, ``json.dumps(tool, ensure_ascii=False)``
    (keys in the order given), appended to the first message after a blank line if it is a system message,
    else sent as a new first system message. Deterministic; ``messages`` is not modified.
    """
    text = "\n".join([TOOLS_HEADER, *(json.dumps(tool, ensure_ascii=False) for tool in tools)])
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


@dataclass
class GenerationRequest:
    """One chat completion: ``messages`` are ``{"role", "content"}`` dicts rendered with the chat template,
    ``tools`` OpenAI tool objects (``{"type": "function", "function": {...}}``) shown to the model with them.

    ``max_tokens`` caps generated tokens; ``temperature == 0`` means greedy decoding (``top_p`` and ``seed``
    then do nothing); ``stop`` strings end the text before their first occurrence.
    """

    messages: list[dict[str, str]]
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] | None = None
    seed: int | None = None
    tools: list[dict[str, Any]] | None = None


@dataclass
class GenerationResult:
    """The answer to one :class:`GenerationRequest`.

    ``completion_tokens`` counts the tokens generated for it, the end-of-turn token included, up to the token
    that completed a stop string; ``finish_reason`` is ``"stop"`` (end-of-turn token or stop string) or
    ``"length"`` (``max_tokens`` reached). ``cached_prompt_tokens``: how many of the prompt tokens an engine
    with a prefix cache served from it (charged at the cached price); this engine has none, so always 0.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: Literal["stop", "length"]
    cached_prompt_tokens: int = 0


def _sampling_key(request: GenerationRequest) -> tuple[float, float, int | None]:
    """Requests with equal keys can share one ``generate`` call."""
    if request.temperature <= 0:
        return (0.0, 1.0, None)
    return (request.temperature, request.top_p, request.seed)


class TransformersEngine:
    """Batched generation with the base model in ``base_dir`` (a prepared folder) and cached LoRA adapters.

    Loads the model once in float32 and uses every CPU the process may run on. Thread-safe: ``generate``
    calls are serialised by a lock (run them from one worker thread, as :class:`MicroBatcher` does).
    """

    def __init__(self, base_dir: Path, *, max_batch_size: int = 32, max_loaded_adapters: int = 8) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if max_batch_size < 1 or max_loaded_adapters < 1:
            raise ValueError("max_batch_size and max_loaded_adapters must be at least 1")
        self.max_batch_size = max_batch_size
        self.max_loaded_adapters = max_loaded_adapters
        torch.set_num_threads(len(os.sched_getaffinity(0)))
        self._tokenizer = AutoTokenizer.from_pretrained(base_dir)
        self._template_tools = template_renders_tools(self._tokenizer)
        self._model: Any = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
        self._eos_token_id: int = self._tokenizer.eos_token_id
        self._pad_token_id: int = self._tokenizer.pad_token_id
        self._adapters: OrderedDict[str, str] = OrderedDict()
        self._adapter_serial = 0
        self._lock = threading.Lock()
        self._tokenizer_lock = threading.Lock()

    @property
    def context_tokens(self) -> int:
        """The model's context window in tokens (prompt + completion)."""
        return int(self._model.config.max_position_embeddings)

    def prompt_text(self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None) -> str:
        """``messages`` (and ``tools``: by the template if it renders them, else :func:`with_tools_message`)
        rendered with the chat template, plus the assistant header that generation starts from."""
        if tools and not self._template_tools:
            messages, tools = with_tools_message(messages, tools), None
        return self._tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=True)

    def _prompt_ids(self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of :meth:`prompt_text`."""
        text = self.prompt_text(messages, tools)
        with self._tokenizer_lock:
            return self._tokenizer(text, add_special_tokens=False)["input_ids"]

    def count_prompt_tokens(self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None) -> int:
        """Number of prompt tokens ``messages`` and ``tools`` take once rendered (:meth:`prompt_text`). Fast and
        callable while a batch generates (it does not wait)."""
        return len(self._prompt_ids(messages, tools))

    def _activate_adapter(self, adapter_dir: Path, adapter_name: str) -> None:
        """Make ``adapter_name`` the active adapter, loading it from ``adapter_dir`` if it is not cached."""
        from peft import PeftModel

        if adapter_name in self._adapters:
            self._adapters.move_to_end(adapter_name)
        else:
            # PEFT keys adapters by module attribute names, so each gets an internal identifier.
            self._adapter_serial += 1
            key = f"adapter_{self._adapter_serial}"
            if isinstance(self._model, PeftModel):
                self._model.load_adapter(adapter_dir, adapter_name=key)
            else:
                self._model = PeftModel.from_pretrained(self._model, adapter_dir, adapter_name=key).eval()
            self._adapters[adapter_name] = key
            logger.info("loaded adapter %s from %s", adapter_name, adapter_dir)
            while len(self._adapters) > self.max_loaded_adapters:
                evicted, evicted_key = self._adapters.popitem(last=False)
                self._model.delete_adapter(evicted_key)
                logger.info("unloaded adapter %s", evicted)
        self._model.set_adapter(self._adapters[adapter_name])

    def generate(
        self,
        requests: list[GenerationRequest],
        adapter_dir: Path | None = None,
        adapter_name: str | None = None,
    ) -> list[GenerationResult]:
        """Answer ``requests`` in order, with the base model (``adapter_dir is None``) or the LoRA adapter in
        ``adapter_dir``.

        ``adapter_name`` identifies the adapter in the cache (default: the folder path); an adapter is read
        from disk once and a name must always denote the same weights. Requests are batched by sampling
        parameters in runs of at most ``max_batch_size`` (one ``model.generate`` call each).
        """
        results: list[GenerationResult | None] = [None] * len(requests)
        groups: dict[tuple[float, float, int | None], list[int]] = defaultdict(list)
        for index, request in enumerate(requests):
            groups[_sampling_key(request)].append(index)
        with self._lock:
            if adapter_dir is not None:
                self._activate_adapter(Path(adapter_dir), adapter_name or str(adapter_dir))
            for indices in groups.values():
                for start in range(0, len(indices), self.max_batch_size):
                    chunk = indices[start : start + self.max_batch_size]
                    batch = self._generate_batch([requests[i] for i in chunk], use_adapter=adapter_dir is not None)
                    for index, result in zip(chunk, batch, strict=True):
                        results[index] = result
        return results  # type: ignore[return-value]

    def _generate_batch(self, requests: list[GenerationRequest], *, use_adapter: bool) -> list[GenerationResult]:
        """One ``model.generate`` call over requests that share sampling parameters.

        Prompts are left-padded into ``input_ids`` / ``attention_mask`` ``[batch, longest_prompt]``; the batch
        generates ``max(max_tokens)`` new tokens at most and each row is then cut to its own limit.
        """
        from peft import PeftModel
        from transformers import GenerationConfig

        prompts = [self._prompt_ids(r.messages, r.tools) for r in requests]
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self._pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt) :] = 1

        first = requests[0]
        sampling = first.temperature > 0
        config = GenerationConfig(
            max_new_tokens=max(r.max_tokens for r in requests),
            do_sample=sampling,
            temperature=first.temperature if sampling else None,
            top_p=first.top_p if sampling else None,
            top_k=None,
            eos_token_id=self._eos_token_id,
            pad_token_id=self._pad_token_id,
        )
        if sampling and first.seed is not None:
            torch.manual_seed(first.seed)
        with torch.inference_mode():
            if use_adapter or not isinstance(self._model, PeftModel):
                output = self._model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, generation_config=config
                )
            else:
                with self._model.disable_adapter():
                    output = self._model.generate(
                        input_ids=input_ids, attention_mask=attention_mask, generation_config=config
                    )
        generated = output[:, width:].tolist()
        return [self._finish(r, len(p), tokens) for r, p, tokens in zip(requests, prompts, generated, strict=True)]

    def _finish(self, request: GenerationRequest, prompt_tokens: int, tokens: list[int]) -> GenerationResult:
        """Cut one row's generated ``tokens`` at end-of-turn, ``max_tokens`` and stop strings."""
        tokens = tokens[: request.max_tokens]
        finish_reason: Literal["stop", "length"] = "length"
        if self._eos_token_id in tokens:
            tokens = tokens[: tokens.index(self._eos_token_id) + 1]
            finish_reason = "stop"
        text = self._tokenizer.decode(tokens, skip_special_tokens=True)
        stops = [s for s in request.stop or [] if s and s in text]
        if stops:
            text = text[: min(text.index(s) for s in stops)]
            finish_reason = "stop"
            tokens = tokens[: self._tokens_until_stop(tokens, stops)]
        return GenerationResult(
            text=text, prompt_tokens=prompt_tokens, completion_tokens=len(tokens), finish_reason=finish_reason
        )

    def _tokens_until_stop(self, tokens: list[int], stops: list[str]) -> int:
        """Smallest ``k`` such that the text of ``tokens[:k]`` contains one of ``stops``."""
        for k in range(1, len(tokens) + 1):
            text = self._tokenizer.decode(tokens[:k], skip_special_tokens=True)
            if any(s in text for s in stops):
                return k
        return len(tokens)


@dataclass
class _Pending:
    request: GenerationRequest
    adapter_name: str | None
    adapter_dir: Path | None
    future: asyncio.Future[GenerationResult]


class MicroBatcher:
    """Collects concurrent :meth:`submit` calls into batches for one :class:`TransformersEngine`.

    The first waiting request opens a window of ``max_wait_ms``; requests arriving in it (up to
    ``engine.max_batch_size``) join the batch. The batch is split by adapter, and each part runs as one
    :meth:`TransformersEngine.generate` call on a single worker thread, one at a time; requests arriving
    meanwhile form the next batch. Must be used from one event loop; call :meth:`aclose` on shutdown.
    """

    def __init__(self, engine: TransformersEngine, *, max_wait_ms: float = 15) -> None:
        self.engine = engine
        self._max_wait_s = max_wait_ms / 1000
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._in_flight: list[_Pending] = []

    async def submit(
        self, request: GenerationRequest, adapter_name: str | None = None, adapter_dir: Path | None = None
    ) -> GenerationResult:
        """Generate for ``request`` in the next batch and return its result.

        ``adapter_dir`` (with ``adapter_name`` as its cache name) selects a LoRA adapter; ``None`` the base
        model. Raises whatever the engine raised for the batch; cancelling the caller drops the request.
        """
        loop = asyncio.get_running_loop()
        if self._worker is None:
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._run(), name="micro-batcher")
        future: asyncio.Future[GenerationResult] = loop.create_future()
        assert self._queue is not None
        self._queue.put_nowait(_Pending(request, adapter_name, adapter_dir, future))
        return await future

    async def _collect(self) -> list[_Pending]:
        """Wait for one request, then gather more for up to ``max_wait_ms``."""
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        batch = [await self._queue.get()]
        deadline = loop.time() + self._max_wait_s
        while len(batch) < self.engine.max_batch_size:
            remaining = deadline - loop.time()
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
            by_adapter: dict[tuple[str | None, Path | None], list[_Pending]] = defaultdict(list)
            for pending in batch:
                by_adapter[(pending.adapter_name, pending.adapter_dir)].append(pending)
            for (adapter_name, adapter_dir), group in by_adapter.items():
                live = [p for p in group if not p.future.done()]
                if not live:
                    continue
                try:
                    results = await loop.run_in_executor(
                        self._executor,
                        self.engine.generate,
                        [p.request for p in live],
                        adapter_dir,
                        adapter_name,
                    )
                except Exception as error:  # noqa: BLE001 - the error belongs to the callers of this batch
                    logger.exception("generation failed for a batch of %d", len(live))
                    for pending in live:
                        if not pending.future.done():
                            pending.future.set_exception(error)
                    continue
                for pending, result in zip(live, results, strict=True):
                    if not pending.future.done():
                        pending.future.set_result(result)

    async def aclose(self) -> None:
        """Stop batching: cancel the requests not answered yet and release the worker thread."""
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
            self._worker = None
        for pending in self._in_flight:
            pending.future.cancel()
        if self._queue is not None:
            while not self._queue.empty():
                self._queue.get_nowait().future.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

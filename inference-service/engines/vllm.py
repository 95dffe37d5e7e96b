"""The vLLM engine: vLLM's V1 engine in this process (no child processes but a tensor-parallel engine's workers), continuous
batching, every feature of the seam.

vLLM 0.32's ``AsyncLLM`` always runs its EngineCore in a child process (its in-process asyncio mode raises
``NotImplementedError``), so this engine drives vLLM's V1 ``LLMEngine`` with its in-process core
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, executor ``uni``) from one dedicated thread, the way ``AsyncLLM``'s
output loop drives its core: the thread adds and aborts requests and loads adapters between steps, calls
``step()`` while anything is unfinished, and sleeps on its command queue otherwise. Every vLLM call happens on that
thread (vLLM is not thread-safe); callers on any event loop talk to it through a queue, and their
:class:`~inference_service.engines.base.Generation` is fed back thread-safely. A request that arrives while others
decode joins the running batch at the next step (continuous batching), whatever its adapter.

Prompts are rendered and tokenized exactly as the transformers engine does (:class:`~inference_service.chat.ChatRenderer`,
the model's own tokenizer) and given to vLLM as token ids, so both engines see the same tokens. The model runs in
float32 (vLLM's bfloat16 diverges from transformers' greedy output on small models), eager (no torch.compile: it
costs a minute per start and its cache does not reload on CPU), with prefix caching (``cached_prompt_tokens``; on
CPU the KV block, hence the cache's granularity, is 128 tokens) and a KV cache of ``kv_cache_bytes``.

Features: log-probabilities are the model's raw ones (``logprobs_mode="raw_logprobs"``, before penalties, bias,
temperature and top-p), JSON schemas by xgrammar (no free whitespace, as the transformers engine), OpenAI's
presence/frequency penalties, logit bias, per-request seeds (a request with ``n`` choices and a seed draws choice
``i`` with ``seed + i``, vLLM's rule), stop strings. ``max_tokens=0`` with ``prompt_logprobs`` (``/completions``
echo) runs one step for the prompt's log-probabilities and reports no generated token.

Adapters: LoRA (PEFT folders), hot-loaded on first use with ``add_lora`` (an unreadable adapter fails its own
request, not the engine), each adapter name with its own integer id for the engine's life; at most
``max_loaded_adapters`` loaded, the least recently used removed first. vLLM pads every LoRA to ``max_lora_rank``
and its CPU LoRA kernels are plain torch ops, so enabling LoRA at a large rank slows every request, base ones
included (see ``bench/engines.py``). Full-weight checkpoints are not served (no
:attr:`~inference_service.engines.base.Feature.full_weights`: one vLLM engine holds one model's weights); the
transformers engine serves them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

# vLLM reads these when it starts an engine; in-process: no EngineCore or worker child processes.
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")

from inference_service.chat import ChatRenderer, end_of_turn_ids  # noqa: E402
from inference_service.engines import register_engine  # noqa: E402
from inference_service.engines.base import (  # noqa: E402
    Adapter,
    Choice,
    Delta,
    Feature,
    Generation,
    GenerationRequest,
    GenerationResult,
    TokenLogprob,
)
from inference_service.engines.tokens import TokenTexts  # noqa: E402

if TYPE_CHECKING:
    from inference_service.settings import InferenceSettings

logger = logging.getLogger(__name__)

DEFAULT_KV_CACHE_BYTES = 2 << 30  # 2 GiB: 46,592 tokens of SmolLM2-135M's float32 KV (5.7 full 8k contexts)
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM 0.32 can be started for


@dataclass
class _Choice:
    """One choice as it comes out of vLLM (deltas accumulated)."""

    text: str = ""
    tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: Literal["stop", "length"] | None = None


@dataclass
class _Job:
    """One submitted request in the engine: what the caller gets, and what came out so far."""

    request_id: str
    request: GenerationRequest
    generation: Generation
    prompt: list[int]
    choices: list[_Choice]
    adapter: str | None = None
    discard_output: bool = False  # max_tokens=0 run for the prompt's log-probabilities only
    replicated: bool = False  # greedy with n > 1: vLLM decodes one choice (it refuses greedy n > 1), each choice is a copy
    cached_prompt_tokens: int = 0
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass
class _Add:
    job: _Job
    params: Any
    adapter: Adapter | None
    accepted: concurrent.futures.Future[None]


@dataclass
class _Abort:
    request_id: str


class _Stop:
    pass


def engine_args(model_dir: Path, *, dtype: str, max_model_len: int | None, kv_cache_bytes: int, lora_rank: int | None,
                max_loaded_adapters: int, tensor_parallel_size: int = 1) -> dict[str, Any]:
    """vLLM's ``EngineArgs`` for :class:`VLLMEngine` (see the module docstring): one process (executor ``uni``), or with
    ``tensor_parallel_size`` > 1 each layer's weights split over that many GPUs by vLLM's tensor parallelism, one worker
    process a GPU (executor ``mp``; the KV cache budget ``kv_cache_bytes`` is each GPU's). LoRA at ``lora_rank`` (``None``:
    no LoRA) with ``max_loaded_adapters`` slots. ``ValueError`` for tensor parallelism over more GPUs than this process sees."""
    if tensor_parallel_size > 1:
        import torch

        if torch.cuda.device_count() < tensor_parallel_size:
            raise ValueError(f"tensor_parallel_size {tensor_parallel_size} needs that many GPUs; this process sees {torch.cuda.device_count()}")
    args: dict[str, Any] = {
        "model": str(model_dir), "dtype": dtype, "max_model_len": max_model_len, "kv_cache_memory_bytes": kv_cache_bytes,
        "enforce_eager": True, "distributed_executor_backend": "uni" if tensor_parallel_size == 1 else "mp",
        "tensor_parallel_size": tensor_parallel_size, "enable_prefix_caching": True,
        "logprobs_mode": "raw_logprobs", "generation_config": "vllm", "disable_log_stats": True,
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
    }
    if lora_rank is not None:
        args.update(enable_lora=True, max_lora_rank=lora_rank, max_loras=max_loaded_adapters, max_cpu_loras=max_loaded_adapters)
    return args


class VLLMEngine:
    """The model in ``model_dir`` (a prepared Hugging Face folder) and its LoRA adapters, served by vLLM in this
    process. Blocks until vLLM has loaded the model and sized its KV cache."""

    features = frozenset(Feature) - {Feature.full_weights}

    def __init__(self, model_dir: Path, *, max_loaded_adapters: int = 8, max_lora_rank: int = 256,
                 kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES, max_model_len: int | None = None, dtype: str = "float32",
                 enable_lora: bool = True, threads: int = 1, tensor_parallel_size: int = 1) -> None:
        from transformers import AutoTokenizer

        if max_loaded_adapters < 1:
            raise ValueError("max_loaded_adapters must be at least 1")
        rank = next((r for r in _LORA_RANKS if r >= max_lora_rank), None)
        if rank is None:
            raise ValueError(f"vLLM serves LoRA ranks up to {_LORA_RANKS[-1]}, not {max_lora_rank}")
        self.model_dir = Path(model_dir)
        self.max_loaded_adapters = max_loaded_adapters
        self.max_lora_rank = rank
        self.enable_lora = enable_lora
        self.threads = threads
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.renderer = ChatRenderer(self.tokenizer)
        self._eos = end_of_turn_ids(model_dir, self.tokenizer)  # vLLM is told them: its generation_config "vllm" reads none
        self._token_texts = TokenTexts(self.tokenizer)
        self._engine_args = engine_args(model_dir, dtype=dtype, max_model_len=max_model_len, kv_cache_bytes=kv_cache_bytes,
                                        lora_rank=rank if enable_lora else None, max_loaded_adapters=max_loaded_adapters,
                                        tensor_parallel_size=tensor_parallel_size)
        self._commands: queue.SimpleQueue[_Add | _Abort | _Stop] = queue.SimpleQueue()
        self._jobs: dict[str, _Job] = {}
        self._ids = itertools.count()
        self._adapter_ids: dict[str, int] = {}  # adapter name -> its LoRA id, for the engine's life
        self._loaded: OrderedDict[str, int] = OrderedDict()  # loaded adapters, least recently used first
        self._busy: dict[str, int] = {}  # adapter name -> requests running on it
        self._closed = False
        self._engine: Any = None
        self._context_tokens = 0
        self._vocab = 0
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, name="vllm-engine", daemon=True)
        self._thread.start()
        self._started.result()

    # ------------------------------------------------------------------ prompts

    @property
    def context_tokens(self) -> int:
        """The context window vLLM was started with (the model's own unless capped), prompt + completion."""
        return self._context_tokens

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """Token ids of the request's prompt (:meth:`~inference_service.chat.ChatRenderer.prompt_ids`); callable while generating."""
        return self.renderer.prompt_ids(request, self._vocab)


    # ------------------------------------------------------------------ the caller's side

    def check_schema(self, schema: dict[str, Any]) -> None:
        """Nothing to check here: vLLM compiles the schema when the request is added: a refusal there is a ``ValueError`` from :meth:`submit`."""

    async def submit(self, request: GenerationRequest, adapter: Adapter | None = None) -> Generation:
        """Start ``request`` (joining the running batch at vLLM's next step); returns its :class:`Generation`.
        Raises ``ValueError`` for a request vLLM refuses or a full-weight checkpoint, or what loading ``adapter`` raised."""
        if self._closed:
            raise RuntimeError("the engine is shut down")
        if adapter is not None and adapter.kind == "full":
            raise ValueError(f"{adapter.name} is a full-weight checkpoint: the vLLM engine serves LoRA checkpoints only")
        if adapter is not None and not self.enable_lora:
            raise ValueError("this engine was started without LoRA")
        prompt = await asyncio.to_thread(self.prompt_ids, request)
        request_id = f"req-{next(self._ids)}"
        generation = Generation(on_cancel=lambda: self._commands.put(_Abort(request_id)))
        job = _Job(request_id, request, generation, prompt, [_Choice() for _ in range(request.n)],
                   adapter=adapter.name if adapter is not None else None)
        room = self._context_tokens - len(prompt)
        limit = room if request.max_tokens is None else min(request.max_tokens, room)
        if limit <= 0 and request.prompt_logprobs is None:  # nothing to generate (the transformers engine's answer)
            for index, choice in enumerate(job.choices):
                choice.finish_reason = "length"
                if request.stream:
                    generation.push(Delta(index=index, text="", finish_reason="length"))
            self._finish(job)
            return generation
        if limit <= 0:
            job.discard_output, limit = True, 1
        job.replicated = request.n > 1 and request.temperature <= 0
        accepted: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._commands.put(_Add(job, self._sampling_params(request, limit), adapter, accepted))
        await asyncio.wrap_future(accepted)
        return generation

    def _sampling_params(self, request: GenerationRequest, max_tokens: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        return SamplingParams(
            n=1 if request.temperature <= 0 else request.n, max_tokens=max_tokens, temperature=request.temperature, top_p=request.top_p,
            seed=request.seed if request.temperature > 0 else None, stop=[s for s in request.stop or [] if s] or None, stop_token_ids=self._eos,
            logprobs=request.logprobs, prompt_logprobs=request.prompt_logprobs,
            presence_penalty=request.presence_penalty, frequency_penalty=request.frequency_penalty,
            logit_bias=dict(request.logit_bias) if request.logit_bias else None,
            structured_outputs=StructuredOutputsParams(json=request.json_schema) if request.json_schema is not None else None,
            output_kind=RequestOutputKind.DELTA, skip_special_tokens=True,
        )

    async def aclose(self) -> None:
        """Fail what is pending, stop the engine thread and release the model."""
        if self._closed:
            return
        self._closed = True
        self._commands.put(_Stop())
        await asyncio.to_thread(self._thread.join)

    # ------------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        import torch

        set_num_threads = torch.set_num_threads
        try:
            from vllm.engine.arg_utils import EngineArgs
            from vllm.v1.engine.llm_engine import LLMEngine

            self._engine = LLMEngine.from_engine_args(EngineArgs(**self._engine_args))
            # vLLM's CPU worker replaces torch.set_num_threads process-wide by a no-op (and so skips its own "1 thread
            # for serving"); give it back to the process, and set this thread's OpenMP team (per thread) ourselves.
            torch.set_num_threads = set_num_threads
            torch.set_num_threads(self.threads)
            self._context_tokens = int(self._engine.model_config.max_model_len)
            self._vocab = int(self._engine.model_config.get_vocab_size())
        except BaseException as error:  # noqa: BLE001 - the constructor raises it
            self._started.set_exception(error)
            return
        self._started.set_result(None)
        try:
            while self._serve_commands():
                if self._jobs or self._engine.has_unfinished_requests():
                    try:
                        outputs = self._engine.step()
                    except Exception as error:  # noqa: BLE001 - the requests in flight get the error
                        logger.exception("vLLM step failed")
                        self._fail_all(error)
                        continue
                    for output in outputs:
                        self._take(output)
        finally:
            self._fail_all(RuntimeError("the engine is shutting down"))
            engine, self._engine = self._engine, None
            try:
                engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001
                logger.exception("vLLM shutdown failed")

    def _serve_commands(self) -> bool:
        """Apply the waiting commands (block for one when nothing runs); ``False`` once told to stop."""
        idle = not self._jobs and not self._engine.has_unfinished_requests()
        while True:
            try:
                command = self._commands.get(block=idle)
            except queue.Empty:
                return True
            idle = False
            if isinstance(command, _Stop):
                return False
            if isinstance(command, _Add):
                self._add(command)
            elif isinstance(command, _Abort):
                self._abort(command.request_id)

    def _add(self, command: _Add) -> None:
        from vllm.inputs import TokensPrompt

        job = command.job
        try:
            lora = self._lora(command.adapter) if command.adapter is not None else None
            self._engine.add_request(job.request_id, TokensPrompt(prompt_token_ids=job.prompt), command.params, lora_request=lora)
        except Exception as error:  # noqa: BLE001 - the caller's submit raises it
            command.accepted.set_exception(error if not _is_refusal(error) else ValueError(str(error)))
            return
        self._jobs[job.request_id] = job
        if job.adapter is not None:
            self._busy[job.adapter] = self._busy.get(job.adapter, 0) + 1
        command.accepted.set_result(None)
        if job.generation.cancelled:  # cancelled before it was added: its abort command has been served already
            self._abort(job.request_id)

    def _lora(self, adapter: Adapter) -> Any:
        """The LoRA request of ``adapter``, loading it now if it is not loaded (the least recently used unloaded)."""
        from vllm.lora.request import LoRARequest

        lora_id = self._adapter_ids.setdefault(adapter.name, len(self._adapter_ids) + 1)
        lora = LoRARequest(adapter.name, lora_id, str(adapter.path))
        if adapter.name in self._loaded:
            self._loaded.move_to_end(adapter.name)
            return lora
        if len(self._loaded) >= self.max_loaded_adapters:
            # unload the least recently used adapter no running request uses; if every one is in use, vLLM's own
            # LRU cache (max_cpu_loras) makes room, and a request whose adapter it dropped reloads it from its path
            idle = next((name for name in self._loaded if not self._busy.get(name)), None)
            if idle is not None:
                self._engine.remove_lora(self._loaded.pop(idle))
                logger.info("unloaded adapter %s", idle)
            else:
                self._loaded.popitem(last=False)
        self._engine.add_lora(lora)
        self._loaded[adapter.name] = lora_id
        logger.info("loaded adapter %s from %s", adapter.name, adapter.path)
        return lora

    def _abort(self, request_id: str) -> None:
        """Stop a request: abort it in vLLM; its result holds what it generated up to now (choices end ``stop``)."""
        job = self._jobs.get(request_id)
        if job is None:
            return  # finished already, or not added yet (then _add aborts it)
        self._engine.abort_request([request_id])
        for index, choice in enumerate(job.choices):
            if choice.finish_reason is None:
                choice.finish_reason = "stop"
                if job.request.stream:
                    job.generation.push(Delta(index=index, text="", finish_reason="stop"))
        self._end(job)

    def _take(self, output: Any) -> None:
        """One step's output of a request (new tokens of one or more of its choices)."""
        job = self._jobs.get(output.request_id)
        if job is None:
            return
        job.cached_prompt_tokens = max(job.cached_prompt_tokens, output.num_cached_tokens or 0)
        if output.prompt_logprobs is not None and job.prompt_logprobs is None:
            job.prompt_logprobs = [None if entry is None else self._logprob(entry, token, job.request.prompt_logprobs or 0)
                                   for entry, token in zip(output.prompt_logprobs, job.prompt, strict=False)]
        for out in output.outputs:
            for index in range(len(job.choices)) if job.replicated else [out.index]:
                self._take_choice(job, index, out)
        if all(c.finish_reason is not None for c in job.choices):
            self._end(job)

    def _take_choice(self, job: _Job, index: int, out: Any) -> None:
        choice = job.choices[index]
        if choice.finish_reason is not None:
            return
        finish = _finish_reason(out.finish_reason)
        if job.discard_output:
            choice.finish_reason = finish and "length"
            return
        logprobs = None
        if job.request.logprobs is not None and out.logprobs:
            logprobs = [self._logprob(entry, token, job.request.logprobs) for entry, token in zip(out.logprobs, out.token_ids, strict=True)
                        if token not in self._eos]  # the end of turn has no text
            choice.logprobs.extend(logprobs)
        choice.text += out.text
        choice.tokens += len(out.token_ids)
        choice.finish_reason = finish
        if job.request.stream and (out.text or logprobs or finish):
            job.generation.push(Delta(index=index, text=out.text, logprobs=logprobs, finish_reason=finish))

    def _end(self, job: _Job) -> None:
        """``job`` is over in vLLM: forget it and give its caller the result."""
        del self._jobs[job.request_id]
        if job.adapter is not None:
            self._busy[job.adapter] -= 1
        self._finish(job)

    def _finish(self, job: _Job) -> None:
        request = job.request
        job.generation.finish(GenerationResult(
            choices=[Choice(text=c.text, completion_tokens=c.tokens, finish_reason=c.finish_reason or "stop",
                            logprobs=c.logprobs if request.logprobs is not None else None) for c in job.choices],
            prompt_tokens=len(job.prompt), cached_prompt_tokens=min(job.cached_prompt_tokens, len(job.prompt)),
            prompt_text=self.tokenizer.decode(job.prompt) if request.prompt_logprobs is not None else None,
            prompt_logprobs=job.prompt_logprobs if request.prompt_logprobs is not None else None,
        ))

    def _fail_all(self, error: BaseException) -> None:
        jobs, self._jobs = list(self._jobs.values()), {}
        self._busy.clear()
        for job in jobs:
            job.generation.fail(error)
            if self._engine is not None:
                try:
                    self._engine.abort_request([job.request_id])
                except Exception:  # noqa: BLE001
                    logger.exception("abort failed")
        while True:  # requests not added yet
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Add):
                command.accepted.set_exception(error)

    def _logprob(self, entry: Any, token: int, top: int) -> TokenLogprob:
        """One position of vLLM's log-probabilities (``{token id: Logprob}``: the chosen token and the ``top`` most
        likely ones, by rank) as the seam's entry."""
        text, raw = self._token_text(token)
        ranked = sorted((lp.rank, tid, lp.logprob) for tid, lp in entry.items() if lp.rank is not None and lp.rank <= top)
        alternatives = []
        for _, tid, logprob in ranked[:top]:
            alt_text, alt_raw = self._token_text(tid)
            alternatives.append((alt_text, float(logprob), alt_raw))
        return TokenLogprob(token=text, logprob=float(entry[token].logprob), bytes=raw, top=alternatives)

    def _token_text(self, token: int) -> tuple[str, list[int]]:
        """A token's text and its own bytes (as the transformers engine reports them: :mod:`.tokens`)."""
        return self._token_texts.of(token)


def _finish_reason(reason: str | None) -> Literal["stop", "length"] | None:
    """vLLM's finish reason on the seam: ``length`` stays, anything else that ends a choice (end of turn, stop
    string, end of the JSON schema, abort) is ``stop``."""
    if reason is None:
        return None
    return "length" if reason == "length" else "stop"


def _is_refusal(error: Exception) -> bool:
    """An error vLLM raises for a request it will not serve (bad parameters, too long a prompt)."""
    return isinstance(error, ValueError | TypeError) or type(error).__name__ in {"VLLMValidationError", "ValidationError"}


@register_engine("vllm")
def load(name: str, model_dir: Path, settings: InferenceSettings) -> VLLMEngine:
    """The vLLM engine for one base model, started for its card's context cap (``context_tokens``) where the card has one
    (vLLM sizes its KV cache for it), over ``settings.tensor_parallel_size`` GPUs."""
    from services.common.llms import model_card

    card = model_card(name, settings.models_dir)
    return VLLMEngine(model_dir, max_loaded_adapters=settings.max_loaded_adapters, max_lora_rank=settings.max_lora_rank,
                      max_model_len=card.context_tokens, tensor_parallel_size=settings.tensor_parallel_size)

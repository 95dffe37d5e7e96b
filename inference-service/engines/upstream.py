"""The upstream engine: an OpenAI-compatible server (``vllm serve``, as compose's and Helm's GPU profile start it) runs
the model; this process renders prompts, meters and speaks the platform's protocol.

Prompts are rendered here with the model's own tokenizer and chat template (:class:`~inference_service.chat.ChatRenderer`,
from the same prepared folder the server loaded) and sent as token ids to the server's ``/v1/completions``, so every
engine sees the same tokens and prompt counts are known before the hold. Requests stream (``return_token_ids`` and
``continuous_usage_stats``: vLLM's extensions), so a cancelled generation closes the stream — vLLM then aborts the
request — and the result counts exactly the tokens the server sent. JSON schemas go as vLLM's ``structured_outputs``,
prompt log-probabilities as its ``prompt_logprobs``. Start the server with
``--structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}'`` for compact JSON as the
transformers engine decodes it (with vLLM's default, a JSON answer may spend its tokens on whitespace).

LoRA checkpoints are loaded on first use through vLLM's runtime adapter API (``POST /v1/load_lora_adapter``; the server
runs with ``--enable-lora``, ``--max-lora-rank`` covering the recipe's limit and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``),
the least recently used unloaded beyond ``max_loaded_adapters``. The adapter's folder must be readable by the server
at the same path (compose and Helm mount the artifact store in both). Full-weight checkpoints are not served (no
:attr:`~inference_service.engines.base.Feature.full_weights`: a ``vllm serve`` serves the one model it started with);
the transformers engine serves them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
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
    TokenLogprob,
)
from inference_service.engines.tokens import TokenTexts

if TYPE_CHECKING:
    from inference_service.settings import InferenceSettings

logger = logging.getLogger(__name__)


class UpstreamError(RuntimeError):
    """The upstream server refused or failed a request."""


class UpstreamEngine:
    """One base model served by an OpenAI-compatible server at ``base_url`` (with ``/v1``) under ``served_name``."""

    features = frozenset(Feature) - {Feature.full_weights}

    def __init__(self, served_name: str, model_dir: Path, base_url: str, *, api_key: str = "", max_loaded_adapters: int = 8,
                 timeout_s: float = 600.0) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self.served_name = served_name
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.renderer = ChatRenderer(self.tokenizer)
        self._eos = end_of_turn_ids(model_dir, self.tokenizer)  # sent as stop_token_ids: a server need not read generation_config.json
        self._texts = TokenTexts(self.tokenizer)  # logprobs come back as token ids (return_tokens_as_token_ids): their own bytes
        self._context = int(AutoConfig.from_pretrained(model_dir).max_position_embeddings)
        self._vocab = len(self.tokenizer)
        self._base_url, self._api_key, self._timeout_s = base_url.rstrip("/"), api_key, timeout_s
        self._client: httpx.AsyncClient | None = None
        self._root = httpx.URL(base_url.rstrip("/")).copy_with(path="/")
        self.max_loaded_adapters = max_loaded_adapters
        self._adapters: OrderedDict[str, Path] = OrderedDict()
        self._adapter_lock: asyncio.Lock | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def _http(self) -> httpx.AsyncClient:
        """The HTTP client of the running event loop (connections belong to one loop)."""
        loop = asyncio.get_running_loop()
        if self._client is None or getattr(self._client, "_crucible_loop", None) is not loop:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            self._client = httpx.AsyncClient(base_url=self._base_url, headers=headers, timeout=httpx.Timeout(self._timeout_s, connect=10.0))
            self._client._crucible_loop = loop  # type: ignore[attr-defined]
            self._adapter_lock = None
        return self._client

    @property
    def context_tokens(self) -> int:
        """The model's context window in tokens (the server's ``--max-model-len`` must not be smaller)."""
        return self._context

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """Token ids of the request's prompt (:meth:`~inference_service.chat.ChatRenderer.prompt_ids`); callable while generating."""
        return self.renderer.prompt_ids(request, self._vocab)

    def check_schema(self, schema: dict[str, Any]) -> None:
        """Nothing to check here: the server compiles the schema: a refusal is its 400, passed on from :meth:`submit`."""

    async def submit(self, request: GenerationRequest, adapter: Adapter | None = None) -> Generation:
        """Start the request on the server (the adapter loaded first if new); returns its :class:`Generation`.
        ``ValueError`` for a full-weight checkpoint."""
        if adapter is not None and adapter.kind == "full":
            raise ValueError(f"{adapter.name} is a full-weight checkpoint: the upstream engine serves LoRA checkpoints only")
        prompt = await asyncio.to_thread(self.prompt_ids, request)
        model = await self._model_for(adapter)
        stop = asyncio.Event()
        generation = Generation(on_cancel=stop.set)
        task = asyncio.get_running_loop().create_task(self._run(generation, stop, request, prompt, model))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return generation

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None and getattr(self._client, "_crucible_loop", None) is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None

    # ------------------------------------------------------------------ adapters

    async def _model_for(self, adapter: Adapter | None) -> str:
        if adapter is None:
            return self.served_name
        if self._adapter_lock is None:
            self._adapter_lock = asyncio.Lock()
        async with self._adapter_lock:
            if adapter.name in self._adapters:
                self._adapters.move_to_end(adapter.name)
                return adapter.name
            await self._admin("/v1/load_lora_adapter", {"lora_name": adapter.name, "lora_path": str(adapter.path)})
            self._adapters[adapter.name] = adapter.path
            logger.info("loaded adapter %s on the upstream server", adapter.name)
            while len(self._adapters) > self.max_loaded_adapters:
                evicted, _ = self._adapters.popitem(last=False)
                await self._admin("/v1/unload_lora_adapter", {"lora_name": evicted})
                logger.info("unloaded adapter %s from the upstream server", evicted)
        return adapter.name

    async def _admin(self, path: str, body: dict[str, Any]) -> None:
        resp = await self._http.post(str(self._root.join(path.lstrip("/"))), json=body)
        if resp.status_code >= 400 and "already been loaded" not in resp.text:
            raise UpstreamError(f"{path}: {resp.status_code} {resp.text[:300]}")

    # ------------------------------------------------------------------ generation

    def _body(self, request: GenerationRequest, prompt: list[int], model: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model, "prompt": prompt, "max_tokens": request.max_tokens if request.max_tokens is not None else self._context - len(prompt),
            "n": request.n, "temperature": request.temperature, "top_p": request.top_p, "stop": request.stop or [],
            "presence_penalty": request.presence_penalty, "frequency_penalty": request.frequency_penalty,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "return_token_ids": True,
            "skip_special_tokens": True, "stop_token_ids": self._eos,
        }
        if request.seed is not None:
            body["seed"] = request.seed
        if request.logprobs is not None:
            body["logprobs"] = request.logprobs
            body["return_tokens_as_token_ids"] = True  # "token_id:N": the token's own bytes are read here, not a lossy decoding
        if request.logit_bias:
            body["logit_bias"] = {str(k): v for k, v in request.logit_bias.items()}
        if request.json_schema is not None:
            body["structured_outputs"] = {"json": request.json_schema}
        if request.temperature <= 0:
            body["n"] = 1  # vLLM refuses n > 1 with greedy decoding: the choices are one answer, repeated (see _run)
        return body

    async def _run(self, generation: Generation, stop: asyncio.Event, request: GenerationRequest, prompt: list[int], model: str) -> None:
        try:
            prompt_logprobs = await self._prompt_logprobs(prompt, request.prompt_logprobs, model) if request.prompt_logprobs is not None else None
            body = self._body(request, prompt, model)
            choices = [_ChoiceState() for _ in range(body["n"])]
            cached = 0
            if request.max_tokens != 0:
                cached = await self._stream(generation, stop, body, choices, request)
            choices += [choices[0]] * (request.n - len(choices))  # greedy: every choice is the same answer (charged as n, as elsewhere)
            generation.finish(GenerationResult(
                choices=[Choice(text=c.text, completion_tokens=c.tokens, finish_reason=c.finish_reason or ("stop" if stop.is_set() else "length"),
                                logprobs=c.logprobs if request.logprobs is not None else None) for c in choices],
                prompt_tokens=len(prompt), cached_prompt_tokens=cached,
                prompt_text=self.tokenizer.decode(prompt) if request.prompt_logprobs is not None else None, prompt_logprobs=prompt_logprobs,
            ))
        except Exception as error:  # noqa: BLE001 - the error belongs to the generation's caller
            logger.exception("upstream generation failed")
            generation.fail(error)

    async def _stream(self, generation: Generation, stop: asyncio.Event, body: dict[str, Any], choices: list[_ChoiceState],
                      request: GenerationRequest) -> int:
        """Read the server's events into ``choices`` until the end or ``stop``; returns the cached prompt tokens."""
        cached = 0
        async with self._http.stream("POST", "/completions", json=body) as resp:
            if resp.status_code >= 400:
                raise UpstreamError(f"completions: {resp.status_code} {(await resp.aread()).decode(errors='replace')[:500]}")
            lines = resp.aiter_lines()
            while not stop.is_set():
                line = await _next_or_stop(lines, stop)
                if line is None or line.strip() == "data: [DONE]":
                    break
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                details = (event.get("usage") or {}).get("prompt_tokens_details") or {}
                cached = details.get("cached_tokens") or cached
                for part in event.get("choices", []):
                    state = choices[part["index"]]
                    state.tokens += len(part.get("token_ids") or [])
                    state.text += part.get("text", "")
                    entries = self._token_logprobs(part.get("logprobs"), request.logprobs)
                    state.logprobs.extend(entries)
                    if part.get("finish_reason") in ("stop", "length"):
                        state.finish_reason = part["finish_reason"]
                    if request.stream and (part.get("text") or entries or state.finish_reason):
                        generation.push(Delta(index=part["index"], text=part.get("text", ""), logprobs=entries or None,
                                              finish_reason=state.finish_reason))
        return cached

    async def _prompt_logprobs(self, prompt: list[int], top: int, model: str) -> list[TokenLogprob | None]:
        """Per prompt token, its log-probability and ``top`` alternatives (vLLM's ``prompt_logprobs``)."""
        resp = await self._http.post("/completions", json={"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0,
                                                           "prompt_logprobs": max(top, 1)})
        if resp.status_code >= 400:
            raise UpstreamError(f"completions (prompt_logprobs): {resp.status_code} {resp.text[:500]}")
        entries = resp.json()["choices"][0]["prompt_logprobs"]
        out: list[TokenLogprob | None] = [None]
        for token, entry in zip(prompt[1:], entries[1:], strict=True):  # keyed by token id
            ranked = sorted(((int(k), v["logprob"]) for k, v in entry.items()), key=lambda x: -x[1])[:top]
            out.append(self._entry(token, entry[str(token)]["logprob"], ranked))
        return out

    def _entry(self, token: int, logprob: float, ranked: list[tuple[int, float]]) -> TokenLogprob:
        """``token``'s entry with its ``ranked`` alternatives (``(token id, logprob)``, most likely first)."""
        text, raw = self._texts.of(token)
        top = []
        for alternative, alternative_logprob in ranked:
            alternative_text, alternative_raw = self._texts.of(alternative)
            top.append((alternative_text, alternative_logprob, alternative_raw))
        return TokenLogprob(token=text, logprob=logprob, bytes=raw, top=top)

    def _token_logprobs(self, logprobs: dict[str, Any] | None, top: int | None) -> list[TokenLogprob]:
        """A completions ``logprobs`` object (tokens as ``token_id:N``, token_logprobs, top_logprobs) as
        :class:`TokenLogprob` entries, the end-of-turn tokens left out (they have no text in the answer)."""
        if not logprobs or top is None:
            return []
        out = []
        for token, value, alternatives in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs.get("top_logprobs") or [], strict=False):
            token_id = _token_id(token)
            if token_id in self._eos:
                continue
            ranked = sorted(((_token_id(t), lp) for t, lp in (alternatives or {}).items()), key=lambda x: -x[1])[:top]
            out.append(self._entry(token_id, value, ranked))
        return out


class _ChoiceState:
    def __init__(self) -> None:
        self.text = ""
        self.tokens = 0
        self.logprobs: list[TokenLogprob] = []
        self.finish_reason: Any = None


def _token_id(token: str) -> int:
    """``token_id:N`` (vLLM's ``return_tokens_as_token_ids``) as ``N``."""
    return int(token.removeprefix("token_id:"))


async def _next_or_stop(lines: Any, stop: asyncio.Event) -> str | None:
    """The next line of the stream, or ``None`` once ``stop`` is set (the caller then closes the stream)."""
    next_line = asyncio.ensure_future(anext(lines))
    stopped = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({next_line, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if next_line in done:
        stopped.cancel()
        try:
            return next_line.result()
        except StopAsyncIteration:
            return None
    next_line.cancel()
    return None


@register_engine("upstream")
def load(name: str, model_dir: Path, settings: InferenceSettings) -> UpstreamEngine:
    """The upstream engine for one base model: the server at ``settings.upstream_urls[name]``, else at
    ``settings.upstream_url``, serves it under ``name`` (vLLM's ``--served-model-name``)."""
    return UpstreamEngine(name, model_dir, settings.upstream_urls.get(name, settings.upstream_url), api_key=settings.upstream_api_key,
                          max_loaded_adapters=settings.max_loaded_adapters)

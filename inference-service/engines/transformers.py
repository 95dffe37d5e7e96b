"""The transformers engine: batched generation on the base model, a LoRA adapter or a full-weight checkpoint, with every
feature of the seam.

:class:`TransformersEngine` holds one float32 copy of the base model and the checkpoints loaded on it
(:mod:`.adapters`: up to ``max_loaded_adapters`` PEFT LoRA adapters and ``max_loaded_full_checkpoints`` full-weight
checkpoints, least recently used unloaded first). Concurrent requests are micro-batched (:mod:`.batching`: a window
of requests split by model), and each group runs as one ``model.generate`` call per ``max_batch_size`` rows
on one worker thread (:mod:`.decoding`: per-row penalties, bias, JSON schemas (:mod:`.grammar`), temperature, top-p,
stop strings, streaming), the same code whichever model it runs on; log-probabilities are :mod:`.logprobs`'. A request
that cannot be prepared (a JSON schema xgrammar refuses) fails alone; a checkpoint that cannot be loaded fails the
requests for it alone.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from inference_service.chat import ChatRenderer, end_of_turn_ids
from inference_service.engines import register_engine
from inference_service.engines.adapters import LoadedModels
from inference_service.engines.base import Choice, Feature, GenerationRequest, GenerationResult
from inference_service.engines.batching import MicroBatcher, Pending
from inference_service.engines.decoding import Detokenizer, Row, generate_rows
from inference_service.engines.grammar import JsonSchemas
from inference_service.engines.logprobs import TokenLogprobs

from services.common.llms import cpu_threads

if TYPE_CHECKING:
    from inference_service.settings import InferenceSettings

logger = logging.getLogger(__name__)


class TransformersEngine(MicroBatcher):
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
        super().__init__(max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, max_window_ms=max_window_ms)
        torch.set_num_threads(cpu_threads())
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.renderer = ChatRenderer(self.tokenizer)
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self._context_tokens = int(model.config.max_position_embeddings)
        self._vocab = int(model.config.vocab_size)
        self._eos: set[int] = set(end_of_turn_ids(model_dir, self.tokenizer))
        self._pad: int = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.models = LoadedModels(model, max_loaded_adapters=max_loaded_adapters, max_loaded_full_checkpoints=max_loaded_full_checkpoints)
        self.logprobs = TokenLogprobs(self.tokenizer)
        self._schemas = JsonSchemas(self.tokenizer, self._vocab, self._eos)
        self._lock = threading.Lock()

    @property
    def context_tokens(self) -> int:
        """The model's context window in tokens (prompt + completion)."""
        return self._context_tokens

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """Token ids of the request's prompt (:meth:`~inference_service.chat.ChatRenderer.prompt_ids`); callable while generating."""
        return self.renderer.prompt_ids(request, self._vocab)

    def check_schema(self, schema: dict[str, Any]) -> None:
        """:class:`~inference_service.engines.base.SchemaNotServed` unless xgrammar compiles ``schema``."""
        self._schemas.check(schema)

    # ------------------------------------------------------------------ generation (worker thread)

    def _generate(self, group: list[Pending]) -> None:
        """Answer ``group`` (one model: the base, an adapter or a full checkpoint) in runs of at most
        ``max_batch_size`` rows; every request's generation is finished or failed."""
        try:
            with self._lock, self.models.serving(group[0].adapter) as model:
                rows = self._prepare(group)
                for start in range(0, len(rows), self.max_batch_size):
                    generate_rows(model, rows[start : start + self.max_batch_size], pad=self._pad, eos=self._eos, vocab=self._vocab,
                                  logprobs=self.logprobs)
                prompt_logprobs = {id(p): self.logprobs.of_prompt(model, p.prompt, p.request.prompt_logprobs)
                                   for p in group if p.request.prompt_logprobs is not None}
        except Exception as error:  # noqa: BLE001 - the error belongs to this group's callers
            logger.exception("generation failed for a group of %d requests", len(group))
            for p in group:
                p.generation.fail(error)
            return
        by_generation: dict[int, list[Row]] = defaultdict(list)
        for row in rows:
            by_generation[id(row.generation)].append(row)
        for p in group:
            with_prompt = p.request.prompt_logprobs is not None
            p.generation.finish(GenerationResult(
                choices=[self._choice(row) for row in by_generation[id(p.generation)]], prompt_tokens=len(p.prompt),
                prompt_text=self.tokenizer.decode(p.prompt) if with_prompt else None, prompt_logprobs=prompt_logprobs.get(id(p)),
            ))

    def _prepare(self, group: list[Pending]) -> list[Row]:
        """The rows of ``group``'s requests; a request that cannot be prepared fails alone and leaves ``group``."""
        rows = []
        for p in list(group):
            try:
                rows.extend(self._rows(p))
            except Exception as error:  # noqa: BLE001 - this request fails alone; the rest of the batch runs
                logger.exception("a request of the batch could not be prepared")
                p.generation.fail(error)
                group.remove(p)
        return rows

    def _rows(self, pending: Pending) -> list[Row]:
        """One row per choice, each with only the per-row state its request needs."""
        request = pending.request
        room = self.context_tokens - len(pending.prompt)
        limit = room if request.max_tokens is None else min(request.max_tokens, room)
        rows = []
        for index in range(request.n):
            row = Row(request, pending.generation, index, pending.prompt, max(limit, 0))
            if request.stream or request.stop or request.json_schema is not None:
                row.detok = Detokenizer(self.tokenizer)
            if request.json_schema is not None:
                row.matcher = self._schemas.matcher(request.json_schema)
            if request.presence_penalty or request.frequency_penalty:
                row.counts = torch.zeros(self._vocab)
            rows.append(row)
        return rows

    def _choice(self, row: Row) -> Choice:
        """The finished row as the seam's choice (a row decoded without a detokenizer is decoded whole here)."""
        if row.detok is None:
            row.text = self.tokenizer.decode([t for t in row.tokens if t not in self._eos], skip_special_tokens=True)
        return Choice(text=row.text, completion_tokens=len(row.tokens), finish_reason=row.finish_reason or "stop",
                      logprobs=row.logprobs if row.request.logprobs is not None else None)


@register_engine("transformers")
def load(name: str, model_dir: Path, settings: InferenceSettings) -> TransformersEngine:
    """The transformers engine for one base model."""
    return TransformersEngine(model_dir, max_batch_size=settings.max_batch_size, max_loaded_adapters=settings.max_loaded_adapters,
                              max_loaded_full_checkpoints=settings.max_loaded_full_checkpoints)

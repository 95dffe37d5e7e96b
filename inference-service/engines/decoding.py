"""One ``model.generate`` call of the transformers engine over rows (choices) of different requests, controlled per row.

:func:`generate_rows` left-pads the prompts into one ``[batch, longest_prompt]`` input and runs ``generate`` with
:class:`RowControl` as its logits processor, streamer and stopping criterion, the same code whichever model it runs on:
the logits processor reads each row's raw log-probabilities (``logprobs``), then applies its penalties,
``logit_bias``, JSON-schema mask (:mod:`.grammar`), temperature and top-p (``generate`` itself samples at temperature
1 or takes the argmax); the streamer takes each new token, detokenizes incrementally, finds stop strings and pushes
deltas; the stopping criterion ends rows that are done or cancelled.

Invariants: a row ends at an end-of-turn token (which has no text and no log-probability entry), before the first stop
string, at the end of its JSON schema, at its limit (``length``) or when its request is cancelled (``stop``); a
streamed row's deltas hold back a tail that may be the start of a stop string, and its last delta carries its finish
reason. Greedy decoding (``temperature == 0``) is deterministic for a given batch; float rounding differs slightly
between batch shapes, so in rare near-ties the same prompt may decode differently in a different batch.

Sampling draws each row's token from its own ``torch.Generator`` (:func:`row_generator`): seeded from the request's
``seed`` (choice ``i`` from ``seed + i``, vLLM's rule), else from the operating system's entropy; ``generate`` then
takes the one token left (greedy). No request touches torch's global generator, so a seeded request cannot make
another's samples predictable, whichever run sent it.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from inference_service.engines.base import Delta, Generation, GenerationRequest, TokenLogprob
from inference_service.engines.logprobs import TokenLogprobs
from transformers import LogitsProcessor, StoppingCriteria

logger = logging.getLogger(__name__)


class Detokenizer:
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
class Row:
    """One choice being generated: its request, its place in the answer, and what it produced so far. ``detok``
    (streamed, stop strings or a schema: text as it comes), ``matcher`` (a schema) and ``counts`` (penalties) are
    set only for the rows that need them."""

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
    detok: Detokenizer | None = None
    matcher: Any = None
    counts: torch.Tensor | None = None  # occurrences of each token id so far (penalties)
    step_logprobs: torch.Tensor | None = None  # this step's raw log-probabilities (logprobs)
    generator: torch.Generator | None = None  # a sampled row's own random stream (row_generator)

    def __post_init__(self) -> None:
        if self.request.temperature > 0 and self.generator is None:
            self.generator = row_generator(self.request.seed, self.index)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


def row_generator(seed: int | None, index: int) -> torch.Generator:
    """The random stream of choice ``index`` of a sampled request: from ``seed + index`` (vLLM's rule for ``n`` choices
    of a seeded request), else from 64 bits of the operating system's entropy. CPU generator: the draws are made on
    the CPU, where the probabilities are moved (one row of ``vocab`` floats a step)."""
    generator = torch.Generator()
    generator.manual_seed(seed + index if seed is not None else int.from_bytes(os.urandom(8), "little"))
    return generator


def generate_rows(model: Any, rows: list[Row], *, pad: int, eos: set[int], vocab: int, logprobs: TokenLogprobs) -> None:
    """One ``model.generate`` call over ``rows`` (left-padded ``[batch, longest_prompt]``), controlled per row; a row
    with no room left (``limit`` 0) ends at once with ``length``."""
    from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

    live = [r for r in rows if r.limit > 0]
    for row in rows:
        if row.limit <= 0:
            row.finish_reason = "length"
    if not live:
        return
    width = max(len(r.prompt) for r in live)
    input_ids = torch.full((len(live), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(live), width), dtype=torch.long)
    for i, row in enumerate(live):
        input_ids[i, width - len(row.prompt) :] = torch.tensor(row.prompt)
        attention_mask[i, width - len(row.prompt) :] = 1
    control = RowControl(live, eos=eos, vocab=vocab, logprobs=logprobs)
    config = GenerationConfig(max_new_tokens=max(r.limit for r in live), do_sample=False, temperature=None, top_p=None, top_k=None,
                              eos_token_id=sorted(eos), pad_token_id=pad)  # greedy over what the processor left: each sampled row's own draw
    started = time.perf_counter()
    with torch.inference_mode():
        model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config, streamer=control,
                       logits_processor=LogitsProcessorList([_Processor(control)]), stopping_criteria=StoppingCriteriaList([_Stopping(control)]))
    for row in live:
        if not row.done:
            row.finish_reason = "length"
        control.push(row)
    seconds = time.perf_counter() - started
    generated = sum(len(r.tokens) for r in live)
    logger.info("generated %d new tokens for %d rows (prompts up to %d tokens) in %.2f s: %.1f tokens/s",
                generated, len(live), width, seconds, generated / seconds if seconds else 0.0)


class RowControl:
    """Per-row control of one ``generate`` call: its logits processor (:meth:`process`), streamer (:meth:`put`,
    :meth:`end`) and stopping criterion (:meth:`stopping`)."""

    def __init__(self, rows: list[Row], *, eos: set[int], vocab: int, logprobs: TokenLogprobs) -> None:
        self.rows = rows
        self._eos = eos
        self._logprobs = logprobs
        self._prompt_seen = False
        self._bitmask: torch.Tensor | None = None
        self.sampling = any(r.request.temperature > 0 for r in rows)
        self._sampled = [i for i, r in enumerate(rows) if r.request.temperature > 0]
        self._temperatures = torch.tensor([[rows[i].request.temperature] for i in self._sampled])
        self._top_p = [i for i in self._sampled if rows[i].request.top_p < 1.0]
        self._special = [i for i, r in enumerate(rows) if r.request.logprobs is not None or r.counts is not None or r.request.logit_bias]
        if any(r.matcher is not None for r in rows):
            import xgrammar

            self._bitmask = xgrammar.allocate_token_bitmask(len(rows), vocab)

    def process(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Logits processor: ``scores`` ``[batch, vocab]`` are the raw logits of this step. Rows that need nothing
        cost nothing (a greedy batch with no options is returned as is, for ``generate``'s argmax)."""
        scores = scores.float()
        self._adjust(scores)
        self._mask(scores)
        if self.sampling:
            self._sample_per_row(scores)
        return scores

    def _adjust(self, scores: torch.Tensor) -> None:
        """Per row that asks: read the raw log-probabilities, then subtract penalties and add the logit bias."""
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

    def _mask(self, scores: torch.Tensor) -> None:
        """Mask the tokens each schema-bound row's grammar does not allow next."""
        if self._bitmask is None:
            return
        import xgrammar

        indices = [i for i, row in enumerate(self.rows) if row.matcher is not None and not row.done]
        for i in indices:
            self.rows[i].matcher.fill_next_token_bitmask(self._bitmask, i)
        if indices:
            xgrammar.apply_token_bitmask_inplace(scores, self._bitmask, indices=indices)

    def _sample_per_row(self, scores: torch.Tensor) -> None:
        """In a sampling batch, each sampled row's token is drawn here, from its temperature and top-p, with its own
        generator (:func:`row_generator`), and left as the row's only token, so ``generate``'s argmax takes it."""
        if not self._sampled:
            return
        sampled = torch.tensor(self._sampled)
        scores[sampled] /= self._temperatures
        for i in self._top_p:
            ordered, order = torch.sort(scores[i], descending=True)
            probs = torch.softmax(ordered, dim=-1)
            cut = probs.cumsum(dim=-1) - probs >= self.rows[i].request.top_p  # keep the smallest set reaching top_p
            scores[i, order[cut]] = float("-inf")
        for i in self._sampled:
            row = self.rows[i]
            if row.done:
                continue
            token = torch.multinomial(torch.softmax(scores[i], dim=-1), 1, generator=row.generator)
            scores[i] = float("-inf")
            scores[i, token] = 0.0

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

    def _take(self, row: Row, token: int) -> None:
        """Append one generated token to ``row``: logprob, grammar, end of turn, stop strings, limit, delta."""
        request = row.request
        row.tokens.append(token)
        if request.logprobs is not None and row.step_logprobs is not None and token not in self._eos:  # the end of turn has no text
            entry = self._logprobs.entry(row.step_logprobs, token, request.logprobs)
            row.logprobs.append(entry)
            row.unsent_logprobs.append(entry)
        if row.counts is not None and token < len(row.counts):
            row.counts[token] += 1
        if row.matcher is not None and not row.matcher.accept_token(token):
            row.finish_reason = "stop"  # cannot happen under the mask; end the row rather than emit invalid JSON
        if token in self._eos:
            row.finish_reason = "stop"
        elif row.detok is not None:
            row.text += row.detok.add(token)
            if request.stop and _cut_at_stop(row):
                row.finish_reason = "stop"
            if row.matcher is not None and row.matcher.is_terminated():
                row.finish_reason = "stop"
        if not row.done and len(row.tokens) >= row.limit:
            row.finish_reason = "length"
        self.push(row)

    @staticmethod
    def push(row: Row) -> None:
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


def _cut_at_stop(row: Row) -> bool:
    """Cut ``row.text`` before the first stop string in it, if any (only its tail can hold a new one)."""
    stops = [s for s in row.request.stop or [] if s]
    longest = max((len(s) for s in stops), default=0)
    start = max(0, row.sent - longest)
    found = [i for s in stops if (i := row.text.find(s, start)) >= 0]
    if found:
        row.text = row.text[: min(found)]
        return True
    return False


class _Processor(LogitsProcessor):
    def __init__(self, control: RowControl) -> None:
        self.control = control

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return self.control.process(input_ids, scores)


class _Stopping(StoppingCriteria):
    def __init__(self, control: RowControl) -> None:
        self.control = control

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        return self.control.stopping(input_ids, scores)

"""Log-probabilities of a batch's supervised labels, the one quantity every method's loss reads (:func:`token_logprobs`).

What makes it fast, with results equal to a plain forward pass (up to float rounding):

- the output layer runs only at supervised positions: the transformer body yields hidden states ``[batch, seq,
  hidden]``, the positions whose next-token label is not ``-100`` are gathered into ``[n_supervised, hidden]``, and
  only those meet ``lm_head``. On CUDA the projection and the log-softmax run as TRL's chunked kernel
  (``trl.kernels.ChunkedLogProbFunction``), which never materializes the ``[n, vocab]`` logits; on CPU, where that
  kernel's torch fallback measured 2-4x slower, as one matmul and a cross-entropy;
- the prompt prefix every row of a batch shares (chat template, system prompt, fixed instructions) runs through
  the transformer once, not once per row (measured 1.5x faster steps on short arithmetic items); gradients flow
  through the shared key/value cache.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from trainer_service.examples import IGNORE_INDEX

MIN_SHARED_PREFIX = 8
"""A batch's common prompt prefix is computed once (see :func:`_hidden_at_supervised`) from this many tokens on."""

LOGPROB_VOCAB_CHUNK = 32768
"""Vocabulary tile of the chunked log-probability kernel on CUDA (TRL's default)."""


def _shared_prefix_len(input_ids: torch.Tensor, labels: torch.Tensor) -> int:
    """Length of the token prefix that every row of ``input_ids`` ``[batch, seq]`` shares and that predicts no
    label, i.e. the largest ``P`` with equal ``input_ids[:, :P]`` across rows and ``labels[:, 1:P+1]`` all
    ignored. Returns 0 when the batch has no supervised token."""
    supervised_positions = (labels != IGNORE_INDEX).any(0).nonzero()
    if len(supervised_positions) == 0:
        return 0
    same = int((input_ids == input_ids[:1]).all(0).long().cumprod(0).sum())
    return min(same, int(supervised_positions[0]) - 1)


def _hidden_at_supervised(causal_lm: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          labels: torch.Tensor, shared_prefix: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(hidden [n, hidden], targets [n], rows [n])`` at the ``n`` supervised positions of a right-padded batch
    (all inputs ``[batch, seq]``): ``hidden[b, t]`` predicts ``labels[b, t + 1]``; ``rows`` is each position's row.

    When the rows share a prompt prefix of ``P >= MIN_SHARED_PREFIX`` tokens, the prefix goes through the
    transformer once with batch 1, its key/value cache is repeated to the batch, and only the ``seq - P``
    remaining positions run per row; gradients flow through the shared cache, so results and gradients equal
    those of the plain pass (up to float rounding). Not with ``shared_prefix`` false: FSDP2's sharded layers gather
    their weights for one backward per forward, and the prefix's pass would be a second forward of each layer.
    """
    from transformers import DynamicCache

    body = causal_lm.model
    prefix_len = _shared_prefix_len(input_ids, labels) if shared_prefix else 0
    if prefix_len >= MIN_SHARED_PREFIX:
        cache = DynamicCache(config=causal_lm.config)
        body(input_ids=input_ids[:1, :prefix_len], cache=cache, use_cache=True)
        cache.batch_repeat_interleave(input_ids.shape[0])
        hidden = body(input_ids=input_ids[:, prefix_len:], attention_mask=attention_mask, cache=cache, use_cache=True).last_hidden_state
    else:
        prefix_len = 0
        hidden = body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    targets = labels[:, prefix_len + 1 :]
    supervised = targets != IGNORE_INDEX
    rows = supervised.nonzero()[:, 0]
    return hidden[:, :-1][supervised], targets[supervised], rows


def token_logprobs(causal_lm: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   labels: torch.Tensor, shared_prefix: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs [n], rows [n])``: the model's log-probability (float32) of each supervised label of a
    right-padded batch (inputs ``[batch, seq]``), in row-major order, and the row each belongs to.

    ``lm_head`` meets only the supervised positions. On CUDA the projection and log-softmax run in tiles (TRL's
    ``ChunkedLogProbFunction``: no ``[n, vocab]`` logits in memory, gradients accumulated in float32); elsewhere
    as one matmul and ``log_softmax``. The SFT loss is ``-logprobs.mean()``, a sequence's log-likelihood
    ``logprobs`` summed over its row.
    """
    hidden, targets, rows = _hidden_at_supervised(causal_lm, input_ids, attention_mask, labels, shared_prefix)
    head = causal_lm.get_output_embeddings()
    if hidden.shape[0] == 0:
        return head(hidden).float().sum(-1), rows  # an empty result still connected to the graph
    if hidden.is_cuda:
        from trl.kernels import ChunkedLogProbFunction

        logprobs = ChunkedLogProbFunction.apply(hidden, head.weight, head.bias, targets, 1.0, LOGPROB_VOCAB_CHUNK, None, 1.0, ())[0]
        return logprobs, rows
    return -F.cross_entropy(head(hidden).float(), targets, reduction="none"), rows


def sequence_logprobs(logprobs: torch.Tensor, rows: torch.Tensor, batch: int) -> torch.Tensor:
    """``[batch]``: each row's summed log-probability of its supervised tokens (the log-likelihood of its answer)."""
    return torch.zeros(batch, dtype=logprobs.dtype, device=logprobs.device).index_add(0, rows, logprobs)

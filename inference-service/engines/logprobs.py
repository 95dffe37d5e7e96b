"""Log-probabilities as the transformers engine reports them (:class:`~inference_service.engines.base.TokenLogprob`):
a token's text and UTF-8 bytes, its natural-log probability, its ``top`` most likely alternatives (most likely first),
and a prompt's per-token log-probabilities.

Invariants: the values are the model's raw ones (a ``log_softmax`` of its logits, before penalties, bias, temperature and
top-p); a token's bytes are its own and its text is theirs (``bytes:\\xNN…`` for a token holding part of a character:
:mod:`.tokens`), cached per token.
"""

from __future__ import annotations

from typing import Any

import torch
from inference_service.engines.base import TokenLogprob
from inference_service.engines.tokens import TokenTexts


class TokenLogprobs:
    """Log-probability entries of one tokenizer's tokens."""

    def __init__(self, tokenizer: Any) -> None:
        self._texts = TokenTexts(tokenizer)

    def text(self, token: int) -> tuple[str, list[int]]:
        """A token's text and its own bytes (:class:`~inference_service.engines.tokens.TokenTexts`)."""
        return self._texts.of(token)

    def entry(self, logprobs: torch.Tensor, token: int, top: int) -> TokenLogprob:
        """``token``'s entry of a log-probability vector, with the ``top`` most likely alternatives."""
        text, raw = self.text(token)
        alternatives = []
        if top:
            values, ids = torch.topk(logprobs, top)
            alternatives = [(*self.text(int(i)), float(v)) for v, i in zip(values, ids, strict=True)]
        return TokenLogprob(token=text, logprob=float(logprobs[token]), bytes=raw, top=[(t, lp, b) for t, b, lp in alternatives])

    def of_prompt(self, model: Any, prompt: list[int], top: int) -> list[TokenLogprob | None]:
        """Per prompt token, its log-probability given the tokens before it (the first has none), and ``top``
        alternatives: one forward pass of ``model``."""
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        return [None, *(self.entry(logprobs[i - 1], prompt[i], top) for i in range(1, len(prompt)))]

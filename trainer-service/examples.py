"""Tokenized examples: an :class:`Example` is one sequence with its labels, supervised on the answer only; rows become
examples by the base model's chat template (:func:`tokenize_examples`), and a batch of them becomes right-padded
tensors (:func:`collate`).

Invariants: an example's prompt tokens are exactly those the model sees at inference after ``add_generation_prompt``;
no example is longer than ``max_seq_len``; a row whose answer the cut removes entirely is refused
(:class:`UntrainableRows`), never trained with loss 0 and billed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trainer_service.schemas import SFTRow

IGNORE_INDEX = -100
"""Label of a position that carries no loss (prompt, padding), as in transformers and PyTorch."""


@dataclass
class Example:
    """One tokenized sequence: ``input_ids`` and ``labels`` have equal length (at most ``max_seq_len``).

    ``labels[t]`` is ``input_ids[t]`` on supervised (answer) tokens and ``IGNORE_INDEX`` elsewhere; the model
    is trained to predict ``labels[t]`` from tokens ``0..t-1``.
    """

    input_ids: list[int]
    labels: list[int]

    @property
    def num_supervised(self) -> int:
        """Number of tokens that carry loss (position 0 never does: no token comes before it to predict it from)."""
        return sum(label != IGNORE_INDEX for label in self.labels[1:])


def _render_pair(tokenizer: Any, prompt: list[dict[str, str]], answer: dict[str, str]) -> tuple[str, str]:
    """Chat-template text of ``prompt`` plus the assistant header, and of the answer turn that follows it."""
    prefix = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template([*prompt, answer], tokenize=False)
    if not full.startswith(prefix):
        raise ValueError("the chat template does not render the prompt as a prefix of the conversation")
    return prefix, full[len(prefix) :]


NO_ANSWER_LEFT = "have no answer token left after truncation at recipe.max_seq_len={max_seq_len} tokens (the prompt alone fills it)"
IDENTICAL_PAIRS = ("have the same tokens as chosen and as rejected answer after truncation at recipe.max_seq_len={max_seq_len} tokens "
                   "(their answers differ only past it, or not at all), so the pair orders nothing")


class UntrainableRows(ValueError):
    """Rows that would train on nothing while their tokens are billed: an answer cut away entirely at ``max_seq_len``
    (its prompt fills it: loss 0), or a preference pair whose two answers are the same tokens once cut (DPO's loss is
    then ln 2 whatever the weights, with no gradient that tells them apart). ``indices``: their 0-based positions in
    the rows given; ``why``: what they have, a sentence ending after "N row(s) …" (:data:`NO_ANSWER_LEFT`,
    :data:`IDENTICAL_PAIRS`)."""

    def __init__(self, indices: list[int], max_seq_len: int, why: str = NO_ANSWER_LEFT) -> None:
        self.indices, self.max_seq_len, self.why = indices, max_seq_len, why.format(max_seq_len=max_seq_len)
        super().__init__(f"{len(indices)} row(s) {self.why}")


def tokenize_turns(tokenizer: Any, prompt: list[dict[str, str]], answer: dict[str, str], max_seq_len: int) -> Example:
    """One conversation as an :class:`Example` with loss on the answer only.

    Prompt and answer are rendered with the tokenizer's chat template and tokenized separately, so the prompt
    tokens are exactly those the model sees at inference after ``add_generation_prompt``; the answer's tokens
    (its text and the template's end-of-turn tokens, ``<|im_end|>`` and ``\\n`` for ChatML) are supervised,
    everything else is ``IGNORE_INDEX``. Cut to ``max_seq_len`` tokens. ``ValueError`` if the chat template does
    not render the prompt as a prefix of the conversation.
    """
    prefix, answer_text = _render_pair(tokenizer, prompt, answer)
    prompt_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer_text, add_special_tokens=False)["input_ids"]
    return Example(input_ids=(prompt_ids + answer_ids)[:max_seq_len], labels=([IGNORE_INDEX] * len(prompt_ids) + answer_ids)[:max_seq_len])


def tokenize_examples(tokenizer: Any, rows: Sequence[SFTRow], max_seq_len: int) -> list[Example]:
    """Tokenize SFT rows (``sft_turns``, see ``trainer_service.schemas``: the last message of a ``messages`` row is
    the answer and the earlier ones the prompt; a ``prompt_completion`` row is one user message and the answer)
    with :func:`tokenize_turns`.

    Raises :class:`UntrainableRows` if a row has no supervised token left after the cut.
    """
    examples = [tokenize_turns(tokenizer, *row.sft_turns(), max_seq_len) for row in rows]
    if empty := [index for index, example in enumerate(examples) if example.num_supervised == 0]:
        raise UntrainableRows(empty, max_seq_len)
    return examples


def collate(examples: Sequence[Example], pad_token_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad to the longest example: ``input_ids``, ``attention_mask``, ``labels``, each ``[batch, seq]`` on ``device``."""
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        input_ids[row, :n] = torch.tensor(example.input_ids)
        attention_mask[row, :n] = 1
        labels[row, :n] = torch.tensor(example.labels)
    return input_ids.to(device, non_blocking=True), attention_mask.to(device, non_blocking=True), labels.to(device, non_blocking=True)

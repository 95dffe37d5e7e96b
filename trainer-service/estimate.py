"""What a job will cost before it runs: its rows tokenized as training will, the tokens it may train, and
the ledger hold that reserves their price on the run's budget."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from trainer_service.datasets import read_dataset
from trainer_service.models import Dataset
from trainer_service.schemas import SFTRow
from trainer_service.service import Trainer

from services.common.auth import RunContext
from services.common.contracts import Recipe
from services.common.errors import Conflict, Unprocessable
from services.common.llms import base_model_dir
from services.ledger.schemas import Hold, HoldCreate, HoldStatus, UsageItem, UsageKind

if TYPE_CHECKING:
    from trainer_service.training import Example


def training_examples(trainer: Trainer, base_model: str, datasets: list[Dataset], recipe: Recipe) -> list[Example]:
    """The datasets' rows tokenized as training will (``training.tokenize_examples``), with ``base_model``'s
    tokenizer (loaded once per process).

    Raises ``Unprocessable``: ``field="datasets"`` for a dataset whose format the method does not train;
    ``field="datasets"`` with ``rows`` (how many), ``dataset`` and ``line`` (the first of them) when rows have
    no supervised token left after truncation at ``recipe.max_seq_len``; a row's ``field`` and ``line`` for a
    stored row that fails validation.
    """
    from trainer_service.training import NoSupervisedTokens, tokenize_examples

    rows: list[SFTRow] = []
    where: list[tuple[str, int]] = []  # (dataset id, 1-based line) of each row
    for ds in datasets:
        parsed = read_dataset(ds)
        if parsed.format not in ("messages", "prompt_completion"):
            raise Unprocessable(f"dataset {ds.id} is {parsed.format}; sft needs messages or prompt_completion rows", field="datasets", dataset=ds.id)
        rows += parsed.rows  # type: ignore[arg-type]
        where += [(ds.id, line) for line in parsed.lines]
    try:
        return tokenize_examples(_tokenizer(base_model_dir(base_model, trainer.settings.models_dir)), rows, recipe.max_seq_len)
    except NoSupervisedTokens as exc:
        dataset_id, line = where[exc.indices[0]]
        raise Unprocessable(
            f"{len(exc.indices)} row(s) have no answer token left after truncation at recipe.max_seq_len={recipe.max_seq_len} tokens "
            f"(the prompt alone fills it), so they would train on nothing; the first is line {line} of dataset {dataset_id}. "
            "Shorten their prompts or raise max_seq_len.", field="datasets", rows=len(exc.indices), dataset=dataset_id, line=line) from None


@cache
def _tokenizer(model_dir: Path):  # noqa: ANN202
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def sft_config(recipe: Recipe):  # noqa: ANN201 - avoids importing torch in the API process at import time
    """The ``SFTConfig`` of a recipe (same field names)."""
    from trainer_service.training import SFTConfig

    fields = recipe.model_dump(exclude={"method", "adapter", "lr_scheduler"})
    return SFTConfig(**fields, lr_scheduler_type=recipe.lr_scheduler)


def estimate_tokens(trainer: Trainer, base_model: str, datasets: list[Dataset], recipe: Recipe) -> tuple[int, int]:
    """``(examples, tokens)``: how many examples the datasets make and at most how many tokens training them
    by ``recipe`` processes (``training.count_training_tokens``), the quantity a job's hold is priced on.
    Raises ``Unprocessable`` as :func:`training_examples`."""
    from trainer_service.training import count_training_tokens

    examples = training_examples(trainer, base_model, datasets, recipe)
    return len(examples), count_training_tokens(examples, sft_config(recipe))


def place_hold(trainer: Trainer, ctx: RunContext, job_id: str, base_model: str, tokens: int, idempotency_key: str | None) -> Hold:
    """Hold the price of ``tokens`` training tokens of ``base_model`` on the run's budget for job ``job_id``.

    The hold outlives the job's time limit (it expires only if orphaned). With ``idempotency_key`` the hold
    carries a key derived from it, so a retry after a lost answer finds the same hold; if that earlier attempt
    failed and released its hold, a new one is placed (up to 3 tries, then ``Conflict`` on ``Idempotency-Key``).
    Passes the ledger's 402 through.
    """
    request = f"(Idempotency-Key {idempotency_key})" if idempotency_key else job_id
    hold_key = f"hold:job:{hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]}" if idempotency_key else f"hold:{job_id}"
    for _ in range(3):
        hold = trainer.ledger.create_hold(HoldCreate(
            account_id=ctx.run_id, purpose=f"training job {request}",
            usage=[UsageItem(kind=UsageKind.training_tokens, quantity=tokens, model=base_model)],
            idempotency_key=hold_key, ttl_s=int(trainer.settings.train_time_limit_s) + 3600,
        ))
        # a retry with the same key gets the first attempt's hold back; if that attempt failed, it released it
        if not idempotency_key or trainer.ledger.get_hold(hold.hold_id).status == HoldStatus.open:
            return hold
        hold_key = f"{hold_key}:after:{hold.hold_id}"
    raise Conflict("could not place an open hold for this Idempotency-Key; retry with a new key", field="Idempotency-Key")


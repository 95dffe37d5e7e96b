"""What a job will cost before it runs: its rows turned into the method's examples as training will, the tokens
it may train, the memory it needs, and the ledger hold that reserves their price (or a merge's) on the run's budget."""

from __future__ import annotations

import hashlib
import json
import struct
import threading
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from trainer_service.datasets import read_dataset
from trainer_service.models import Dataset
from trainer_service.service import Trainer

from services.common.auth import RunContext
from services.common.contracts import Recipe
from services.common.errors import Conflict, Unprocessable
from services.common.llms import base_model_dir
from services.common.settings import ServiceSettings
from services.ledger.schemas import Hold, HoldCreate, HoldStatus, UsageItem

if TYPE_CHECKING:
    from trainer_service.config import TrainConfig
    from trainer_service.metrics import TokenCounts
    from trainer_service.steps import Method


def method_of(recipe: Recipe) -> Method:
    """The trainer's method for ``recipe.method``; ``Unprocessable`` on ``recipe.method`` if this trainer has none."""
    from trainer_service.methods import METHODS

    if recipe.method not in METHODS:
        raise Unprocessable(f"recipe.method {recipe.method!r} is not available in this deployment (supported: {', '.join(METHODS)})",
                            field="recipe.method")
    return METHODS[recipe.method]


@dataclass(frozen=True)
class TrainingRows:
    """A job's rows in training order and where each came from: ``(dataset id, 1-based line)``, or
    ``(TRAINING_POOL, 1-based position)`` for a GRPO job on the run's training pool."""

    rows: list[Any]
    where: list[tuple[str, int]]


TRAINING_POOL = "training_pool"


def dataset_rows(datasets: list[Dataset], recipe: Recipe) -> TrainingRows:
    """The datasets' rows, validated again (a dataset stored under older rules fails here). Raises ``Unprocessable``:
    ``field="datasets"`` (with ``dataset``) for a dataset whose format ``recipe.method`` does not train; a row's
    ``field`` and ``line`` for a stored row that fails validation."""
    method = method_of(recipe)
    rows: list[Any] = []
    where: list[tuple[str, int]] = []
    for ds in datasets:
        parsed = read_dataset(ds)
        if parsed.format not in method.spec.formats:
            raise Unprocessable(f"dataset {ds.id} is {parsed.format}; {method.name} trains on {' or '.join(sorted(method.spec.formats))} rows",
                                field="datasets", dataset=ds.id)
        rows += parsed.rows
        where += [(ds.id, line) for line in parsed.lines]
    return TrainingRows(rows, where)


def training_examples(trainer: Trainer, base_model: str, rows: TrainingRows, recipe: Recipe) -> list[Any]:
    """The rows as ``recipe.method``'s examples (tokenized as training will), with ``base_model``'s tokenizer (loaded
    once per process). Raises ``Unprocessable`` (``field="datasets"`` with ``rows``, how many, and ``dataset`` and
    ``line`` of the first) when rows would train on nothing after truncation at ``recipe.max_seq_len``
    (:class:`~trainer_service.examples.UntrainableRows`: an answer cut away, a preference pair made identical)."""
    from trainer_service.examples import UntrainableRows

    try:
        return method_of(recipe).examples(tokenizer(base_model, trainer.settings.models_dir), rows.rows, train_config(recipe))
    except UntrainableRows as exc:
        source, line = rows.where[exc.indices[0]]
        first = f"item {line} of the training pool" if source == TRAINING_POOL else f"line {line} of dataset {source}"
        raise Unprocessable(
            f"{len(exc.indices)} row(s) {exc.why}, so they would train on nothing; the first is {first}. "
            "Fix those rows, or raise max_seq_len.", field="datasets", rows=len(exc.indices), dataset=source, line=line) from None


def tokenizer(base_model: str, models_dir: Path) -> Any:
    """The tokenizer of ``base_model`` (prepared under ``models_dir``), loaded once per process."""
    return _tokenizer(base_model_dir(base_model, models_dir))


_FIRST_LOAD = threading.Lock()
"""Serializes tokenizer loads: transformers' lazily imported modules are not safe to import from two threads at once
(the soak test's agents, creating their first training jobs together on a fresh trainer, got a 500 ImportError)."""


@cache
def _tokenizer(model_dir: Path):  # noqa: ANN202
    return load_tokenizer(model_dir)


def load_tokenizer(model_dir: Path) -> Any:  # noqa: ANN401 - a transformers tokenizer
    """``AutoTokenizer.from_pretrained(model_dir)``, one load at a time in this process (:data:`_FIRST_LOAD`): every
    request thread of the trainer loads its tokenizers through here."""
    with _FIRST_LOAD:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_dir)


def train_config(recipe: Recipe) -> TrainConfig:
    """The loop's ``TrainConfig`` of a recipe (same field names; ``lr_scheduler`` is ``lr_scheduler_type``)."""
    from trainer_service.config import TrainConfig

    fields = recipe.model_dump(exclude={"method", "lr_scheduler", "devices"})
    return TrainConfig(**fields, lr_scheduler_type=recipe.lr_scheduler)


def job_devices(settings: ServiceSettings, recipe: Recipe, *, refuse: bool = True) -> int:
    """The devices a job of ``recipe`` trains on: ``recipe.devices`` where the deployment lets a recipe choose
    (``train_recipe_devices``), else ``train_devices``; never more than ``recipe.batch_size`` (each device takes at
    least one example a step) nor than ``train_devices``. ``Unprocessable`` on ``recipe.devices`` when ``refuse`` (at
    job creation) and the recipe sets it and may not, or asks for more than ``train_devices``. A worker reads it with
    ``refuse`` false: a job accepted once runs on what its worker has, whatever the operator changed since."""
    if recipe.devices is not None and refuse:
        if not settings.train_recipe_devices and recipe.devices != settings.train_devices:
            raise Unprocessable(f"this deployment's train workers choose the devices a job uses ({settings.train_devices}); leave "
                                "recipe.devices out", field="recipe.devices", train_devices=settings.train_devices)
        if recipe.devices > settings.train_devices:
            raise Unprocessable(f"recipe.devices is {recipe.devices} but a train worker of this deployment has {settings.train_devices}",
                                field="recipe.devices", train_devices=settings.train_devices)
    return max(1, min(recipe.devices or settings.train_devices, settings.train_devices, recipe.batch_size))


def estimate_tokens(trainer: Trainer, base_model: str, rows: TrainingRows, recipe: Recipe) -> tuple[int, TokenCounts, int]:
    """``(examples, tokens, longest)``: how many examples the rows make, at most how many tokens training them by
    ``recipe`` processes (``data_order.count_tokens``, the quantities a job's hold is priced on), and the longest
    batch row's tokens (what a padded row holds at most). Raises ``Unprocessable`` as :func:`training_examples`."""
    from trainer_service.data_order import count_tokens

    method, config = method_of(recipe), train_config(recipe)
    examples = training_examples(trainer, base_model, rows, recipe)
    longest = max(method.tokens(e).training for e in examples) // method.batch_rows(config)
    return len(examples), count_tokens(method, examples, config), longest


# --------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a job needs at its peak, by part: ``weights`` (the model as loaded, float32), ``gradients`` and
    ``optimizer`` (AdamW's two moments) of the trained parameters, ``reference`` (a frozen copy of the starting model
    for a method that reads the reference policy: full fine-tuning, or LoRA continuing a parent adapter), ``activations`` (Korthikanti et al. 2022, "Reducing
    Activation Recomputation in Large Transformer Models", §4.1: ``34·s·b·h`` bytes a layer in 16-bit, doubled for
    float32; their ``5·a·s²·b`` attention-score term is left out, SDPA's fused kernels never store the scores) and
    ``logits`` (float32 logits and their gradient at every position, an upper bound)."""

    weights: int
    gradients: int
    optimizer: int
    reference: int
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return sum(asdict(self).values())


def stored_parameters(folder: Path) -> int:
    """Parameters stored in a model or checkpoint folder's safetensors files (read from their headers; nothing is loaded)."""
    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        with file.open("rb") as handle:
            header = json.loads(handle.read(struct.unpack("<Q", handle.read(8))[0]))
        for name, tensor in header.items():
            if name != "__metadata__":
                count = 1
                for dim in tensor["shape"]:
                    count *= dim
                total += count
    return total


def lora_rank(folder: Path) -> int:
    """The rank ``r`` of the LoRA adapter in a checkpoint folder (its ``adapter_config.json``)."""
    return int(json.loads((folder / "adapter_config.json").read_text())["r"])


def estimate_memory(model_dir: Path, recipe: Recipe, longest: int | None = None, *, lora_parent: bool = False, devices: int = 1) -> MemoryEstimate:
    """The memory one device of a job of ``recipe`` on the model in ``model_dir`` needs (see :class:`MemoryEstimate`),
    its batch rows padded to ``longest`` tokens (default ``recipe.max_seq_len``), on ``devices`` devices.

    LoRA trains well under 1% of the parameters (counted as 1% here); full fine-tuning trains them all. On several
    devices each computes its share of the batch's rows; full fine-tuning's weights, gradients and optimizer state are
    sharded over them (FSDP2), a LoRA job's are replicated (DDP), and a reference copy is whole on each.
    """
    config = json.loads((model_dir / "config.json").read_text())
    params = stored_parameters(model_dir)
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    method = method_of(recipe)
    rows = -(-recipe.batch_size // devices) * method.batch_rows(train_config(recipe))
    seq = min(longest or recipe.max_seq_len, recipe.max_seq_len)
    trained = params if recipe.adapter == "full" else params // 100
    shards = devices if recipe.adapter == "full" else 1
    # a frozen copy for a method that reads the reference policy, unless LoRA over the base (its adapter switched off)
    reference = 4 * params if method.spec.needs_reference and (recipe.adapter == "full" or lora_parent) else 0
    activations = 2 * 34 * layers * seq * rows * hidden
    return MemoryEstimate(weights=4 * params // shards, gradients=4 * trained // shards, optimizer=8 * trained // shards, reference=reference,
                          activations=activations, logits=2 * 4 * rows * seq * config["vocab_size"])


def check_memory(trainer: Trainer, base_model: str, recipe: Recipe, longest: int | None = None, *, lora_parent: bool = False,
                 devices: int = 1) -> MemoryEstimate:
    """:func:`estimate_memory` (rows of ``longest`` tokens, on ``devices`` devices), against what a train worker's device may
    use (``train_memory_mb``, default 80% of RAM).

    Raises ``Unprocessable`` when the job does not fit: on ``recipe.adapter`` for full fine-tuning (LoRA would
    need far less), else on ``recipe.batch_size``; the problem carries ``estimated_mb`` and ``available_mb``.
    """
    estimate = estimate_memory(base_model_dir(base_model, trainer.settings.models_dir), recipe, longest, lora_parent=lora_parent, devices=devices)
    available_mb = trainer.settings.train_memory_mb or int(0.8 * psutil.virtual_memory().total / 2**20)
    needed_mb = -(-estimate.total // 2**20)
    if needed_mb > available_mb:
        parts = ", ".join(f"{name} {value / 2**20:,.0f}" for name, value in asdict(estimate).items() if value)
        field = "recipe.adapter" if recipe.adapter == "full" else "recipe.batch_size"
        advice = "use adapter 'lora', or a smaller batch_size or max_seq_len" if recipe.adapter == "full" else "use a smaller batch_size or max_seq_len"
        where = "a train worker of this deployment has" if devices == 1 else f"each of its {devices} devices has"
        raise Unprocessable(f"this job needs about {needed_mb:,} MiB ({parts} MiB) but {where} {available_mb:,} MiB; "
                            f"{advice}", field=field, estimated_mb=needed_mb, available_mb=available_mb)
    return estimate


def place_hold(trainer: Trainer, ctx: RunContext, job_id: str, usage: list[UsageItem], idempotency_key: str | None) -> Hold:
    """Hold the price of ``usage`` (a training job's tokens, a merge's parameters) on the run's budget for job ``job_id``.

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
            usage=usage, idempotency_key=hold_key, ttl_s=int(trainer.settings.train_time_limit_s) + 3600,
        ))
        # a retry with the same key gets the first attempt's hold back; if that attempt failed, it released it
        if not idempotency_key or trainer.ledger.get_hold(hold.hold_id).status == HoldStatus.open:
            return hold
        hold_key = f"{hold_key}:after:{hold.hold_id}"
    raise Conflict("could not place an open hold for this Idempotency-Key; retry with a new key", field="Idempotency-Key")

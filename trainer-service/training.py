"""The trainer's loop: one loop for every method (``trainer_service.methods``), LoRA or full weights, CPU or CUDA.

A method (:class:`~trainer_service.steps.Method`, one module each in ``trainer_service.methods``) turns dataset rows
into examples and a batch of examples into a loss; everything else is the same for every method, one module per
concern: the job's hyper-parameters (``config``: :class:`TrainConfig`), the device and precision (``devices``), the
tokenized examples and padded batches (``examples``), the log-probabilities a loss reads (``logprobs``), the model, its
adapter and reference policy (``policy``), the method seam (``steps``), the data order (``data_order``), checkpoints
and the training state (``checkpoints``), the token counts and per-step metrics the job's events and metering use
(``metrics``). This module runs them: :func:`train` (rows to examples, :func:`tokenized`, then the loop) and :func:`train_examples` (the
optimizer, the schedule, the steps, checkpoints and cancellation between steps).

Invariant, exact resume: a run resumed from its ``step-<N>`` checkpoint takes steps ``N+1 ...`` exactly as an
uninterrupted run would. The seed is set before the model is built (a fresh adapter's initialization), the weights
come from the checkpoint, the optimizer, schedule and RNGs from its training state (restored after the model is
built), and the data position from the step number alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from trainer_service.checkpoints import restore_training_state, save_checkpoint, training_state
from trainer_service.config import TrainConfig
from trainer_service.data_order import batch_indices
from trainer_service.devices import Device, select_device
from trainer_service.metrics import StepMetrics, TokenCounts, TrainResult
from trainer_service.policy import Policy, build_policy
from trainer_service.steps import Method

if TYPE_CHECKING:
    from trainer_service.parallel import Parallel

logger = logging.getLogger(__name__)


def tokenized(base_dir: Path, method: Method, rows: Sequence[Any], config: TrainConfig) -> tuple[list[Any], int]:
    """``(examples, pad_token_id)``: dataset ``rows`` as the method's examples with the base model's tokenizer
    (``method.examples``, cut to ``config.max_seq_len``). Raises :class:`~trainer_service.examples.UntrainableRows` if
    a row has nothing left to train on after the cut, and ``ValueError`` for no rows."""
    from transformers import AutoTokenizer

    if not rows:
        raise ValueError("no training rows")
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    return method.examples(tokenizer, rows, config), tokenizer.pad_token_id


def train(
    base_dir: Path,
    method: Method,
    rows: Sequence[Any],
    config: TrainConfig,
    out_dir: Path,
    **kwargs: Any,
) -> TrainResult:
    """Train by ``method`` on dataset ``rows`` in this process: the rows become the method's examples
    (:func:`tokenized`), then :func:`train_examples` runs the loop (``trainer_service.distributed.train`` runs it on
    several devices).

    Raises :class:`~trainer_service.examples.UntrainableRows` before any step if a row has nothing left to train on
    after the cut, and ``ValueError`` for no rows; ``kwargs`` and the rest as :func:`train_examples`.
    """
    examples, pad_token_id = tokenized(base_dir, method, rows, config)
    return train_examples(base_dir, method, examples, config, out_dir, pad_token_id=pad_token_id, **kwargs)


def train_examples(
    base_dir: Path,
    method: Method,
    examples: Sequence[Any],
    config: TrainConfig,
    out_dir: Path | None,
    *,
    pad_token_id: int,
    init_adapter: Path | None = None,
    init_weights: Path | None = None,
    resume: Path | None = None,
    on_start: Callable[[dict[str, Any]], None] | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
    on_checkpoint: Callable[[int, Path], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    parallel: Parallel | None = None,
) -> TrainResult:
    """The trainer's loop: ``config.max_steps`` optimizer steps of ``method`` over its ``examples``; checkpoints go
    to ``out_dir/step-<N>/`` (``out_dir`` ``None``: nothing is written, for benchmarks).

    ``base_dir`` is a prepared base model folder; ``init_adapter``/``init_weights`` a parent checkpoint (see
    :func:`~trainer_service.policy.load_model`). With ``resume`` (a checkpoint folder written by this function) the
    weights, optimizer, scheduler, RNG state and data position are restored, so steps ``N+1 ...`` are exactly those an
    uninterrupted run would have taken. ``on_start`` receives ``{"device", "precision", "method", "adapter",
    "trainable_parameters", "examples", "from_step", "compiled"}`` before the first step.

    Every ``config.checkpoint_every`` steps, at the end, and when ``should_stop()`` (checked between steps)
    returns true, the model and ``training_state.pt`` are written atomically to ``out_dir/step-<N>/``
    (:mod:`trainer_service.checkpoints`) and ``on_checkpoint(N, folder)`` is called. ``on_step`` receives
    :class:`~trainer_service.metrics.StepMetrics` after every step.

    With ``parallel`` this is one process of several (:mod:`trainer_service.distributed`): it takes its share of each
    step's batch, the gradient, loss, tokens and metrics are the whole batch's, every process stops at the same step and
    checkpoints are written once; the callbacks are the main process's alone.

    Raises ``ValueError`` for no examples or a ``resume`` state from a different seed, batch size or dataset size.
    """
    if not examples:
        raise ValueError("no training rows")
    device = select_device(config, parallel)
    torch.manual_seed(config.seed)
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)

    model, policy, compiled = build_policy(Path(base_dir), config, device, pad_token_id, needs_reference=method.spec.needs_reference,
                                           init_adapter=init_adapter, init_weights=init_weights, resume=resume, parallel=parallel)
    params, optimizer, scheduler = _optimizer(model, config, device)
    step, usage = (restore_training_state(Path(resume), config, len(examples), model, optimizer, scheduler, device, parallel) if resume is not None
                   else (0, TokenCounts()))

    devices = parallel.world if parallel is not None else 1
    start_info = {"device": device.name if devices == 1 else f"{devices} × {device.name}",
                  "precision": f"{'bf16 autocast' if device.autocast_dtype else 'float32'}",
                  "method": method.name, "adapter": config.adapter, "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
                  "examples": len(examples), "from_step": step, "compiled": compiled, "devices": devices,
                  "parallelism": parallel.strategy if parallel is not None else None}
    logger.info("training %s", start_info)
    if on_start is not None:
        on_start(start_info)

    checkpoints: list[Path] = []

    def checkpoint() -> Path | None:
        if out_dir is None:
            return None
        state = training_state(step, usage, config, len(examples), model, optimizer, scheduler, device, parallel)
        folder = save_checkpoint(model, out_dir, step, state, parallel)
        checkpoints.append(folder)
        if on_checkpoint is not None:
            on_checkpoint(step, folder)
        return folder

    last_checkpoint = Path(resume) if resume is not None else None
    loss_value, stopped = float("nan"), False
    started = time.monotonic()
    while step < config.max_steps:
        stop = should_stop is not None and should_stop()
        if stop if parallel is None else parallel.any(stop, device.torch_device):
            stopped = True
            break
        step_started = time.monotonic()
        batch = [examples[i] for i in batch_indices(step + 1, len(examples), config.batch_size, config.seed)]
        learning_rate = scheduler.get_last_lr()[0]
        loss_value, tokens, metrics = _optimizer_step(method, policy, batch if parallel is None else parallel.shard(batch), config, optimizer,
                                                      scheduler, params, parallel)
        step += 1
        usage += tokens
        now = time.monotonic()
        if on_step is not None:
            on_step(StepMetrics(step=step, max_steps=config.max_steps, loss=loss_value, learning_rate=learning_rate, tokens=tokens.training,
                                tokens_per_s=tokens.training / max(now - step_started, 1e-9), elapsed_s=now - started, extra=metrics,
                                prefill_tokens=tokens.prefill, decode_tokens=tokens.decode))
        if step % config.checkpoint_every == 0 or step == config.max_steps:
            last_checkpoint = checkpoint() or last_checkpoint

    if out_dir is not None and (last_checkpoint is None or (stopped and last_checkpoint.name != f"step-{step}")):
        last_checkpoint = checkpoint()
    return TrainResult(steps_done=step, final_loss=loss_value, stopped=stopped,
                       last_checkpoint=last_checkpoint, checkpoints=checkpoints, usage=usage)


def _optimizer(model: Any, config: TrainConfig, device: Device) -> tuple[list[torch.nn.Parameter], torch.optim.Optimizer, Any]:
    """``(params, optimizer, scheduler)``: the model's trainable parameters, AdamW over them (fused on CUDA) and the
    ``config.lr_scheduler_type`` schedule with ``config.warmup_steps`` of warm-up over ``config.max_steps``."""
    from transformers import get_scheduler

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay, fused=device.is_cuda)
    scheduler = get_scheduler(config.lr_scheduler_type, optimizer, num_warmup_steps=config.warmup_steps, num_training_steps=config.max_steps)
    return params, optimizer, scheduler


def _optimizer_step(method: Method, policy: Policy, batch: Sequence[Any], config: TrainConfig, optimizer: torch.optim.Optimizer,
                    scheduler: Any, params: list[torch.nn.Parameter], parallel: Parallel | None) -> tuple[float, TokenCounts, dict[str, float]]:
    """One optimizer step on ``batch`` (this process's share of it with ``parallel``): the method's loss, backward,
    gradients clipped to ``config.max_grad_norm``, AdamW and the schedule stepped. Returns the whole batch's loss as a
    number (reading it waits for the step's kernels, so the step's measured time is real), its tokens and the method's
    metrics.

    With ``parallel``, each process's loss is scaled by ``world × its weight / the batch's weight`` before backward
    (:attr:`~trainer_service.steps.StepLoss.weight`), so that DDP's and FSDP2's gradient average is the gradient of the
    whole batch's mean; the loss and metrics are the weighted means over processes and the tokens their sum (each
    counted once)."""
    optimizer.zero_grad(set_to_none=True)
    out = method.loss(policy, batch, config)
    tokens = out.tokens if out.tokens is not None else sum((method.tokens(e) for e in batch), TokenCounts())
    if parallel is None:
        out.loss.backward()
    else:
        device = policy.device.torch_device
        weight = float(out.weight if out.weight is not None else len(batch))
        (total,) = parallel.sum([weight], device)
        (out.loss * (weight * parallel.world / total)).backward()
    torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm, foreach=True)
    optimizer.step()
    scheduler.step()
    if parallel is None:
        return float(out.loss.detach()), tokens, out.metrics
    names = sorted(out.metrics)
    sums = parallel.sum([float(out.loss.detach()) * weight, tokens.training, tokens.prefill, tokens.decode,
                         *(out.metrics[name] * weight for name in names)], device)
    return sums[0] / total, TokenCounts(*(round(n) for n in sums[1:4])), {name: value / total for name, value in zip(names, sums[4:], strict=True)}

"""Checkpoint folders and the training state that resumes them.

A checkpoint is ``out_dir/step-<N>/``: the model (LoRA: ``adapter_model.safetensors`` + ``adapter_config.json``;
full: ``model.safetensors`` + ``config.json``) and ``training_state.pt`` (:data:`STATE_FILE`: the step, the tokens
so far, the data order's keys, optimizer, scheduler, RNGs and the config).

Invariants: writes are atomic (:func:`save_checkpoint` writes a hidden ``.step-<N>.tmp`` folder and renames it, so a
``step-<N>`` folder is complete or absent, never half-written, whatever kills the worker); resume is exact
(:func:`restore_training_state` puts back everything the next steps depend on besides the weights, which
``trainer_service.policy.load_model`` reads from the same folder, and refuses a state whose data order would differ).
"""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from trainer_service.config import TrainConfig
from trainer_service.devices import Device
from trainer_service.metrics import TokenCounts

STATE_FILE = "training_state.pt"
"""File in a checkpoint folder holding optimizer, scheduler, RNG state and the step it was taken at."""


def save_checkpoint(model: Any, out_dir: Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``out_dir/step-<step>/`` (a PEFT adapter or full safetensors weights, plus ``training_state.pt``)
    atomically; return the folder."""
    final = out_dir / f"step-{step}"
    tmp = out_dir / f".step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    torch.save(state, tmp / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def training_state(step: int, usage: TokenCounts, config: TrainConfig, n_rows: int, optimizer: torch.optim.Optimizer, scheduler: Any,
                   device: Device) -> dict[str, Any]:
    """What ``training_state.pt`` holds for :func:`restore_training_state`: the step, tokens, data order's keys, optimizer,
    scheduler, RNGs."""
    state = {"step": step, "tokens_total": usage.training, "prefill_tokens": usage.prefill, "decode_tokens": usage.decode,
             "seed": config.seed, "batch_size": config.batch_size, "n_rows": n_rows,
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "torch_rng": torch.get_rng_state(), "config": asdict(config)}
    if device.is_cuda:
        state["cuda_rng"] = torch.cuda.get_rng_state(device.torch_device)
    return state


def restore_training_state(resume: Path, config: TrainConfig, n_rows: int, optimizer: torch.optim.Optimizer, scheduler: Any,
                           device: Device) -> tuple[int, TokenCounts]:
    """Load ``resume``'s training state into ``optimizer``, ``scheduler`` and the RNGs: ``(step, tokens so far)``. Raises
    ``ValueError`` for a state from a different seed, batch size or dataset size (its data order would differ)."""
    state = torch.load(resume / STATE_FILE, weights_only=True, map_location=device.torch_device)
    expected = {"seed": config.seed, "batch_size": config.batch_size, "n_rows": n_rows}
    found = {key: state[key] for key in expected}
    if found != expected:
        raise ValueError(f"resume state {found} does not match this job {expected}")
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"].cpu())
    if device.is_cuda and "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"].cpu(), device.torch_device)
    return state["step"], TokenCounts(state["tokens_total"], state.get("prefill_tokens", 0), state.get("decode_tokens", 0))

"""Checkpoint folders and the training state that resumes them.

A checkpoint is ``out_dir/step-<N>/``: the model (LoRA: ``adapter_model.safetensors`` + ``adapter_config.json``;
full: ``model.safetensors`` + ``config.json``) and ``training_state.pt`` (:data:`STATE_FILE`: the step, the tokens
so far, the data order's keys, optimizer, scheduler, RNGs and the config).

Invariants: writes are atomic (:func:`save_checkpoint` writes a hidden ``.step-<N>.tmp`` folder and renames it, so a
``step-<N>`` folder is complete or absent, never half-written, whatever kills the worker); resume is exact
(:func:`restore_training_state` puts back everything the next steps depend on besides the weights, which
``trainer_service.policy.load_model`` reads from the same folder, and refuses a state whose data order would differ);
one format whatever the number of devices that wrote it (:mod:`trainer_service.distributed` writes whole tensors, once).
"""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from trainer_service.config import TrainConfig
from trainer_service.devices import Device
from trainer_service.metrics import TokenCounts

if TYPE_CHECKING:
    from trainer_service.parallel import Parallel

STATE_FILE = "training_state.pt"
"""File in a checkpoint folder holding optimizer, scheduler, RNG state and the step it was taken at."""


def save_checkpoint(model: Any, out_dir: Path, step: int, state: dict[str, Any] | None, parallel: Parallel | None = None) -> Path:
    """Write ``out_dir/step-<step>/`` (a PEFT adapter or full safetensors weights, plus ``training_state.pt``)
    atomically; return the folder. On several processes every one calls it (sharded weights are gathered into full
    tensors, a collective) and the main process alone writes, with the ``state`` it alone holds; all return once it is
    written."""
    final = out_dir / f"step-{step}"
    weights = None
    if parallel is not None and parallel.sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        first: dict[int, str] = {}
        for name, parameter in model.named_parameters(remove_duplicate=False):  # tied weights (lm_head) stay one tensor, as saved whole
            if (owner := first.setdefault(id(parameter), name)) != name and owner in weights:
                weights[name] = weights[owner]
    if parallel is None or parallel.main:
        tmp = out_dir / f".step-{step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, safe_serialization=True, **({"state_dict": weights} if weights is not None else {}))
        torch.save(state, tmp / STATE_FILE)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    if parallel is not None:
        parallel.barrier()
    return final


def training_state(step: int, usage: TokenCounts, config: TrainConfig, n_rows: int, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any,
                   device: Device, parallel: Parallel | None = None) -> dict[str, Any] | None:
    """What ``training_state.pt`` holds for :func:`restore_training_state`: the step, tokens, data order's keys, optimizer,
    scheduler, RNGs. The optimizer's state is keyed by parameter index as ``Optimizer.state_dict`` keys it, whatever the
    number of processes (sharded state is gathered, a collective every process joins); ``None`` on a process other
    than the main one."""
    optimizer_state = _gathered_optimizer_state(model, optimizer) if parallel is not None and parallel.sharded else optimizer.state_dict()
    if parallel is not None and not parallel.main:
        return None
    state = {"step": step, "tokens_total": usage.training, "prefill_tokens": usage.prefill, "decode_tokens": usage.decode,
             "seed": config.seed, "batch_size": config.batch_size, "n_rows": n_rows,
             "optimizer": optimizer_state, "scheduler": scheduler.state_dict(), "torch_rng": torch.get_rng_state(), "config": asdict(config)}
    if device.is_cuda:
        state["cuda_rng"] = torch.cuda.get_rng_state(device.torch_device)
    return state


def restore_training_state(resume: Path, config: TrainConfig, n_rows: int, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any,
                           device: Device, parallel: Parallel | None = None) -> tuple[int, TokenCounts]:
    """Load ``resume``'s training state into ``optimizer``, ``scheduler`` and the RNGs: ``(step, tokens so far)``; every
    process of several loads it (sharded optimizer state takes its own shard). Raises ``ValueError`` for a state from a
    different seed, batch size or dataset size (its data order would differ)."""
    state = torch.load(resume / STATE_FILE, weights_only=True, map_location="cpu" if parallel is not None and parallel.sharded else device.torch_device)
    expected = {"seed": config.seed, "batch_size": config.batch_size, "n_rows": n_rows}
    found = {key: state[key] for key in expected}
    if found != expected:
        raise ValueError(f"resume state {found} does not match this job {expected}")
    if parallel is not None and parallel.sharded:
        _scatter_optimizer_state(model, optimizer, state["optimizer"])
    else:
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"].cpu())
    if device.is_cuda and "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"].cpu(), device.torch_device)
    return state["step"], TokenCounts(state["tokens_total"], state.get("prefill_tokens", 0), state.get("decode_tokens", 0))


def _trained_names(model: Any) -> list[str]:
    """The names of ``model``'s trained parameters in the optimizer's order (the loop's optimizer takes them in module order)."""
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad]


def _gathered_optimizer_state(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Sharded optimizer state gathered whole (on the CPU; empty but on the main process) and keyed by parameter index,
    as one process's ``optimizer.state_dict()`` would be. PyTorch's ``get_optimizer_state_dict`` keys it by name."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    by_name = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    index = {name: i for i, name in enumerate(_trained_names(model))}
    return {"state": {index[name]: value for name, value in by_name.get("state", {}).items()},
            "param_groups": [{**group, "params": [index[name] for name in group["params"]]} for group in by_name.get("param_groups", [])]}


def _scatter_optimizer_state(model: Any, optimizer: torch.optim.Optimizer, indexed: dict[str, Any]) -> None:
    """Load a whole optimizer state keyed by parameter index into a sharded optimizer (each process keeps its shard)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _trained_names(model)
    by_name = {"state": {names[i]: value for i, value in indexed["state"].items()},
               "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in indexed["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))

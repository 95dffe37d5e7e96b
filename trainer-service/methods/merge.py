"""``merge``: combine checkpoints of one base model into a new checkpoint, without training (``recipe.method: merge``,
the job's ``merge`` a :class:`~services.common.contracts.MergeSpec`).

Not a loop method: a merge job runs :func:`merge_checkpoints` once and writes one checkpoint (step 1); a cancel
stops it between tensors, writing nothing. LoRA adapters
are combined by PEFT (``PeftModel.add_weighted_adapter``: ``linear``, ``ties``, ``dare_linear``, ``dare_ties``); full
weights through PEFT's merge functions (``peft.utils.merge_utils``) applied to each weight's change from the base,
``W = W_base + merge(W_1 - W_base, …, W_n - W_base)``, one tensor at a time. The job is charged for the parameters
it reads (``merged_parameters``: the checkpoints' stored parameters, counted from their safetensors headers).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch


class MergeStopped(Exception):
    """``should_stop`` answered true before the merge was written: nothing was written."""


def merge_checkpoints(base_dir: Path, kind: str, folders: list[Path], weights: list[float], combination: str, density: float,
                      seed: int, out: Path, should_stop: Callable[[], bool] = lambda: False) -> Path:
    """Write the combination of the checkpoints in ``folders`` (all ``kind``: ``lora`` or ``full``, of the base in
    ``base_dir``) to the new folder ``out`` and return it: a PEFT adapter for LoRA, a full model folder otherwise.

    ``weights``: one per folder; ``combination`` and ``density`` as :class:`~services.common.contracts.MergeSpec`;
    ``seed`` seeds DARE's random drop. ``should_stop`` is asked between tensors (full weights) or between loading
    and combining (LoRA); when it answers true, :class:`MergeStopped` is raised and nothing is written. Raises
    ``ValueError`` for adapters PEFT cannot combine (PEFT's message).
    """
    torch.manual_seed(seed)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (_merge_lora if kind == "lora" else _merge_full)(base_dir, folders, weights, combination, density, tmp, should_stop)
    except MergeStopped:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(tmp.with_name(f"{tmp.name}.peft"), ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _merge_lora(base_dir: Path, folders: list[Path], weights: list[float], combination: str, density: float, out: Path,
                should_stop: Callable[[], bool]) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), folders[0], adapter_name="input_0")
    for i, folder in enumerate(folders[1:], start=1):
        model.load_adapter(folder, adapter_name=f"input_{i}")
    names = [f"input_{i}" for i in range(len(folders))]
    if should_stop():
        raise MergeStopped
    model.add_weighted_adapter(names, weights, "merged", combination_type=combination,
                               **({} if combination == "linear" else {"density": density}))
    saved = out.with_name(f"{out.name}.peft")
    model.save_pretrained(saved, selected_adapters=["merged"], safe_serialization=True)
    (saved / "merged").rename(out)  # PEFT writes an adapter other than "default" to a sub-folder of its name
    shutil.rmtree(saved, ignore_errors=True)


def _tensor_readers(stack: ExitStack, folder: Path) -> dict[str, Any]:
    """Tensor name -> an open safetensors file holding it (a single file or shards)."""
    from safetensors import safe_open

    readers: dict[str, Any] = {}
    for file in sorted(folder.glob("*.safetensors")):
        handle = stack.enter_context(safe_open(str(file), framework="pt"))
        readers.update(dict.fromkeys(handle.keys(), handle))
    return readers


def _merge_full(base_dir: Path, folders: list[Path], weights: list[float], combination: str, density: float, out: Path,
                should_stop: Callable[[], bool]) -> None:
    from peft.utils import merge_utils
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    w = torch.tensor(weights, dtype=torch.float32)
    combine = {
        "linear": lambda tau: merge_utils.task_arithmetic(tau, w),
        "ties": lambda tau: merge_utils.ties(tau, w, density),
        "dare_linear": lambda tau: merge_utils.dare_linear(tau, w, density),
        "dare_ties": lambda tau: merge_utils.dare_ties(tau, w, density),
    }[combination]
    with ExitStack() as stack, torch.no_grad():
        readers = [_tensor_readers(stack, folder) for folder in folders]
        for name, param in model.named_parameters():  # tied weights once
            if should_stop():
                raise MergeStopped
            if not all(name in r for r in readers):
                raise ValueError(f"weight {name} is missing from a checkpoint: not all of them are full checkpoints of this base")
            tau = [r[name].get_tensor(name).to(torch.float32) - param for r in readers]
            param.add_(combine(tau))
    model.save_pretrained(out, safe_serialization=True)

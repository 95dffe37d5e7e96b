"""Where a job trains and in which precision: the first CUDA device this process sees, else the CPU, chosen once at
the job's start (:func:`select_device`) and named in its ``device`` event.

On CUDA: bf16 autocast over float32 master weights, TF32 matmuls. On CPU: every CPU this process may run on, float32,
bf16 autocast only where the CPU computes bf16 natively (emulated bf16 measured 25x slower).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from trainer_service.config import TrainConfig

from services.common.llms import cpu_threads

if TYPE_CHECKING:
    from trainer_service.parallel import Parallel


@dataclass(frozen=True)
class Device:
    """Where a job trains: ``torch_device``, a readable ``name`` for its events, and the autocast dtype (``None``:
    float32 throughout)."""

    torch_device: torch.device
    name: str
    autocast_dtype: torch.dtype | None

    @property
    def is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    def autocast(self):  # noqa: ANN201 - a context manager
        """bf16 autocast on this device, or nothing."""
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.torch_device.type, dtype=self.autocast_dtype)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``); emulated
    bf16 is slower than float32. False where ``/proc/cpuinfo`` is absent."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = {flag for line in cpuinfo.splitlines() if line.startswith("flags") for flag in line.split()}
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def select_device(config: TrainConfig, parallel: Parallel | None = None) -> Device:
    """The first CUDA device when this process sees one (bf16 autocast), else the CPU (every CPU this process may
    run on, or ``OMP_NUM_THREADS`` of them: :func:`~services.common.llms.cpu_threads`; bf16 autocast only with native bf16).
    Chosen once, at the start of a job. One process of several (``parallel``) takes CUDA device ``local_rank``, or its
    share of the CPUs (``parallel.cpu_threads``)."""
    if torch.cuda.is_available():
        index = parallel.local_rank if parallel is not None else torch.cuda.current_device()
        torch.cuda.set_device(index)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        return Device(torch.device("cuda", index), f"cuda:{index} ({torch.cuda.get_device_name(index)})",
                      torch.bfloat16 if config.bf16_autocast else None)
    torch.set_num_threads(parallel.cpu_threads if parallel is not None else cpu_threads())
    bf16 = config.bf16_autocast and cpu_has_native_bf16()
    return Device(torch.device("cpu"), f"cpu ({torch.get_num_threads()} threads)", torch.bfloat16 if bf16 else None)

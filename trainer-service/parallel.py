"""One process of a training job spread over several devices (:class:`Parallel`): its share of each batch, the sums
and the stop it agrees on with the others, and the wrapping of the loss's module (DDP for LoRA, FSDP2 for full
weights). The loop (``trainer_service.training``), the device choice, the policy and the checkpoints read it;
``trainer_service.distributed`` launches the processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class Parallel:
    """One process of a job's ``world`` processes: its ``rank`` (0 is the main one: callbacks and checkpoint writing),
    its CUDA device index ``local_rank``, the CPU threads it may use (``cpu_threads``, on a CPU host) and whether its
    weights are ``sharded`` (full fine-tuning, FSDP2) or replicated (LoRA, DDP)."""

    rank: int
    world: int
    local_rank: int
    cpu_threads: int
    sharded: bool

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def strategy(self) -> str:
        """``fsdp2`` (sharded) or ``ddp``, for the job's ``device`` event."""
        return "fsdp2" if self.sharded else "ddp"

    def shard(self, batch: Sequence[T]) -> list[T]:
        """This process's examples of a step's ``batch``: every ``world``-th from ``rank`` (the loop's batch is at least
        ``world`` examples: ``estimate.job_devices``)."""
        return list(batch[self.rank::self.world])

    def sum(self, values: Sequence[float], device: torch.device) -> list[float]:
        """``values`` summed over the processes (one all-reduce, float64: token counts stay exact)."""
        totals = torch.tensor(list(values), dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        return totals.tolist()

    def any(self, flag: bool, device: torch.device) -> bool:
        """Whether ``flag`` is true on any process (so all stop at the same step)."""
        return self.sum([float(flag)], device)[0] > 0

    def barrier(self) -> None:
        dist.barrier()

    def wrap(self, forward: torch.nn.Module, adapter: str, device: torch.device) -> tuple[torch.nn.Module, Any]:
        """``(module, sharded root)``: the loss's module (``policy.TokenLogprobs``) for this process. LoRA: DDP over it
        (the frozen base is replicated, the adapter's gradients all-reduced), root ``None``. Full weights: FSDP2's
        ``fully_shard`` on each decoder layer, then on the module itself, the root (and no shared-prefix pass: a layer
        runs forward once a backward)."""
        if adapter == "lora":
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(forward, device_ids=[device.index] if device.type == "cuda" else None), None
        from torch.distributed.fsdp import fully_shard

        forward.shared_prefix = False
        for layer in forward.causal_lm.model.layers:
            fully_shard(layer)
        fully_shard(forward)
        return forward, forward

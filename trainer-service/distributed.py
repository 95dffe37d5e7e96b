"""A training job's step loop on several devices of one host, on PyTorch's own distributed stack.

:func:`train` is the worker's entry: one device trains in its process, more through :func:`train_parallel`, which
launches the loop of :func:`trainer_service.training.train_examples` in
``devices`` processes with torchrun's launcher (``torch.distributed.launcher.api.elastic_launch``: a c10d rendezvous on
a free loopback port, ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` set, every process ended when one fails). Each
process (:func:`_rank_main`) joins the process group (NCCL on CUDA, gloo on CPU), takes CUDA device ``LOCAL_RANK`` (or
its share of the CPUs) and runs the same loop with a :class:`~trainer_service.parallel.Parallel`: a LoRA adapter is replicated with DDP
(``DistributedDataParallel``: gradients all-reduced), full weights are sharded with FSDP2 (``fully_shard`` on every
decoder layer and on the model: parameters, gradients and optimizer state split over the processes).

Invariants:

- The same global batch as on one device. Step ``N``'s examples (``data_order.batch_indices``) are dealt out rank by
  rank (``batch[rank::world]``) and each process's loss is weighted by its share of the batch's normalizer
  (:attr:`~trainer_service.steps.StepLoss.weight`: SFT's supervised tokens, else examples), so the averaged gradient
  is the gradient of the whole batch's loss (``training._optimizer_step``).
- Tokens are metered once: each process counts its share, and the step's tokens are the sum.
- Checkpoints are written once, by rank 0, in the single-device format: FSDP2's shards are gathered into whole tensors
  and the optimizer's state keyed by parameter index (:mod:`trainer_service.checkpoints`). Inference, evaluation and a
  resume on any number of devices read them unchanged.
- The job's callbacks (events, checkpoints stored as artifacts, cancellation, the lease) run in the worker's process,
  fed by rank 0 over a queue, and so do GRPO's reward calls (:class:`_RewardProxy`): only the worker talks to the grader
  and the database.
- A process that ends without raising (killed, out of memory, its device gone) is :class:`DeviceLost`: the worker
  hands the job back to the queue and its next attempt resumes from its newest checkpoint, as when a single-device
  worker dies. An exception raised in a process fails the job with that exception, as on one device.
- No process of a job outlives the worker that launched it (:func:`_die_with`), and the launcher leaves the worker's
  signal handlers alone (it runs in a thread of its own).
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import select
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from trainer_service.config import TrainConfig
from trainer_service.metrics import StepMetrics, TrainResult
from trainer_service.parallel import Parallel

from services.common.processes import process_tag, tag_alive

logger = logging.getLogger(__name__)



START_METHOD = "forkserver"
"""How a job's processes start: forked from multiprocessing's fork server (one per worker process, started at its first
job, torch and the trainer's modules imported there once: :data:`PRELOAD`), not spawned afresh, which would import
them again for every process of every job. The fork server initializes no CUDA, so its children may."""

PRELOAD = ["torch", "torch.distributed", "transformers", "peft", "trainer_service.training", "trainer_service.methods"]
"""Modules the fork server imports before it forks a job's first process."""


class DeviceLost(RuntimeError):
    """A process of a job on several devices ended without raising (killed by a signal, or exited): its device, or the
    process, is gone. The job is resumed from its newest checkpoint, as when a worker dies."""


@dataclass(frozen=True)
class _RankSpec:
    """What every process of a job needs to run its loop (pickled to it by the launcher)."""

    base_dir: Path
    method: str
    rewarded: bool
    examples: Sequence[Any]
    config: TrainConfig
    out_dir: Path | None
    pad_token_id: int
    init_adapter: Path | None
    init_weights: Path | None
    resume: Path | None
    cpu_threads: int
    worker: str


class _Channel:
    """Rank 0's line to the worker's process: its events (start, steps, checkpoints) and every rank's reward calls go
    up ``events``; ``stop`` is set by the worker to stop the job; ``replies[rank]`` carries a reward call's answer back.
    Made of the launcher's start method's queues, so it travels to the processes with their arguments."""

    def __init__(self, devices: int) -> None:
        import multiprocessing

        context = multiprocessing.get_context(START_METHOD)
        self.events = context.Queue()
        self.stop = context.Event()
        self.replies = [context.Queue() for _ in range(devices)]

    def on_start(self, info: dict[str, Any]) -> None:
        self.events.put(("start", info))

    def on_step(self, metrics: StepMetrics) -> None:
        self.events.put(("step", metrics))

    def on_checkpoint(self, step: int, folder: Path) -> None:
        self.events.put(("checkpoint", step, folder))

    def should_stop(self) -> bool:
        return self.stop.is_set()


class PeerLost(RuntimeError):
    """Raised in a process whose collective failed because another process of its job is gone (gloo's closed or reset
    connection, a backend or store error), so the launcher's report names the loss of a device, not this process."""


def _is_peer_loss(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective failing for want of another process: torch.distributed's backend, network and store
    errors (NCCL), or gloo's transport errors (which reach Python as a plain ``RuntimeError``)."""
    return isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and "gloo/transport" in str(exc))


class RewardFailed(RuntimeError):
    """The worker's reward call for a process failed (the worker holds the exception and fails the job with it)."""


class _RewardProxy:
    """GRPO's reward as a process of a job calls it: the call goes to the worker's process, which holds the real reward
    (the grader's client), and the rewards come back."""

    def __init__(self, channel: _Channel, rank: int) -> None:
        self.channel, self.rank = channel, rank

    def __call__(self, examples: list[Any], completions: list[list[int]]) -> list[float]:
        self.channel.events.put(("reward", self.rank, examples, completions))
        ok, value = self.channel.replies[self.rank].get()
        if not ok:
            raise RewardFailed(value)
        return value


def _die_with(worker: str) -> None:
    """End this process when the worker that launched its job ends, however it ends (a job's processes are the fork
    server's children, not the worker's, and would train on with nobody to hear them): the kernel kills it when its
    parent, the fork server, dies (``PR_SET_PDEATHSIG``), and a thread waiting on the worker's pidfd kills it when the
    worker dies (polling its ``worker`` tag, ``services.common.processes.process_tag``, every second where pidfds are
    missing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    def watch() -> None:
        try:
            fd = os.pidfd_open(int(worker.partition(".")[0]))
        except ProcessLookupError:
            fd = None
        except OSError:  # no pidfds (a kernel before 5.3): poll
            while tag_alive(worker):
                time.sleep(1.0)
            fd = None
        if fd is not None:
            select.select([fd], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="die-with-worker", daemon=True).start()


@record
def _rank_main(spec: _RankSpec, channel: _Channel) -> TrainResult | None:
    """One process of a job: join the group, run the loop on this process's device, return the result from rank 0.
    An exception is recorded for the launcher (``torch.distributed.elastic``'s ``record``) before it ends the process."""
    from trainer_service.methods import METHODS
    from trainer_service.training import train_examples

    _die_with(spec.worker)
    rank, world, local_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=torch.device("cuda", local_rank) if cuda else None)
    parallel = Parallel(rank, world, local_rank, spec.cpu_threads, sharded=spec.config.adapter == "full")
    try:
        method = type(METHODS[spec.method])(_RewardProxy(channel, rank)) if spec.rewarded else METHODS[spec.method]
        main = parallel.main
        result = train_examples(spec.base_dir, method, spec.examples, spec.config, spec.out_dir, pad_token_id=spec.pad_token_id,
                                init_adapter=spec.init_adapter, init_weights=spec.init_weights, resume=spec.resume,
                                on_start=channel.on_start if main else None, on_step=channel.on_step if main else None,
                                on_checkpoint=channel.on_checkpoint if main else None, should_stop=channel.should_stop if main else None,
                                parallel=parallel)
        return result if main else None
    except Exception as exc:
        if _is_peer_loss(exc):
            raise PeerLost(f"{exc.__class__.__name__}: {exc}") from exc
        raise
    finally:
        dist.destroy_process_group()


def _free_threads(devices: int) -> int:
    from services.common.llms import cpu_threads

    return max(1, cpu_threads() // devices)


def train(base_dir: Path, method: Any, rows: Sequence[Any], config: TrainConfig, out_dir: Path, *, devices: int = 1,
          **kwargs: Any) -> TrainResult:
    """Train by ``method`` on dataset ``rows`` on ``devices`` devices: in this process
    (:func:`trainer_service.training.train`) for one, else the rows tokenized here
    (:func:`~trainer_service.training.tokenized`) and :func:`train_parallel`. The arguments, results and errors are
    theirs (``UntrainableRows`` before anything starts)."""
    from trainer_service import training

    if devices == 1:
        return training.train(base_dir, method, rows, config, out_dir, **kwargs)
    examples, pad_token_id = training.tokenized(base_dir, method, rows, config)
    return train_parallel(devices, base_dir, method, examples, config, out_dir, pad_token_id=pad_token_id, **kwargs)


def train_parallel(
    devices: int,
    base_dir: Path,
    method: Any,
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
) -> TrainResult:
    """:func:`~trainer_service.training.train_examples` on ``devices`` processes of this host (see the module docstring);
    the same arguments, results and checkpoints, the callbacks called in this process, in order.

    The processes are launched with torchrun's launcher, from a thread of its own (on the main thread it would take over
    this process's SIGTERM and SIGINT handlers for good, a Celery worker's warm shutdown among them), with their error
    files in a ``.launch-*`` folder in ``out_dir``, on CUDA devices ``0 … devices-1`` of what this process sees
    (``CUDA_VISIBLE_DEVICES``), or on the CPU with gloo, each with ``1/devices`` of the CPUs. The callbacks run in the
    calling thread; ``should_stop`` is polled after each step and every second.

    Raises :class:`DeviceLost` when a process ended without raising; the exception of a callback or a reward call when
    one raised (the processes are stopped at their next step first); ``RuntimeError`` with a process's own exception
    (its type and message) when one raised; ``ValueError`` for more devices than this host has CUDA devices.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if torch.cuda.is_available() and devices > torch.cuda.device_count():
        raise ValueError(f"this job is set to train on {devices} devices but this train worker sees {torch.cuda.device_count()} CUDA device(s)")
    rewarded = method.spec.rewarded
    spec = _RankSpec(Path(base_dir), method.name, rewarded, list(examples), config, Path(out_dir) if out_dir is not None else None, pad_token_id,
                     init_adapter, init_weights, resume, _free_threads(devices), process_tag())
    import multiprocessing

    multiprocessing.get_context(START_METHOD).set_forkserver_preload(PRELOAD)  # takes effect when the fork server starts
    channel = _Channel(devices)
    failures: list[BaseException] = []
    handlers = {"start": on_start, "step": on_step, "checkpoint": on_checkpoint}

    def serve() -> None:  # the callbacks and reward calls, in this thread, in the order rank 0 made them, until the launch ends
        while True:
            try:
                message = channel.events.get(timeout=1.0)
            except queue.Empty:
                message = ("tick",)
            if message is None:
                return
            kind, args = message[0], message[1:]
            if kind == "reward":
                rank, batch, completions = args
                try:
                    channel.replies[rank].put((True, method.reward(batch, completions)))
                except Exception as exc:  # the process raises RewardFailed; the job fails with this exception
                    failures.append(exc)
                    channel.replies[rank].put((False, f"{exc.__class__.__name__}: {exc}"))
                continue
            if failures:
                continue  # after a callback failed, the processes are stopping: nothing more is recorded
            try:
                if handlers.get(kind) is not None:
                    handlers[kind](*args)  # type: ignore[misc]
                if should_stop is not None and kind in ("step", "tick") and not channel.stop.is_set() and should_stop():
                    channel.stop.set()
            except BaseException as exc:  # noqa: BLE001 - re-raised by train_parallel once the processes have stopped
                failures.append(exc)
                channel.stop.set()

    log_dir = (Path(out_dir) if out_dir is not None else Path(os.environ.get("TMPDIR", "/tmp"))) / f".launch-{uuid.uuid4().hex[:8]}"
    launch_config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=devices, run_id=uuid.uuid4().hex, rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:0", max_restarts=0, monitor_interval=0.2, start_method=START_METHOD,
                          logs_specs=DefaultLogsSpecs(log_dir=str(log_dir)))
    launched: dict[str, Any] = {}

    def launch() -> None:  # in a thread of its own, so the launcher leaves this process's signal handlers alone
        try:
            launched["results"] = elastic_launch(launch_config, _rank_main)(spec, channel)
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
            launched["error"] = exc
        finally:
            channel.events.put(None)

    launcher = threading.Thread(target=launch, name="train-parallel-launcher", daemon=True)
    launcher.start()
    try:
        serve()
        launcher.join()
        error = launched.get("error")
        if failures:
            raise failures[0] from error
        if isinstance(error, ChildFailedError):
            raise _failure(error, devices) from None  # reads the processes' error files: before they go
        if error is not None:
            raise error
        return launched["results"][0]
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


LOST_PEER = (PeerLost.__name__, "DistBackendError", "DistNetworkError", "DistStoreError")
"""What a process's recorded exception starts with when another one of its group is gone (:class:`PeerLost`, or a
torch.distributed error raised outside the loop)."""


def _failure(exc: Any, devices: int) -> Exception:
    """What a failed launch means for the job: the launcher reports the first process that ended. :class:`DeviceLost` if
    it ended without raising, or raised because another process was gone (:data:`LOST_PEER`); else its own exception,
    as a ``RuntimeError`` with the original's type and message."""
    rank, failure = min(exc.failures.items(), key=lambda item: item[1].timestamp)
    message = failure.message.get("message", "") if isinstance(failure.message, dict) else str(failure.message)
    if not os.path.isfile(failure.error_file) or message.startswith(LOST_PEER):
        how = f"signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit status {failure.exitcode}"
        return DeviceLost(f"the training process on device {rank} of {devices} ended ({how}; {message or 'no error recorded'}): "
                          "a device or process of the job was lost")
    return RuntimeError(message.strip() or f"the training process on device {rank} failed")

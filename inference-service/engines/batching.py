"""Micro-batching for an engine that answers a group of requests with one blocking call (the transformers engine).

Concurrent requests are micro-batched: the first waiting request opens a window that stays open while requests keep
arriving (each within ``max_wait_ms`` of the last, up to ``max_window_ms`` in all and ``max_batch_size`` rows; a
request with ``n`` choices is ``n`` rows). The batch is split by model (the base, each adapter, each full checkpoint:
requests for different models never share a group), and each group with a request not cancelled yet runs as one :meth:`MicroBatcher._generate` call on one worker
thread, one group at a time. The batcher lives on the event loop of its callers (a new loop gets a new batcher).
Every request submitted is answered: ``_generate`` finishes or fails each request of its group, and
:meth:`MicroBatcher.aclose` fails those not answered yet.
"""

from __future__ import annotations

import abc
import asyncio
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from inference_service.engines.base import Adapter, Generation, GenerationRequest


@dataclass
class Pending:
    """A submitted request waiting for its batch: the checkpoint it runs on (``None``: the base) and its prompt's
    token ids."""

    request: GenerationRequest
    adapter: Adapter | None
    generation: Generation
    prompt: list[int]


class MicroBatcher(abc.ABC):
    """The batching half of an engine: :meth:`submit` queues a request, a worker task collects windows of them and
    hands each group to :meth:`_generate` (the engine's, blocking) on one worker thread."""

    def __init__(self, *, max_batch_size: int, max_wait_ms: float, max_window_ms: float) -> None:
        self.max_batch_size = max_batch_size
        self._max_wait_s = max_wait_ms / 1000
        self._max_window_s = max_window_ms / 1000
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._queue: asyncio.Queue[Pending] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._in_flight: list[Pending] = []

    @abc.abstractmethod
    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """Token ids of the request's prompt (the engine's :meth:`~inference_service.engines.base.Engine.prompt_ids`)."""

    @abc.abstractmethod
    def _generate(self, group: list[Pending]) -> None:
        """Answer ``group`` (one model; on the worker thread): finish or fail every request's generation."""

    async def submit(self, request: GenerationRequest, adapter: Adapter | None = None) -> Generation:
        """Queue ``request`` for the next batch on the base model or the checkpoint ``adapter`` (LoRA or full);
        returns its :class:`Generation`."""
        prompt = await asyncio.to_thread(self.prompt_ids, request)
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.get_loop() is not loop or self._worker.done():
            # the batcher lives on the loop of its callers (a new loop, e.g. a new asyncio.run, gets a new batcher)
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._run(), name="transformers-engine")
        assert self._queue is not None
        generation = Generation()
        self._queue.put_nowait(Pending(request, adapter, generation, prompt))
        return generation

    async def _collect(self) -> list[Pending]:
        """Wait for one request, then gather more while they keep coming: the window closes when none arrived for
        ``max_wait_ms``, when ``max_batch_size`` rows are waiting, or ``max_window_ms`` after the first request.

        Requests of one client rarely arrive at once (each is rendered and admitted on its own; an evaluation's calls
        open their connections one by one), and a batch cut short makes the rest wait for a whole second ``generate``
        call: a fixed 15 ms window split 64 requests sent together into batches of 32 + 32, and an evaluation's 64
        calls into 5 + 32 + 27 (a fifth slower than 32 + 32). Waiting is cheap next to a batch (a decode step of 32
        rows of the 135M model takes about 0.4 s on 2 cores)."""
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        batch = [await self._queue.get()]
        closes = loop.time() + self._max_window_s
        while sum(p.request.n for p in batch) < self.max_batch_size:
            remaining = min(self._max_wait_s, closes - loop.time())
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
        return batch

    async def _run(self) -> None:
        """The worker: collect a batch, run its groups one after the other, forever."""
        loop = asyncio.get_running_loop()
        while True:
            batch = self._in_flight = await self._collect()
            for group in _groups(batch):
                live = [p for p in group if not p.generation.cancelled]
                if live:
                    await loop.run_in_executor(self._executor, self._generate, live)

    async def aclose(self) -> None:
        """Stop batching: cancel the requests not answered yet and release the worker thread."""
        if self._worker is not None and self._worker.get_loop() is asyncio.get_running_loop():
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        self._worker = None
        pending = list(self._in_flight)
        if self._queue is not None:
            while not self._queue.empty():
                pending.append(self._queue.get_nowait())
        for p in pending:
            p.generation.fail(RuntimeError("the engine is shutting down"))
        self._executor.shutdown(wait=False, cancel_futures=True)


def _groups(batch: list[Pending]) -> list[list[Pending]]:
    """``batch`` split by model (the base, an adapter or a full checkpoint); seeds need no group of their own, each
    sampled row drawing from its own generator (:func:`~inference_service.engines.decoding.row_generator`)."""
    groups: dict[tuple[str, str] | None, list[Pending]] = defaultdict(list)
    for pending in batch:
        groups[(pending.adapter.kind, pending.adapter.name) if pending.adapter else None].append(pending)
    return list(groups.values())

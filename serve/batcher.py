"""The length-aware dynamic batcher: one queue per bucket key, batches formed per key.

Pure queue logic (`BucketQueues`, given the time explicitly) plus a thin asyncio loop
(`Batcher`) that waits for a free instance and a ready batch, and runs the batch in a worker
thread. No ONNX Runtime here.

The rule, per key: the first sequence waits; the batch fills until it holds the key's
capacity, or until `max_delay` has passed since that first sequence. Among keys that are
ready, the one holding the earliest deadline goes first, so a rare bucket never starves.
Sequences whose client went away (future already done) or whose deadline passed are dropped
before they are computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from serve.bucketing import BucketKey, BucketPlan
from serve.errors import DeadlineExceeded, InferenceFailed

Outputs = dict[str, np.ndarray]
Clock = Callable[[], float]


class BatchModel(Protocol):
    """What the batcher needs of a model (a `serve.model.Model`, or a fake in tests)."""

    name: str
    plan: BucketPlan

    def batch_shape(self, key: BucketKey, lengths: Sequence[int]) -> tuple[int, int]: ...

    def run_batch(self, key: BucketKey, sequences: Sequence[np.ndarray]) -> list[Outputs]: ...


class BatchObserver(Protocol):
    """Where the batcher reports what it did (the metrics)."""

    def batch_done(
        self,
        model: str,
        bucket: int,
        lengths: Sequence[int],
        shape: tuple[int, int],
        queue_s: Sequence[float],
        compute_s: float,
    ) -> None: ...

    def dropped(self, model: str, reason: str, count: int) -> None: ...

    def queue_depth(self, model: str, depth: int) -> None: ...


@dataclass(eq=False)
class Pending:
    """One sequence waiting in a bucket queue; its future gets that sequence's outputs."""

    sequence: np.ndarray
    future: asyncio.Future[Outputs]
    enqueued: float
    deadline: float


@dataclass
class BucketQueues:
    max_delay: float
    queues: dict[BucketKey, deque[Pending]] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def add(self, key: BucketKey, item: Pending) -> None:
        self.queues.setdefault(key, deque()).append(item)

    def purge(self, now: float) -> dict[str, list[Pending]]:
        """Remove sequences that must not be computed: cancelled, or past their deadline."""
        dropped: dict[str, list[Pending]] = {"cancelled": [], "expired": []}
        for key, queue in self.queues.items():
            keep: deque[Pending] = deque()
            for item in queue:
                if item.deadline <= now:  # first: a request that timed out also cancels
                    dropped["expired"].append(item)
                elif item.future.done():
                    dropped["cancelled"].append(item)
                else:
                    keep.append(item)
            self.queues[key] = keep
        return dropped

    def _ready(self, key: BucketKey, queue: deque[Pending], now: float) -> bool:
        return len(queue) >= key.rows or now >= queue[0].enqueued + self.max_delay

    def take(self, now: float) -> tuple[BucketKey, list[Pending]] | None:
        """The next batch to run, or None when no key is ready yet."""
        ready = [k for k, q in self.queues.items() if q and self._ready(k, q, now)]
        if not ready:
            return None
        key = min(ready, key=lambda k: min(item.deadline for item in self.queues[k]))
        queue = self.queues[key]
        return key, [queue.popleft() for _ in range(min(key.rows, len(queue)))]

    def next_ready_at(self) -> float | None:
        """When the earliest waiting key reaches its max delay (None when nothing waits)."""
        starts = [q[0].enqueued for q in self.queues.values() if q]
        return min(starts) + self.max_delay if starts else None


class Batcher:
    """Feeds one model: `submit` queues sequences, `run` forms and executes batches forever."""

    def __init__(
        self,
        model: BatchModel,
        max_delay_s: float,
        observer: BatchObserver,
        clock: Clock = time.monotonic,
        instances: int = 1,
    ) -> None:
        """`instances`: batches that may run at once, each in its own worker thread. A batch
        is formed only when an instance is free, so batches keep gathering while all are busy."""
        self.model = model
        self.queues = BucketQueues(max_delay_s)
        self._observer = observer
        self._clock = clock
        self._arrived = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._free = asyncio.Semaphore(instances)
        self._running: set[asyncio.Task[None]] = set()
        self._worker = ThreadPoolExecutor(instances, thread_name_prefix=f"run-{model.name}")

    @property
    def depth(self) -> int:
        return len(self.queues)

    def submit(
        self, sequences: Sequence[np.ndarray], deadline: float
    ) -> list[asyncio.Future[Outputs]]:
        """Queue validated sequences, each in its own bucket; futures in the same order."""
        loop = asyncio.get_running_loop()
        now = self._clock()
        futures: list[asyncio.Future[Outputs]] = []
        for seq in sequences:
            future: asyncio.Future[Outputs] = loop.create_future()
            self.queues.add(self.model.plan.key_for(len(seq)), Pending(seq, future, now, deadline))
            futures.append(future)
        self._idle.clear()
        self._arrived.set()
        self._observer.queue_depth(self.model.name, self.depth)
        return futures

    async def wait_idle(self) -> None:
        """Until nothing waits and nothing runs: everything admitted has its answer."""
        await self._idle.wait()

    async def run(self) -> None:
        try:
            while True:
                await self._free.acquire()
                try:
                    key, items = await self._next_batch()
                except BaseException:
                    self._free.release()
                    raise
                task = asyncio.create_task(self._execute(key, items))
                self._running.add(task)
                task.add_done_callback(self._finished)
        finally:
            for task in self._running:
                task.cancel()
            self._worker.shutdown(wait=False, cancel_futures=True)

    def _finished(self, task: asyncio.Task[None]) -> None:
        """A batch is done: its instance is free again."""
        self._free.release()
        self._running.discard(task)
        if not self._running and not len(self.queues):
            self._idle.set()

    async def _next_batch(self) -> tuple[BucketKey, list[Pending]]:
        while True:
            now = self._clock()
            self._drop(self.queues.purge(now))
            batch = self.queues.take(now)
            if batch is not None:
                return batch
            if not self._running and not len(self.queues):
                self._idle.set()
            self._arrived.clear()
            wake = self.queues.next_ready_at()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), None if wake is None else wake - now)

    def _drop(self, dropped: dict[str, list[Pending]]) -> None:
        for reason, items in dropped.items():
            for item in items:
                if not item.future.done():
                    item.future.set_exception(DeadlineExceeded("deadline passed while queued"))
            if items:
                self._observer.dropped(self.model.name, reason, len(items))

    async def _execute(self, key: BucketKey, items: list[Pending]) -> None:
        sequences = [item.sequence for item in items]
        lengths = [len(s) for s in sequences]
        self._observer.queue_depth(self.model.name, self.depth)
        start = self._clock()
        loop = asyncio.get_running_loop()
        try:
            outputs = await loop.run_in_executor(self._worker, self.model.run_batch, key, sequences)
        except Exception as exc:  # a failing batch fails its own requests, nothing else
            for item in items:
                if not item.future.done():
                    item.future.set_exception(InferenceFailed(f"inference failed: {exc}"))
        else:
            for item, out in zip(items, outputs, strict=True):
                if not item.future.done():
                    item.future.set_result(out)
            self._observer.batch_done(
                self.model.name,
                self.model.plan.bucket_of(key.length),  # a configured edge, whatever the key
                lengths,
                self.model.batch_shape(key, lengths),
                [start - item.enqueued for item in items],
                self._clock() - start,
            )

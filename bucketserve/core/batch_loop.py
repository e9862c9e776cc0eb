"""The batch loop, one model's: forms batches from its queues and runs them. A batch is formed
whenever an instance is free and the memory it needs fits beside the batches running (the
budget, `memory`, shared with every model), so batches keep gathering while all are busy,
and runs in a worker thread, the model told whether it runs alone: no other batch running,
nothing left waiting, no more sequences than there are instances (a batch that took more
found them queued together: load, not a lone request), and short (`SHORT_BATCH_BYTES`).
Where the model then takes every core, such a batch holds every instance, and batches formed
meanwhile wait for it. A ready batch whose memory does not fit waits, claiming its room,
while those that may start go first; while a long batch runs and every instance is busy,
short batches run one at a time on a lane beside them. A failing batch runs its sequences
again one by one, so that only a sequence that fails alone gets an error. What it runs,
admission (`admission`) let in; the two share the model's `Flight`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from bucketserve.core.bucketing import BucketKey
from bucketserve.core.budget import Held, MemoryBudget
from bucketserve.core.flight import BatchModel, Clock, Flight, Observer
from bucketserve.core.layout import Outputs
from bucketserve.core.queues import Pending
from bucketserve.core.result_cache import Reuse
from bucketserve.errors import DeadlineExceeded, InferenceFailed
from bucketserve.logs import Throttled
from bucketserve.tracing import Attributes, Tracing

# (the scheduler's name: its lines are those operators filter and alert on, as before the
# scheduler was made of two parts)
log = logging.getLogger("bucketserve.core.scheduler")

# A batch that needs at most this much memory is short; one that needs more is long (its
# need grows with rows x length and rows x length^2, as its time does: seconds, for
# thousands of tokens). A long batch never runs on every core, where it would keep the short
# batches that arrive meanwhile waiting for it; while one runs, a short batch may run beside
# the instances on a lane of its own (one more thread on the cores, for the milliseconds it
# takes). 64 MiB: about 1,000 tokens of a BERT-base, 2,000 of a tiny ModernBERT.
SHORT_BATCH_BYTES = 64 * 2**20


class BatchLoop:
    def __init__(
        self,
        model: BatchModel,
        observer: Observer,
        flight: Flight,
        *,
        instances: int,
        clock: Clock,
        tracing: Tracing,
        attributes: Attributes,
        memory: MemoryBudget,
        reuse: Reuse | None,
    ) -> None:
        """`instances`: batches that may run at once, each in its own worker thread, on the
        model's one set of weights; `tracing`: where each batch is traced, with `attributes`
        (the model's name and version); `memory`: the budget every batch the process runs at
        once shares; `reuse`: the answers' reuse, told when a sequence is answered or dropped
        (no sequence joins it then)."""
        self.model = model
        self.observer = observer
        self.flight = flight
        self.queues = flight.queues
        self.memory = memory
        self.reuse = reuse
        self._clock = clock
        self._tracing = tracing
        self._attributes = attributes
        self._instances = instances
        self._free = asyncio.Semaphore(instances)
        self._idle = list(range(instances))  # which instances are free: as many as `_free`
        # (one thread more than the instances: the short lane's)
        self._worker = ThreadPoolExecutor(instances + 1, thread_name_prefix=f"run-{model.name}")
        self._long_running = 0  # long batches running now
        self._lane_busy = False  # a short batch runs on the lane
        self._failures = Throttled(log)

    async def run(self) -> None:
        """Form and run batches, forever (until cancelled): each when an instance is free
        (or, for a short one while a long one runs, the lane) and the memory it needs fits
        beside the batches running."""
        unwatch = self.memory.watch(self.flight.arrived.set)  # (memory given back: look again)
        try:
            while True:
                lane = self._lane_open
                if not lane and self._free.locked():  # (until an instance or the lane frees)
                    self.flight.arrived.clear()
                    await self.flight.arrived.wait()
                    continue
                if not lane:
                    await self._free.acquire()  # (one is free: no wait)
                try:
                    batch = await self._next_batch(lane)
                except BaseException:
                    if not lane:
                        self._free.release()
                    raise
                if batch is None:  # (the lane closed, or an instance came free: look again)
                    continue
                key, items, held = batch
                for item in items:
                    item.taken = True
                    for request in item.requests:
                        self.flight.took(request)
                if lane:
                    self._lane_busy = True
                    task = asyncio.create_task(self._execute(key, items, False, self._instances))
                    self.flight.running.add(task)
                    task.add_done_callback(functools.partial(self._finished, [], held))
                    continue
                long = held.need > SHORT_BATCH_BYTES
                lone = (
                    not self.flight.running
                    and not len(self.queues)
                    and len(items) <= self._instances
                    and not long
                )
                every_core = lone and self.model.lone_takes_every_core
                if every_core:  # the other instances, all free, wait for it: it has their cores
                    for _ in range(self._instances - 1):
                        await self._free.acquire()
                taken = [self._idle.pop() for _ in range(self._instances if every_core else 1)]
                self._long_running += long
                task = asyncio.create_task(self._execute(key, items, lone, taken[0]))
                self.flight.running.add(task)
                task.add_done_callback(functools.partial(self._finished, taken, held))
        finally:
            unwatch()
            self.memory.forget(self)
            for task in self.flight.running:
                task.cancel()
            self._worker.shutdown(wait=False, cancel_futures=True)

    @property
    def _lane_open(self) -> bool:
        """Whether a short batch may run on the lane now: every instance busy, a long batch
        among them, the lane free."""
        return self._free.locked() and self._long_running > 0 and not self._lane_busy

    def _finished(self, instances: list[int], held: Held, task: asyncio.Task[None]) -> None:
        """A batch is done: its instances (none: the lane's) and its memory are free again."""
        self._idle += instances
        for _ in instances:
            self._free.release()
        if instances:
            self._long_running -= held.need > SHORT_BATCH_BYTES
        else:
            self._lane_busy = False
        self.flight.running.discard(task)
        self.memory.end(held)
        self.flight.settle_if_idle()

    async def _next_batch(self, lane: bool = False) -> tuple[BucketKey, list[Pending], Held] | None:
        """The next batch that may start, with the memory it holds from now: a ready key
        whose batch does not fit beside those running waits (claiming its room) while
        others that may start go first. `lane`: a short batch for the lane (None once the
        lane has closed: an instance came free, or no long batch runs any more)."""
        while True:
            now = self._clock()
            self._drop(self.queues.purge(now))
            if lane and not self._lane_open:
                return None
            needs: dict[BucketKey, int] = {}
            batch = self.queues.take(now, functools.partial(self._fits, needs, lane))
            if batch is not None:
                key, items = batch
                if not lane:  # (the lane's batches claim nothing: long ones wait in turn)
                    self.memory.wait(self, {k: n for k, n in needs.items() if k != key})
                return key, items, self.memory.start(needs[key], self, key)
            if not lane:
                self.memory.wait(self, needs)
            self.flight.settle_if_idle()
            self.flight.arrived.clear()
            wake = self.queues.next_ready_at(now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.flight.arrived.wait(), None if wake is None else wake - now
                )

    def _fits(
        self, needs: dict[BucketKey, int], lane: bool, key: BucketKey, items: list[Pending]
    ) -> bool:
        """Whether a batch of `items` under `key` may start now, by the memory it needs
        (noted in `needs`, each key's as it was asked); on the lane, only a short one."""
        rows, length = self.model.batch_shape(key, [len(item.sequence) for item in items])
        need = self.model.plan.need(rows, length)
        if lane and need > SHORT_BATCH_BYTES:
            return False
        needs[key] = need
        return self.memory.may_start(need, self, key)

    def _drop(self, dropped: dict[str, list[Pending]]) -> None:
        for reason, items in dropped.items():
            for item in items:
                for future in item.futures:
                    if not future.done():
                        future.set_exception(DeadlineExceeded("deadline passed while queued"))
            self._left(items)
            if items:
                self.observer.dropped(self.model.name, reason, len(items))

    def _left(self, items: Sequence[Pending]) -> None:
        """`items` answered or dropped: no sequence joins them any more."""
        for item in items:
            if item.identity is not None and self.reuse is not None:
                self.reuse.left(item.identity, item)

    def _answers(
        self, key: BucketKey, items: Sequence[Pending], lone: bool
    ) -> list[Outputs | Exception]:
        """In the worker: the batch run, then each sequence's answer made from its outputs
        as its request asked, so that nothing of the batch's outputs outlives it. An answer
        that fails is that sequence's alone."""
        outputs = self.model.run_batch(key, [item.sequence for item in items], lone)
        answers: list[Outputs | Exception] = []
        for item, out in zip(items, outputs, strict=True):
            try:
                answers.append(out if item.finish is None else item.finish(out, item.sequence))
            except Exception as exc:  # (a head's fault is its request's, never the batch's)
                answers.append(exc)
        return answers

    def _failed(self, item: Pending, cause: Exception | None = None) -> InferenceFailed:
        """The error a sequence's requests get when it failed on the server (`cause`: its
        answer's, logged here; a batch's is logged where it failed)."""
        if cause is not None:
            self._failures.log(
                logging.ERROR,
                "answer",
                "model %s: the answer of a sequence of %d steps failed, for request %s",
                self.model.name,
                len(item.sequence),
                item.request_id,
                exc_info=cause,
            )
        return InferenceFailed(
            f"inference failed on the server; its log says why, under request id {item.request_id}"
        )

    async def _execute(
        self, key: BucketKey, items: list[Pending], lone: bool, instance: int = 0
    ) -> None:
        sequences = [item.sequence for item in items]
        lengths = [len(s) for s in sequences]
        self.observer.queue_depth(self.model.name, len(self.queues))
        start = self._clock()
        loop = asyncio.get_running_loop()
        waits = [item.trace for item in items]
        for item in items:  # (a wait ends once, where its first batch begins)
            item.trace = None
        rows, length = self.model.batch_shape(key, lengths)
        traced: dict[str, str | int | float | bool] = {}
        if self._tracing.enabled:
            traced = {
                **self._attributes,
                "bucketserve.bucket": self.model.plan.bucket_of(key.length),
                "bucketserve.sequences": len(items),
                "bucketserve.rows": rows,
                "bucketserve.length": length,
                "bucketserve.padded_tokens": rows * length - sum(lengths),
                "bucketserve.instance": instance,
                "bucketserve.alone": lone,  # (its name in traces users query: kept)
            }
        try:
            with self._tracing.batch(waits, traced):
                answers = await loop.run_in_executor(self._worker, self._answers, key, items, lone)
        except Exception as exc:
            if len(items) > 1:  # the sequence that failed it may be one: each runs alone
                log.info(
                    "model %s: a batch of %d sequences (%s) failed (%s); each runs alone",
                    self.model.name,
                    len(items),
                    key,
                    type(exc).__name__,
                )
                for item in items:
                    await self._execute(key, [item], False, instance)
                return
            ids = sorted({item.request_id for item in items})
            self._failures.log(
                logging.ERROR,
                "batch",
                "model %s: a sequence of %d steps (%s) failed, for request %s",
                self.model.name,
                lengths[0],
                key,
                ", ".join(ids),
                exc_info=exc,
            )
            self._left(items)
            for item in items:  # (the runtime's own words stay in the log: they are no API)
                failed = self._failed(item)
                for future in item.futures:
                    if not future.done():
                        future.set_exception(failed)
        else:
            self._left(items)
            end = self._clock()
            for item, answer, tokens in zip(items, answers, lengths, strict=True):
                for future in item.futures:
                    if future.done():
                        continue
                    if isinstance(answer, Exception):
                        future.set_exception(self._failed(item, answer))
                    else:
                        future.set_result(answer)
                self.observer.served(
                    self.model.name, item.level, item.tenant, start - item.enqueued, tokens
                )
            self.observer.batch_done(
                self.model.name,
                self.model.plan.bucket_of(key.length),  # a configured edge, whatever the key
                lengths,
                (rows, length),
                [start - item.enqueued for item in items],
                end - start,
            )

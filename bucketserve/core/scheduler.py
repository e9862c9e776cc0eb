"""The scheduler, one per model: the single owner of everything between the edge and the
executor. Admission (the engine's drain, queue capacity, deadlines), the length-bucket queues
(pure, in `queues`), the instance pool that runs batches in worker threads, and the one idle
signal. Imports the queues, the bucket plan and the lifecycle below it; never the engine.

`infer` admits a request's sequences or refuses the whole request (503 when draining or full,
504 when its deadline has passed), queues each sequence in its bucket and awaits their outputs
until the deadline. `run` forms a batch whenever an instance is free and the memory it needs
fits beside the batches running (the budget, `memory`, shared with every model), so batches
keep gathering while all are busy, and runs it in a worker thread, telling the model whether
it runs alone: no other batch running, nothing left waiting, no more sequences than there are
instances (a batch that took more found them queued together: load, not a lone request), and
short (`SHORT_BATCH_BYTES`). Where the model then takes every core, such a batch holds every
instance, and batches formed meanwhile wait for it. A ready batch whose memory does not fit
waits, claiming its room, while those that may start go first; while a long batch runs and
every instance is busy, short batches run one at a time on a lane beside them. A failing
batch runs its sequences again one by one, so that only a sequence that fails alone gets an
error. `settled` is when no request is in flight, no sequence queued and no batch running. No
ONNX Runtime here: the model is anything with `plan`, `batch_shape` and `run_batch`.

Each sequence carries its priority level and tenant into the queues, which order by them
(`queues`, `shares`); a tenant over its share of the queue is refused before a full queue
refuses anyone. Where the model's answers were proved independent of batching and padding, the
scheduler owns their reuse (`result_cache.Reuse`, keyed once by each sequence's identity: its
exact inputs and the answer asked, given by the caller wherever the answer depends on the ids
alone): a sequence answered before is answered from the answers kept, one identical to a
sequence queued or running joins it, and only the others are queued. Every request that
resolved to the model is counted in flight from then (`using`), so that `settled` (the drain,
a retiring model) waits for it wherever it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np

from bucketserve.core.bucketing import BucketKey, BucketPlan
from bucketserve.core.layout import Outputs
from bucketserve.core.lifecycle import Lifecycle
from bucketserve.core.memory import Held, MemoryBudget
from bucketserve.core.queues import (
    DEFAULT_MAX_OVERTAKES,
    BucketQueues,
    Finish,
    Pending,
    Request,
)
from bucketserve.core.result_cache import Reuse
from bucketserve.core.shares import Shares
from bucketserve.errors import DeadlineExceeded, InferenceFailed, Unavailable
from bucketserve.logs import Throttled
from bucketserve.tracing import Attributes, Tracing

log = logging.getLogger(__name__)

Clock = Callable[[], float]
# A batch that needs at most this much memory is short; one that needs more is long (its
# need grows with rows x length and rows x length^2, as its time does: seconds, for
# thousands of tokens). A long batch never runs on every core, where it would keep the short
# batches that arrive meanwhile waiting for it; while one runs, a short batch may run beside
# the instances on a lane of its own (one more thread on the cores, for the milliseconds it
# takes). 64 MiB: about 1,000 tokens of a BERT-base, 2,000 of a tiny ModernBERT.
SHORT_BATCH_BYTES = 64 * 2**20


class BatchModel(Protocol):
    """What the scheduler needs of a model (a `bucketserve.core.model.Model`, or a fake in
    tests)."""

    name: str
    plan: BucketPlan

    @property
    def lone_takes_every_core(self) -> bool:
        """Whether a batch that runs alone runs on every core (then it holds every instance)."""

    def batch_shape(self, key: BucketKey, lengths: Sequence[int]) -> tuple[int, int]: ...

    def run_batch(
        self, key: BucketKey, sequences: Sequence[np.ndarray], lone: bool = False
    ) -> list[Outputs]: ...


class Observer(Protocol):
    """Where the scheduler reports what it did (the metrics)."""

    def admitted(self, model: str, lengths: Sequence[int]) -> None: ...

    def reject(self, reason: str, level: int = 0, tenant: str = "") -> None: ...

    def served(self, model: str, level: int, tenant: str, wait_s: float, tokens: int) -> None:
        """A sequence of `level` and `tenant` ran after waiting `wait_s`."""

    def shared(self, model: str, count: int, tokens: int) -> None:
        """`count` sequences (`tokens` together) joined an identical one, not computed."""

    def cache_looked_up(self, model: str, hits: int, misses: int, saved_tokens: int) -> None:
        """A request's sequences looked up in the answers kept: `hits` found (`saved_tokens`
        not computed), `misses` not."""

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


class Scheduler:
    def __init__(
        self,
        model: BatchModel,
        observer: Observer,
        *,
        max_delay_s: float,
        capacity: int,
        instances: int = 1,
        clock: Clock = time.monotonic,
        tracing: Tracing | None = None,
        attributes: Attributes | None = None,
        lifecycle: Lifecycle | None = None,
        shares: Shares | None = None,
        max_overtakes: int = DEFAULT_MAX_OVERTAKES,
        reuse: Reuse | None = None,
        memory: MemoryBudget | None = None,
    ) -> None:
        """`capacity`: sequences that may wait at once. `instances`: batches that may run at
        once, each in its own worker thread, on the model's one set of weights. `tracing`:
        where each sequence's wait and each batch are traced, with `attributes` (the model's
        name and version) on every batch. `lifecycle`: the engine's, whose drain it obeys.
        `shares`: the tenants' weights; `max_overtakes`: how often a sequence may be passed
        over for a better level; `reuse`: the answers' reuse, where the model's cannot depend on
        what they ran with (None: every sequence runs); `memory`: the budget every batch the
        process runs at once shares (a batch starts only when it fits)."""
        self.model = model
        self.capacity = capacity
        self.queues = BucketQueues(max_delay_s, max_overtakes, shares or Shares())
        self.reuse = reuse
        self.admitted = 0  # requests let in since start
        self.answered = 0  # of those, requests whose outputs were handed back
        self.requests_waiting = 0  # admitted, none of their sequences taken into a batch yet
        self.requests_running = 0  # admitted, one of their sequences taken, not answered
        self._observer = observer
        self._clock = clock
        self._lifecycle = lifecycle or Lifecycle()
        self._in_flight = 0
        self._arrived = asyncio.Event()
        self._settled = asyncio.Event()
        self._settled.set()
        self._instances = instances
        self._free = asyncio.Semaphore(instances)
        self._idle = list(range(instances))  # which instances are free: as many as `_free`
        self._tracing = tracing or Tracing()
        self._attributes = dict(attributes or {"bucketserve.model": model.name})
        self._running: set[asyncio.Task[None]] = set()
        # (one thread more than the instances: the short lane's)
        self._worker = ThreadPoolExecutor(instances + 1, thread_name_prefix=f"run-{model.name}")
        self._long_running = 0  # long batches running now
        self._lane_busy = False  # a short batch runs on the lane
        self._failures = Throttled(log)
        self.memory = memory or MemoryBudget(None)

    @property
    def depth(self) -> int:
        return len(self.queues)

    @property
    def queued_tokens(self) -> int:
        return self.queues.tokens

    # -- admission --------------------------------------------------------------------------

    def refuse_now(self, count: int, level: int = 1, tenant: str = "") -> None:
        """Refuse a request of `count` sequences that could not be admitted now (draining, its
        tenant over its share of the queue, or the queue full), before the edge spends work on
        it (tokenising its texts)."""
        if self._lifecycle.draining:
            self._observer.reject("draining", level, tenant)
            raise Unavailable("the server is draining; retry on another replica")
        if self.queues.shares.over_share(tenant, count, self.capacity):
            self._observer.reject("tenant_share", level, tenant)
            raise Unavailable(
                f"model {self.model.name}: this tenant holds its share of the queue "
                f"({self.queues.shares.room(tenant, self.capacity)} sequences now); retry later"
            )
        if self.depth + count > self.capacity:
            self._observer.reject("queue_full", level, tenant)
            raise Unavailable(
                f"model {self.model.name}: queue full ({self.capacity} sequences); retry later"
            )

    def refuse_past(self, deadline: float, level: int = 1, tenant: str = "") -> float:
        """Refuse (504) a request whose deadline has passed, answered or not yet; the time
        now, otherwise. The one deadline check at admission, the cache's answers' too."""
        now = self._clock()
        if deadline <= now:
            self._observer.reject("deadline", level, tenant)
            raise DeadlineExceeded("the deadline passed before the request was queued")
        return now

    def admit(
        self,
        sequences: Sequence[np.ndarray],
        deadline: float,
        request_id: str = "",
        level: int = 1,
        tenant: str = "",
        identities: Sequence[bytes] | None = None,
        finishes: Sequence[Finish] | None = None,
        request: Request | None = None,
    ) -> list[asyncio.Future[Outputs]]:
        """Let a request's validated sequences in, each into its bucket (or joining an
        identical one in flight), or refuse the request whole. One future per sequence, in
        order. `identities`: their exact inputs and the answer asked, where identical ones may
        share a run; `finishes`: each one's answer from its outputs, made in the worker;
        `request`: the request, counted waiting until a batch takes one of its sequences."""
        name = self.model.name
        self.refuse_now(len(sequences), level, tenant)
        now = self.refuse_past(deadline, level, tenant)
        self._observer.admitted(name, [len(s) for s in sequences])
        if request is not None:
            self.requests_waiting += 1
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Outputs]] = []
        joined = joined_tokens = 0
        for i, seq in enumerate(sequences):
            future: asyncio.Future[Outputs] = loop.create_future()
            futures.append(future)
            identity = identities[i] if identities is not None and self.reuse else None
            leader = None if identity is None or self.reuse is None else self.reuse.leader(identity)
            if leader is not None:
                self.queues.join(leader, future, deadline, level)
                joined, joined_tokens = joined + 1, joined_tokens + len(seq)
                if request is not None:
                    leader.requests.append(request)
                    if leader.taken:  # (it rides on a sequence already running)
                        self._took(request)
                continue
            pending = Pending(
                seq, future, now, deadline, request_id, self._tracing.queued(), level, tenant
            )
            pending.requests = [] if request is None else [request]
            pending.finish = None if finishes is None else finishes[i]
            if identity is not None and self.reuse is not None:
                pending.identity = identity
                self.reuse.lead(identity, pending)
            self.queues.add(self.model.plan.key_for(len(seq)), pending)
        if joined:
            self._observer.shared(name, joined, joined_tokens)
        self.admitted += 1
        self._observer.queue_depth(name, self.depth)
        self._arrived.set()
        self._settled.clear()
        return futures

    async def infer(
        self,
        sequences: Sequence[np.ndarray],
        deadline: float,
        request_id: str = "",
        level: int = 1,
        tenant: str = "",
        identities: Sequence[bytes] | None = None,
        finishes: Sequence[Finish] | None = None,
    ) -> list[Outputs]:
        """The sequences' answers (`finishes`' answers from their outputs, else the outputs),
        in order: those kept (under `identities`), the others admitted and awaited until the
        deadline, then kept."""
        with self.using():
            if identities is None or self.reuse is None:
                return await self._run(
                    sequences, deadline, request_id, level, tenant, None, finishes
                )
            self.refuse_past(deadline, level, tenant)  # (a request too late, kept or not)
            found = [self.reuse.answer(key) for key in identities]
            missing = [i for i, out in enumerate(found) if out is None]
            saved = sum(len(s) for s, out in zip(sequences, found, strict=True) if out is not None)
            self._observer.cache_looked_up(
                self.model.name, len(found) - len(missing), len(missing), saved
            )
            if not missing:  # (answered whole from what was kept: admitted and answered here)
                self.admitted, self.answered = self.admitted + 1, self.answered + 1
                return [out for out in found if out is not None]
            ran = await self._run(
                [sequences[i] for i in missing],
                deadline,
                request_id,
                level,
                tenant,
                [identities[i] for i in missing],
                None if finishes is None else [finishes[i] for i in missing],
            )
            for i, answer in zip(missing, ran, strict=True):
                found[i] = answer
                self.reuse.keep(identities[i], answer)
            return [out for out in found if out is not None]

    def answered_alone(self) -> None:
        """A request answered without a run (the tokenizer alone): counted as admitted and
        answered, as the drain's tally reads them."""
        self.admitted, self.answered = self.admitted + 1, self.answered + 1

    @contextlib.contextmanager
    def using(self) -> Iterator[None]:
        """A request in flight for the model, from the moment it resolved to it: `settled`
        (the drain, a retiring model) waits until it has left."""
        self._in_flight += 1
        self._settled.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            self._settle_if_idle()

    async def _run(
        self,
        sequences: Sequence[np.ndarray],
        deadline: float,
        request_id: str,
        level: int,
        tenant: str,
        identities: Sequence[bytes] | None,
        finishes: Sequence[Finish] | None,
    ) -> list[Outputs]:
        """Admit the sequences and wait for their answers, in order, until the deadline."""
        request = Request(len(sequences))
        futures = self.admit(
            sequences, deadline, request_id, level, tenant, identities, finishes, request
        )
        try:
            # asyncio.wait, not wait_for(gather(...)): cancelling a gather under wait_for leaves
            # a CancelledError on it that nobody retrieves, logged when a client goes away.
            remaining = deadline - self._clock()
            done, _ = await asyncio.wait(futures, timeout=max(remaining, 0))
            if len(done) < len(futures):
                raise DeadlineExceeded(f"no answer within the deadline ({remaining * 1000:.0f} ms)")
            failures = [f.exception() for f in futures]  # every one retrieved, none logged
            failed = [i for i, e in enumerate(failures) if e is not None]
            if failed:
                first = failures[failed[0]]
                if isinstance(first, InferenceFailed) and len(futures) > 1:
                    which = ", ".join(map(str, failed))
                    raise InferenceFailed(f"sequence {which} of {len(futures)}: {first}")
                assert first is not None
                raise first
            self.answered += 1
            return [f.result() for f in futures]
        finally:
            for future in futures:  # a failed or abandoned request leaves nothing to compute
                future.cancel()
            if request.started:
                self.requests_running -= 1
            else:
                self.requests_waiting -= 1
            self._arrived.set()  # the loop purges what was left queued

    async def settled(self) -> None:
        """Until no request is in flight, no sequence is queued and no batch is running."""
        await self._settled.wait()

    def _settle_if_idle(self) -> None:
        if not self._in_flight and not len(self.queues) and not self._running:
            self._settled.set()

    # -- batches ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Form and run batches, forever (until cancelled): each when an instance is free
        (or, for a short one while a long one runs, the lane) and the memory it needs fits
        beside the batches running."""
        unwatch = self.memory.watch(self._arrived.set)  # (memory given back: look again)
        try:
            while True:
                lane = self._lane_open
                if not lane and self._free.locked():  # (until an instance or the lane frees)
                    self._arrived.clear()
                    await self._arrived.wait()
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
                        self._took(request)
                if lane:
                    self._lane_busy = True
                    task = asyncio.create_task(self._execute(key, items, False, self._instances))
                    self._running.add(task)
                    task.add_done_callback(functools.partial(self._finished, [], held))
                    continue
                long = held.need > SHORT_BATCH_BYTES
                lone = (
                    not self._running
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
                self._running.add(task)
                task.add_done_callback(functools.partial(self._finished, taken, held))
        finally:
            unwatch()
            self.memory.forget(self)
            for task in self._running:
                task.cancel()
            self._worker.shutdown(wait=False, cancel_futures=True)

    @property
    def _lane_open(self) -> bool:
        """Whether a short batch may run on the lane now: every instance busy, a long batch
        among them, the lane free."""
        return self._free.locked() and self._long_running > 0 and not self._lane_busy

    def _took(self, request: Request) -> None:
        """A batch took one of `request`'s sequences: running, if it was waiting."""
        request.queued -= 1
        if not request.started:
            request.started = True
            self.requests_waiting -= 1
            self.requests_running += 1

    def _finished(self, instances: list[int], held: Held, task: asyncio.Task[None]) -> None:
        """A batch is done: its instances (none: the lane's) and its memory are free again."""
        self._idle += instances
        for _ in instances:
            self._free.release()
        if instances:
            self._long_running -= held.need > SHORT_BATCH_BYTES
        else:
            self._lane_busy = False
        self._running.discard(task)
        self.memory.end(held)
        self._settle_if_idle()

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
            self._settle_if_idle()
            self._arrived.clear()
            wake = self.queues.next_ready_at(now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), None if wake is None else wake - now)

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
                self._observer.dropped(self.model.name, reason, len(items))

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
        self._observer.queue_depth(self.model.name, self.depth)
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
                self._observer.served(
                    self.model.name, item.level, item.tenant, start - item.enqueued, tokens
                )
            self._observer.batch_done(
                self.model.name,
                self.model.plan.bucket_of(key.length),  # a configured edge, whatever the key
                lengths,
                (rows, length),
                [start - item.enqueued for item in items],
                end - start,
            )

"""Admission, one model's: who gets in, and waiting for the answers. A request's sequences are
admitted whole or refused whole (503 when draining, its tenant over its share of the queue,
or the queue full; 504 when its deadline has passed), each queued in its bucket (`queues`) or
joining an identical one in flight, then awaited until the deadline. Where the model's
answers were proved independent of batching and padding, admission owns their reuse
(`result_cache.Reuse`, keyed once by each sequence's identity: its exact inputs and the answer
asked): a sequence answered before is answered from the answers kept, one identical to a
sequence queued or running joins it, and only the others are queued. Every request that
resolved to the model is counted in flight from then (`using`), so that `settled` waits for
it wherever it is. What is admitted is the batch loop's (`batch_loop`) to run; the two share
the model's `Flight`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence

import numpy as np

from bucketserve.core.flight import BatchModel, Clock, Flight, Observer
from bucketserve.core.layout import Outputs
from bucketserve.core.lifecycle import Lifecycle
from bucketserve.core.queues import Finish, Pending, Request
from bucketserve.core.result_cache import Reuse
from bucketserve.errors import DeadlineExceeded, InferenceFailed, Unavailable
from bucketserve.tracing import Tracing


class Admission:
    def __init__(
        self,
        model: BatchModel,
        observer: Observer,
        flight: Flight,
        *,
        capacity: int,
        clock: Clock,
        tracing: Tracing,
        lifecycle: Lifecycle,
        reuse: Reuse | None,
    ) -> None:
        """`capacity`: sequences that may wait at once; `lifecycle`: the engine's, whose drain
        it obeys; `reuse`: the answers' reuse (None: every sequence runs)."""
        self.model = model
        self.observer = observer
        self.flight = flight
        self.queues = flight.queues
        self.capacity = capacity
        self.reuse = reuse
        self.admitted = 0  # requests let in since start
        self.answered = 0  # of those, requests whose outputs were handed back
        self._clock = clock
        self._tracing = tracing
        self._lifecycle = lifecycle

    def refuse_now(self, count: int, level: int = 1, tenant: str = "") -> None:
        """Refuse a request of `count` sequences that could not be admitted now (draining, its
        tenant over its share of the queue, or the queue full), before the edge spends work on
        it (tokenising its texts)."""
        if self._lifecycle.draining:
            self.observer.reject("draining", level, tenant)
            raise Unavailable("the server is draining; retry on another replica")
        if self.queues.shares.over_share(tenant, count, self.capacity):
            self.observer.reject("tenant_share", level, tenant)
            raise Unavailable(
                f"model {self.model.name}: this tenant holds its share of the queue "
                f"({self.queues.shares.room(tenant, self.capacity)} sequences now); retry later"
            )
        if len(self.queues) + count > self.capacity:
            self.observer.reject("queue_full", level, tenant)
            raise Unavailable(
                f"model {self.model.name}: queue full ({self.capacity} sequences); retry later"
            )

    def refuse_past(self, deadline: float, level: int = 1, tenant: str = "") -> float:
        """Refuse (504) a request whose deadline has passed, answered or not yet; the time
        now, otherwise. The one deadline check at admission, the cache's answers' too."""
        now = self._clock()
        if deadline <= now:
            self.observer.reject("deadline", level, tenant)
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
        self.observer.admitted(name, [len(s) for s in sequences])
        if request is not None:
            self.flight.requests_waiting += 1
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
                        self.flight.took(request)
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
            self.observer.shared(name, joined, joined_tokens)
        self.admitted += 1
        self.observer.queue_depth(name, len(self.queues))
        self.flight.arrived.set()
        self.flight.settled.clear()
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
            self.observer.cache_looked_up(
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
        self.flight.in_flight += 1
        self.flight.settled.clear()
        try:
            yield
        finally:
            self.flight.in_flight -= 1
            self.flight.settle_if_idle()

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
                self.flight.requests_running -= 1
            else:
                self.flight.requests_waiting -= 1
            self.flight.arrived.set()  # the loop purges what was left queued

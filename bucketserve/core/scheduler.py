"""The scheduler, one per model: the single owner of everything between the edge and the
executor, made of two parts over one model's work in flight (`flight`): its admission
(`admission`: the engine's drain, queue capacity, tenants' shares, deadlines, the answers'
reuse, the requests in flight) and its batch loop (`batch_loop`: batches formed from the
length-bucket queues, pure in `queues`, and run on the instances inside the memory budget).
Imports them and the queues below them; never the engine. No ONNX Runtime here: the model is
anything with `plan`, `batch_shape` and `run_batch`.

Each sequence carries its priority level and tenant into the queues, which order by them
(`queues`, `shares`); a tenant over its share of the queue is refused before a full queue
refuses anyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sequence

import numpy as np

from bucketserve.core.admission import Admission
from bucketserve.core.batch_loop import BatchLoop
from bucketserve.core.budget import MemoryBudget
from bucketserve.core.flight import BatchModel, Clock, Flight, Observer
from bucketserve.core.layout import Outputs
from bucketserve.core.lifecycle import Lifecycle
from bucketserve.core.queues import DEFAULT_MAX_OVERTAKES, BucketQueues, Finish, Request
from bucketserve.core.result_cache import Reuse
from bucketserve.core.shares import Shares
from bucketserve.tracing import Attributes, Tracing

__all__ = ["BatchModel", "Observer", "Scheduler"]


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
        self.queues = BucketQueues(max_delay_s, max_overtakes, shares or Shares())
        self.flight = Flight(self.queues)
        self.memory = memory or MemoryBudget(None)
        traced = tracing or Tracing()
        self.admission = Admission(
            model,
            observer,
            self.flight,
            capacity=capacity,
            clock=clock,
            tracing=traced,
            lifecycle=lifecycle or Lifecycle(),
            reuse=reuse,
        )
        self.batches = BatchLoop(
            model,
            observer,
            self.flight,
            instances=instances,
            clock=clock,
            tracing=traced,
            attributes=dict(attributes or {"bucketserve.model": model.name}),
            memory=self.memory,
            reuse=reuse,
        )

    # -- what is in flight ------------------------------------------------------------------

    @property
    def reuse(self) -> Reuse | None:
        return self.admission.reuse

    @property
    def capacity(self) -> int:
        return self.admission.capacity

    @property
    def depth(self) -> int:
        return len(self.queues)

    @property
    def queued_tokens(self) -> int:
        return self.queues.tokens

    @property
    def admitted(self) -> int:
        """Requests let in since start."""
        return self.admission.admitted

    @property
    def answered(self) -> int:
        """Of those, requests whose outputs were handed back."""
        return self.admission.answered

    @property
    def requests_waiting(self) -> int:
        return self.flight.requests_waiting

    @property
    def requests_running(self) -> int:
        return self.flight.requests_running

    async def settled(self) -> None:
        """Until no request is in flight, no sequence is queued and no batch is running."""
        await self.flight.settled.wait()

    # -- admission --------------------------------------------------------------------------

    def refuse_now(self, count: int, level: int = 1, tenant: str = "") -> None:
        self.admission.refuse_now(count, level, tenant)

    def refuse_past(self, deadline: float, level: int = 1, tenant: str = "") -> float:
        return self.admission.refuse_past(deadline, level, tenant)

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
        return self.admission.admit(
            sequences, deadline, request_id, level, tenant, identities, finishes, request
        )

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
        return await self.admission.infer(
            sequences, deadline, request_id, level, tenant, identities, finishes
        )

    def answered_alone(self) -> None:
        self.admission.answered_alone()

    @contextlib.contextmanager
    def using(self) -> Iterator[None]:
        with self.admission.using():
            yield

    # -- batches ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Form and run batches, forever (until cancelled)."""
        await self.batches.run()

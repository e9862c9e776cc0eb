"""The bucket queues, pure: one queue per bucket key, and the rule that forms a batch from them.

Given the time explicitly, so tests assert exact batch compositions; no asyncio loop runs
here. The rule, per key: the first sequence waits; the batch fills until it holds the key's
capacity, or until `max_delay` has passed since that first sequence. Sequences whose client
went away (every future done) or whose deadline passed are dropped before they are computed.

Which ready key runs, and which of its sequences: the best priority level first (1 is the
best, as in Triton); within a level, the tenant furthest behind its share of the tokens
(`shares`); then the earliest deadline, so a rare bucket never starves. A sequence that would
have run in arrival order, passed over `max_overtakes` times for a better level, counts as
the best level from then on, so bulk work always moves (but bulk jobs', `BULK_LEVEL`, which
run only where requests leave room). A level only chooses which key runs next
and who rides in its batch: batches still form by length, never padded further for it; while
a better level is sending, a worse level's batches are shorter (fewer rows), so that a query
never waits for a long one.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from math import inf
from typing import Any

import numpy as np

from bucketserve.core.bucketing import BucketKey
from bucketserve.core.layout import Outputs
from bucketserve.core.shares import Shares
from bucketserve.settings import BULK_LEVEL

PROMOTED = 0  # the level of a sequence overtaken as often as it may be: before every other
DEFAULT_MAX_OVERTAKES = 16
# While a better level has sent work within the last second, a batch of a worse level takes
# at most a third of its key's rows, so that a query arriving while it runs waits less; on a
# CPU, where a batch costs per token, three short batches cost about what one long one does.
# Measured on minilm under a flood (loadtest.scheduling_bench, 12 s): a query's p99 was 177
# ms (a third) against 229 (a half) and 165 (a quarter); the bulk job kept 0.85x of its
# speed alone, against 0.98x and 0.81x.
BETTER_LEVEL_RECENT_S = 1.0
ROWS_BELOW_A_BETTER_LEVEL = 3


# A sequence's answer from its outputs (and its steps): its request's task head, run in the
# worker thread as its batch finishes.
Finish = Callable[[Outputs, np.ndarray], Outputs]
# Whether a batch of these sequences under this key may start now (the memory budget)
Fits = Callable[["BucketKey", list["Pending"]], bool]


@dataclass(eq=False)
class Request:
    """A request admitted, as routers count them: waiting until a batch takes one of its
    sequences, then running until it is answered."""

    queued: int  # its sequences not taken into a batch yet
    started: bool = False


@dataclass(eq=False)
class Pending:
    """One sequence waiting in a bucket queue; its future gets that sequence's answer (its
    outputs, `finish`ed), as do the futures of identical sequences that joined it (`joined`:
    computed once for all, under the same head)."""

    sequence: np.ndarray
    future: asyncio.Future[Outputs]
    enqueued: float
    deadline: float
    request_id: str = ""  # whose sequence it is, for the log
    trace: Any = None  # its wait in the queue, as tracing keeps it (None when off)
    level: int = 1  # its priority: 1 goes first
    tenant: str = ""  # whose share it is charged to
    identity: bytes | None = None  # its exact inputs, where identical ones share one run
    finish: Finish | None = None  # its answer from its outputs, in the worker (None: them)
    overtaken: int = 0  # times a batch of a better level was taken while it was ready
    joined: list[asyncio.Future[Outputs]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)  # whose sequence it is (and joined)
    taken: bool = False  # a batch took it

    @property
    def futures(self) -> list[asyncio.Future[Outputs]]:
        return [self.future, *self.joined]

    @property
    def abandoned(self) -> bool:
        """Whether nobody waits for it any more (each request that did has gone)."""
        return all(f.done() for f in self.futures)

    def join(self, future: asyncio.Future[Outputs], deadline: float, level: int) -> None:
        """An identical sequence rides on this one: its answer is this one's."""
        self.joined.append(future)
        self.deadline = max(self.deadline, deadline)
        self.level = min(self.level, level)


@dataclass
class BucketQueues:
    max_delay: float
    max_overtakes: int = DEFAULT_MAX_OVERTAKES
    shares: Shares = field(default_factory=Shares)
    queues: dict[BucketKey, deque[Pending]] = field(default_factory=dict)
    _count: int = 0  # sequences waiting
    tokens: int = 0  # their steps
    _levels: set[int] = field(default_factory=set)  # levels seen since the queues were empty
    _arrived: dict[int, float] = field(default_factory=dict)  # each level's latest arrival

    def __len__(self) -> int:
        return self._count

    def add(self, key: BucketKey, item: Pending) -> None:
        self.queues.setdefault(key, deque()).append(item)
        self.shares.arrive(item.tenant)
        self.tokens += len(item.sequence)
        self._levels.add(item.level)
        self._arrived[item.level] = max(item.enqueued, self._arrived.get(item.level, item.enqueued))
        self._count += 1

    def join(
        self, leader: Pending, future: asyncio.Future[Outputs], deadline: float, level: int
    ) -> None:
        """An identical sequence joins `leader` (queued, or already running)."""
        leader.join(future, deadline, level)
        self._levels.add(leader.level)

    def _left(self, items: list[Pending]) -> None:
        for item in items:
            self.shares.leave(item.tenant)
            self.tokens -= len(item.sequence)
        self._count -= len(items)
        if not self._count:
            self._levels.clear()

    def purge(self, now: float) -> dict[str, list[Pending]]:
        """Remove sequences that must not be computed: abandoned, or past their deadline."""
        dropped: dict[str, list[Pending]] = {"cancelled": [], "expired": []}
        for key, queue in self.queues.items():
            keep: deque[Pending] = deque()
            for item in queue:
                if item.deadline <= now:  # first: a request that timed out also cancels
                    dropped["expired"].append(item)
                elif item.abandoned:
                    dropped["cancelled"].append(item)
                else:
                    keep.append(item)
            self.queues[key] = keep
        self._left([*dropped["expired"], *dropped["cancelled"]])
        return dropped

    def _ready(self, key: BucketKey, queue: deque[Pending], now: float) -> bool:
        return len(queue) >= key.rows or now >= queue[0].enqueued + self.max_delay

    def level(self, item: Pending) -> int:
        """The level it is taken at: its own, or the best once overtaken enough (bulk work
        never is: it fills what the levels of requests leave)."""
        promoted = item.overtaken >= self.max_overtakes and item.level != BULK_LEVEL
        return PROMOTED if promoted else item.level

    def take(self, now: float, fits: Fits | None = None) -> tuple[BucketKey, list[Pending]] | None:
        """The next batch to run, or None when no key is ready yet. `fits`: whether a batch
        may start now (the memory budget); a ready key whose batch may not is passed over
        for the next one, and stays queued."""
        ready = [k for k, q in self.queues.items() if q and self._ready(k, q, now)]
        if not ready:
            return None
        if len(self._levels) <= 1 and len(self.shares.waiting) <= 1:  # (arrival order)
            for key in sorted(ready, key=lambda k: min(item.deadline for item in self.queues[k])):
                queue = self.queues[key]
                rows = self._rows(key, queue[0].level, now)
                chosen = list(itertools.islice(queue, min(rows, len(queue))))
                if fits is None or fits(key, chosen):
                    return key, self._taken(key, chosen)
            return None
        account = self.shares.account
        ranks = {
            k: min((self.level(i), account(i.tenant), i.deadline) for i in self.queues[k])
            for k in ready
        }
        for key in sorted(ready, key=ranks.__getitem__):
            # (a batch promoted for its overtakes runs first, but still short while queries come)
            own = min(item.level for item in self.queues[key])
            chosen = self._fill(key, self._rows(key, own, now))
            if fits is None or fits(key, chosen):
                taken = self._taken(key, chosen)
                self._passed_over(ready, ranks[key][0])
                return key, taken
        return None

    def _taken(self, key: BucketKey, chosen: list[Pending]) -> list[Pending]:
        """`chosen` out of the key's queue, charged to their tenants."""
        picked = set(map(id, chosen))
        self.queues[key] = deque(item for item in self.queues[key] if id(item) not in picked)
        for item in chosen:
            self.shares.charge(item.tenant, len(item.sequence))
        self._left(chosen)
        return chosen

    def _passed_over(self, ready: list[BucketKey], best: int) -> None:
        """A batch of level `best` ran: the batch that would have run in arrival order (the
        ready key with the earliest deadline, its first rows) was passed over, if its
        sequences are of a worse level. Only they count it: sequences further back waited
        for their own level's work, not for the better level."""
        key = min(ready, key=lambda k: min((i.deadline for i in self.queues[k]), default=inf))
        for item in list(self.queues[key])[: key.rows]:
            if self.level(item) > best:
                item.overtaken += 1

    def _rows(self, key: BucketKey, level: int, now: float) -> int:
        """How many rows a batch of `level` may take from `key` now: all of them, or a
        third while a better level has sent work recently."""
        recent = now - BETTER_LEVEL_RECENT_S
        if any(better < level and at >= recent for better, at in self._arrived.items()):
            return max(1, key.rows // ROWS_BELOW_A_BETTER_LEVEL)
        return key.rows

    def _fill(self, key: BucketKey, rows: int) -> list[Pending]:
        """Up to `rows`, of the key's queue (left in it): the best levels first; within a
        level, one sequence at a time to the tenant furthest behind, counting what the batch
        already gives it; each tenant's in the order they came."""
        queue = self.queues[key]
        classes: dict[tuple[int, str], deque[Pending]] = {}
        for item in queue:
            classes.setdefault((self.level(item), item.tenant), deque()).append(item)
        if len(classes) == 1:  # (the common case: first come, first served)
            return list(itertools.islice(queue, min(rows, len(queue))))
        accounts = {tenant: self.shares.account(tenant) for _, tenant in classes}
        taken: list[Pending] = []
        while len(taken) < rows and classes:
            level = min(lvl for lvl, _ in classes)
            tenant = min((t for lvl, t in classes if lvl == level), key=accounts.__getitem__)
            group = classes[(level, tenant)]
            item = group.popleft()
            if not group:
                del classes[(level, tenant)]
            taken.append(item)
            accounts[tenant] += len(item.sequence) / self.shares.weight(tenant)
        return taken

    def next_ready_at(self, now: float) -> float | None:
        """When the next key not ready now reaches its max delay, or the next deadline of a
        sequence waiting passes (None when nothing waits): a ready key left queued waits for
        room, not for time."""
        wakes = [
            q[0].enqueued + self.max_delay
            for k, q in self.queues.items()
            if q and not self._ready(k, q, now)
        ]
        wakes += [min(item.deadline for item in q) for q in self.queues.values() if q]
        return min(wakes) if wakes else None

"""The bucket queues, pure: one FIFO per bucket key, and the rule that forms a batch from them.

Given the time explicitly, so tests assert exact batch compositions; no asyncio loop runs
here. The rule, per key: the first sequence waits; the batch fills until it holds the key's
capacity, or until `max_delay` has passed since that first sequence. Among keys that are
ready, the one holding the earliest deadline goes first, so a rare bucket never starves.
Sequences whose client went away (future already done) or whose deadline passed are dropped
before they are computed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bucketserve.core.bucketing import BucketKey
from bucketserve.core.layout import Outputs


@dataclass(eq=False)
class Pending:
    """One sequence waiting in a bucket queue; its future gets that sequence's outputs."""

    sequence: np.ndarray
    future: asyncio.Future[Outputs]
    enqueued: float
    deadline: float
    request_id: str = ""  # whose sequence it is, for the log
    trace: Any = None  # its wait in the queue, as tracing keeps it (None when off)


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

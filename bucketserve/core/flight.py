"""What one model has in flight, shared by its admission (`admission`) and its batch loop
(`batch_loop`): the length-bucket queues, the requests admitted and not answered yet (waiting,
then running), the batches running, and the two signals between the two: work arrived (the
loop looks again) and everything settled (the drain and a retiring model wait for it). Also
what both need of the model (`BatchModel`) and where both report (`Observer`). No ONNX Runtime
here: the model is anything with `plan`, `batch_shape` and `run_batch`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from bucketserve.core.bucketing import BucketKey, BucketPlan
from bucketserve.core.layout import Outputs
from bucketserve.core.queues import BucketQueues, Request

Clock = Callable[[], float]


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


class Flight:
    """One model's work in flight: what its admission lets in and its batch loop takes out."""

    def __init__(self, queues: BucketQueues) -> None:
        self.queues = queues
        self.arrived = asyncio.Event()  # work arrived, or left: the loop looks again
        self.settled = asyncio.Event()  # no request in flight, nothing queued, nothing running
        self.settled.set()
        self.in_flight = 0  # requests that resolved to the model and have not left
        self.running: set[asyncio.Task[None]] = set()  # the batches running
        self.requests_waiting = 0  # admitted, none of their sequences taken into a batch yet
        self.requests_running = 0  # admitted, one of their sequences taken, not answered

    def took(self, request: Request) -> None:
        """A batch took one of `request`'s sequences: running, if it was waiting."""
        request.queued -= 1
        if not request.started:
            request.started = True
            self.requests_waiting -= 1
            self.requests_running += 1

    def settle_if_idle(self) -> None:
        if not self.in_flight and not len(self.queues) and not self.running:
            self.settled.set()

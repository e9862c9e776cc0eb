"""The engine: the ready models of a repository, and the batchers that feed them.

Built from models that `serve.loading` made ready (or fakes, in tests); it never loads anything.
The HTTP layer talks to this object alone: `model(name)` to validate at the edge, `infer(...)`
to queue and await, `drain()` on SIGTERM. Without a running event loop it is also the Python
API (`model(name).predict`).

Admission happens here: a bounded queue per model (503 + Retry-After when full), a deadline
per request (504 when it passes; a sequence still queued then is never computed), and no new
work once draining.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence

import numpy as np

from serve.batcher import Batcher, Outputs
from serve.errors import DeadlineExceeded, ModelNotFound, ModelNotReady, Unavailable
from serve.metrics import Metrics
from serve.model import Model
from serve.settings import Settings

log = logging.getLogger(__name__)


class Engine:
    def __init__(
        self,
        models: Mapping[str, Model],
        default_model: str | None = None,
        settings: Settings | None = None,
        instances: int = 1,
        failed: Mapping[str, str] | None = None,
    ) -> None:
        """Serve ready models (`serve.loading.load_engine` builds them from a repository).
        `instances`: batches of one model that may run at once. `failed`: models of the
        repository that did not load, and why (reported, never served)."""
        self.models = dict(models)
        self.failed = dict(failed or {})
        self.default_model = default_model
        self.settings = settings or Settings()
        self.instances = instances
        self.batchers: dict[str, Batcher] = {}
        self.draining = False
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight = 0
        self.admitted = 0  # requests queued since start
        self.answered = 0  # of those, requests whose outputs were handed back
        self._settled: asyncio.Event | None = None

    def model(self, name: str | None = None) -> Model:
        name = name or self.default_model
        if name is None:
            raise ModelNotFound("no model named, and the repository has no default model")
        if name in self.failed:  # (a retry finds it failed until the server restarts)
            raise ModelNotReady(f"model {name} did not load: {self.failed[name]}", retry_after_s=60)
        try:
            return self.models[name]
        except KeyError:
            raise ModelNotFound(f"unknown model '{name}' (have {sorted(self.models)})") from None

    # -- serving (inside an event loop) --------------------------------------------------

    def start(self, metrics: Metrics) -> None:
        """Start one batcher per model; call from the running event loop."""
        self._metrics = metrics
        self._settled = asyncio.Event()
        self._settled.set()
        for name, model in self.models.items():
            delay = model.info.max_queue_delay_s
            batcher = Batcher(model, delay, metrics, instances=self.instances)
            self.batchers[name] = batcher
            self._tasks.append(asyncio.create_task(batcher.run(), name=f"batcher-{name}"))
            metrics.watch_bound_keys(name, model.executor.bound_key_count)
            info = model.info
            metrics.model_loaded(
                name, info.version, model.strategy, info.plan.policy.value, info.invariance
            )
        for name in self.failed:
            metrics.model_failed(name)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def deadline(self, timeout_ms: float | None) -> float:
        """A request's deadline: the server default, which the client may shorten, not extend."""
        limit = self.settings.request_timeout_ms
        ms = limit if timeout_ms is None else min(timeout_ms, limit)
        return time.monotonic() + ms / 1000

    async def infer(
        self, model: Model, sequences: Sequence[np.ndarray], deadline: float
    ) -> list[Outputs]:
        """Queue validated sequences and wait for their outputs, in order."""
        if self.draining:
            self._metrics.reject("draining")
            raise Unavailable("the server is draining; retry on another replica")
        batcher = self.batchers[model.name]
        capacity = model.info.queue_capacity
        if batcher.depth + len(sequences) > capacity:
            self._metrics.reject("queue_full")
            raise Unavailable(f"model {model.name}: queue full ({capacity} sequences); retry later")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self._metrics.reject("deadline")
            raise DeadlineExceeded("the deadline passed before the request was queued")
        self._metrics.admitted(model.name, [len(s) for s in sequences])
        futures = batcher.submit(sequences, deadline)
        assert self._settled is not None
        self.admitted += 1
        self._inflight += 1
        self._settled.clear()
        try:
            # asyncio.wait, not wait_for(gather(...)): cancelling a gather under wait_for leaves
            # a CancelledError on it that nobody retrieves, logged when a client goes away.
            done, _ = await asyncio.wait(futures, timeout=remaining)
            if len(done) < len(futures):
                raise DeadlineExceeded(f"no answer within the deadline ({remaining * 1000:.0f} ms)")
            failures = [f.exception() for f in futures]  # every one retrieved, none logged
            first = next((e for e in failures if e is not None), None)
            if first is not None:
                raise first
            self.answered += 1
            return [f.result() for f in futures]
        finally:
            for future in futures:  # a failed or abandoned request leaves nothing to compute
                future.cancel()
            self._inflight -= 1
            if self._inflight == 0:
                self._settled.set()

    async def drain(self) -> bool:
        """Refuse new work, wait until everything admitted is answered; False on timeout.
        Said once in the log, however many callers wait (SIGTERM, then the app's shutdown)."""
        first = not self.draining
        self.draining = True
        assert self._settled is not None
        try:
            await asyncio.wait_for(self._settled.wait(), self.settings.drain_timeout_s)
        except TimeoutError:
            log.error(
                "drain: admitted requests still running after %.0f s", self.settings.drain_timeout_s
            )
            return False
        if first:
            log.info(
                "drained: %d requests admitted since start, %d answered",
                self.admitted,
                self.answered,
            )
        return True

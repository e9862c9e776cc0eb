"""The engine: the ready models of a repository, each with its scheduler. It wires; it does
not count.

Built from models that `serve.loading` made ready (or fakes, in tests); it never loads anything.
The HTTP layer talks to this object alone: `model(name)` to validate at the edge, `infer(...)`
to hand validated sequences to the model's scheduler (which admits or refuses them), `drain()`
on SIGTERM. Without a running event loop it is also the Python API (`model(name).predict`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence

import numpy as np

from serve.errors import InvalidInput, ModelNotFound, ModelNotReady
from serve.layout import Outputs
from serve.metrics import Metrics
from serve.model import Model
from serve.scheduler import Scheduler
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
        self.schedulers: dict[str, Scheduler] = {}
        self.draining = False
        self._tasks: list[asyncio.Task[None]] = []

    def model(self, name: str | None = None) -> Model:
        name = name or self.default_model
        if name is None:
            raise ModelNotFound("no model named, and the repository has no default model")
        if name in self.failed:  # (a retry finds it failed until the server restarts)
            raise ModelNotReady(f"model {name} did not load: {self.failed[name]}", retry_after_s=60)
        try:
            return self.models[name]
        except KeyError:
            shown = name if len(name) <= 64 else name[:64] + "..."
            raise ModelNotFound(f"unknown model {shown!r} (have {sorted(self.models)})") from None

    # -- serving (inside an event loop) --------------------------------------------------

    def start(self, metrics: Metrics) -> None:
        """One scheduler per model, running; call from the running event loop."""
        for name, model in self.models.items():
            info = model.info
            scheduler = Scheduler(
                model,
                metrics,
                max_delay_s=info.max_queue_delay_s,
                capacity=info.queue_capacity,
                instances=self.instances,
            )
            self.schedulers[name] = scheduler
            self._tasks.append(asyncio.create_task(scheduler.run(), name=f"scheduler-{name}"))
            metrics.watch_bound_keys(name, model.executor.bound_key_count)
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

    def within_token_budget(self, sequences: Sequence[np.ndarray]) -> None:
        """One request's cost is bounded: its sequences' tokens (or steps) together."""
        tokens = sum(len(s) for s in sequences)
        limit = self.settings.max_request_tokens
        if tokens > limit:
            raise InvalidInput(
                f"the request holds {tokens} tokens, more than the limit of {limit} per request"
            )

    def refuse_now(self, model: Model, count: int) -> None:
        """503 at once for a request the model's scheduler could not take now."""
        self.schedulers[model.name].refuse_now(count)

    async def infer(
        self, model: Model, sequences: Sequence[np.ndarray], deadline: float
    ) -> list[Outputs]:
        """The model's scheduler admits the validated sequences (or refuses them) and answers."""
        return await self.schedulers[model.name].infer(sequences, deadline)

    async def drain(self) -> bool:
        """Refuse new work, wait until everything admitted is answered; False on timeout.
        Said once in the log, however many callers wait (SIGTERM, then the app's shutdown)."""
        first = not self.draining
        self.draining = True
        for scheduler in self.schedulers.values():
            scheduler.stop_admitting()
        settled = asyncio.gather(*(s.settled() for s in self.schedulers.values()))
        try:
            await asyncio.wait_for(settled, self.settings.drain_timeout_s)
        except TimeoutError:
            log.error(
                "drain: admitted requests still running after %.0f s", self.settings.drain_timeout_s
            )
            return False
        if first:
            log.info(
                "drained: %d requests admitted since start, %d answered",
                sum(s.admitted for s in self.schedulers.values()),
                sum(s.answered for s in self.schedulers.values()),
            )
        return True

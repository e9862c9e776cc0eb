"""The engine: the ready models of a repository, each version with its scheduler, and the one
entrance every edge uses, `infer(call)`.

Built from models that `bucketserve.loading` made ready (or fakes, in tests). A call is decided
here, in this order: which model and version (the newest when none is named); the outputs asked for;
how many sequences (too many, or more than the queue can take now, is refused before anything
is decoded); the sequences, validated (tokenised, for texts); the request's token budget; its
deadline; then the model's scheduler admits them and answers. `drain()` on SIGTERM. Without a
running event loop it is also the Python API (`model(name).predict`).

With model control, `load(name)` has the repository's `Loader` build a model again and
switches new requests to it; a request keeps the model it resolved to until it leaves, and a
replaced or unloaded model is released once the last such request has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bucketserve.core.calls import Answer, Call
from bucketserve.core.model import Model
from bucketserve.core.scheduler import Scheduler
from bucketserve.errors import (
    InvalidInput,
    LoadFailed,
    ModelControlOff,
    ModelNotFound,
    ModelNotReady,
    quoted,
)
from bucketserve.metrics import Metrics
from bucketserve.settings import Settings
from bucketserve.tracing import Tracing

log = logging.getLogger(__name__)

RELEASE_POLL_S = 0.01  # how often a replaced model looks whether its last request has left


class Engine:
    def __init__(
        self,
        models: Mapping[str, Model | Mapping[int, Model]],
        default_model: str | None = None,
        settings: Settings | None = None,
        instances: int = 1,
        failed: Mapping[str, str] | None = None,
        tracing: Tracing | None = None,
        loader: Loader | None = None,
    ) -> None:
        """Serve ready models (`bucketserve.loading.load_engine` builds them from a repository):
        by name, one model or its versions by number. `instances`: batches of one model that
        may run at once. `failed`: models of the repository that did not load, and why
        (reported, never served). `tracing`: where the spans go (default: off). `loader`:
        builds a model of the repository by name, for model control (None: off)."""
        self.versions: dict[str, dict[int, Model]] = {
            name: dict(sorted(given.items())) if isinstance(given, Mapping) else
            {given.info.version: given}
            for name, given in models.items()
        }  # fmt: skip
        self.failed = dict(failed or {})
        self.unloaded: set[str] = set()  # models unloaded by a client (model control)
        self.loader = loader
        self._locks: dict[str, asyncio.Lock] = {}
        self.default_model = default_model
        self.settings = settings or Settings()
        self.instances = instances
        self.draining = False
        self._served: dict[Model, Served] = {}  # every model running, by the model object
        self._metrics: Metrics | None = None
        self.tracing = tracing or Tracing()
        self._tasks: list[asyncio.Task[None]] = []

    def model(self, name: str | None = None, version: str | None = None) -> Model:
        """The model served under `name` (the default when None), at `version` if one is named."""
        name = name or self.default_model
        if name is None:
            raise ModelNotFound("no model named, and the repository has no default model")
        if name in self.failed:  # (a retry finds it failed until the server restarts)
            raise ModelNotReady(f"model {name} did not load: {self.failed[name]}", retry_after_s=60)
        if name in self.unloaded:
            raise ModelNotFound(f"model {name} is not loaded (it was unloaded)")
        try:
            versions = self.versions[name]
        except KeyError:
            raise ModelNotFound(
                f"unknown model {quoted(name)} (have {sorted(self.versions)})"
            ) from None
        if not version:
            return newest(versions)
        chosen = versions.get(int(version)) if version.isascii() and version.isdigit() else None
        if chosen is None:
            raise ModelNotFound(
                f"model {name} has no version {quoted(version, 32)} (serving {list(versions)})"
            )
        return chosen

    # -- serving (inside an event loop) --------------------------------------------------

    def start(self, metrics: Metrics) -> None:
        """One scheduler per model, running; call from the running event loop."""
        self._metrics = metrics
        for versions in self.versions.values():
            for model in versions.values():
                self._run(model, metrics)
        for name in self.failed:
            metrics.model_failed(name)
        if self.loader is not None and self.settings.model_control == "poll":
            self._tasks.append(asyncio.create_task(self._follow(), name="repository-poll"))

    def _run(self, model: Model, metrics: Metrics) -> None:
        """`model`'s scheduler, created and running."""
        info = model.info
        scheduler = Scheduler(
            model,
            metrics,
            max_delay_s=info.max_queue_delay_s,
            capacity=info.queue_capacity,
            instances=self.instances,
            tracing=self.tracing,
            attributes={
                "bucketserve.model": model.name,
                "bucketserve.model_version": str(info.version),
            },
        )
        task = asyncio.create_task(scheduler.run(), name=f"scheduler-{model.name}")
        self._served[model] = Served(scheduler, task)
        metrics.watch_bound_keys(model.name, model.executor.bound_key_count)
        metrics.model_loaded(
            model.name, info.version, model.strategy, info.plan.policy.value, info.invariance
        )

    # -- model control: loads, replacements, unloads while serving -----------------------

    async def load(self, name: str) -> None:
        """Load `name` from the repository, every version its config serves, built and
        checked beside what is served; then new requests go to it, and the versions it
        replaces are released once the requests they took are answered. A load that fails
        leaves what was served serving, and says why."""
        loader = self._control()
        async with self._locks.setdefault(name, asyncio.Lock()):
            try:
                loaded = await asyncio.to_thread(loader.load, name)
            except Exception as exc:  # a ConfigError, or ONNX Runtime refusing the graph
                message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
                message = message.replace(f"{self.settings.models}/", "")  # (no server paths)
                kept = "what was served keeps serving" if name in self.versions else "not served"
                log.error("model %s did not load (%s): %s", name, kept, message)
                raise LoadFailed(f"model {name} did not load ({kept}): {message}") from None
            assert self._metrics is not None, "load while not serving"
            for model in loaded.values():
                self._run(model, self._metrics)
            replaced = self.versions.get(name, {}).values()
            self.versions[name] = dict(sorted(loaded.items()))
            self.failed.pop(name, None)
            self.unloaded.discard(name)
            log.info("model %s: versions %s loaded", name, sorted(loaded))
            for model in replaced:
                self._release_later(model)

    async def unload(self, name: str) -> None:
        """Stop serving `name`: new requests are refused (404), the ones it took are
        answered, then its versions are released."""
        self._control()
        async with self._locks.setdefault(name, asyncio.Lock()):
            versions = self.versions.pop(name, {})
            self.unloaded.add(name)
            releases = [self._release(model) for model in versions.values()]
            versions.clear()  # (each release holds the last reference to its model)
            await asyncio.gather(*releases)
            log.info("model %s unloaded", name)

    def _control(self) -> Loader:
        if self.loader is None:
            raise ModelControlOff(
                "model control is off: start the server with --model-control explicit (or poll)"
            )
        return self.loader

    def _release_later(self, model: Model) -> None:
        task = asyncio.create_task(self._release(model), name=f"release-{model.name}")
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)

    async def _release(self, model: Model) -> None:
        """Once no request that resolved to `model` is left: its scheduler stopped, its
        sessions and weights left to be freed, its metrics' series removed."""
        served = self._served[model]
        while served.users:
            await asyncio.sleep(RELEASE_POLL_S)
        served.scheduler.stop_admitting()
        await served.scheduler.settled()
        served.task.cancel()
        await asyncio.gather(served.task, return_exceptions=True)
        name, version = model.name, model.info.version
        del self._served[model]
        del served, model  # (the last references here: what the model held can be freed)
        if self._metrics is not None:
            self._metrics.model_released(name, version, self.versions.get(name, {}))
        if self.loader is not None:
            await asyncio.to_thread(self.loader.released)
        log.info("model %s v%d released", name, version)

    async def _follow(self) -> None:
        """model_control poll: the repository folder read every poll interval; a model whose
        files changed (or that appeared) is loaded, one whose folder went is unloaded."""
        loader = self._control()
        seen = {n: await asyncio.to_thread(loader.fingerprint, n) for n in loader.names()}
        while True:
            await asyncio.sleep(self.settings.poll_interval_s)
            names = await asyncio.to_thread(loader.names)
            for name in names:
                now = await asyncio.to_thread(loader.fingerprint, name)
                if now != seen.get(name):
                    seen[name] = now
                    with contextlib.suppress(LoadFailed):  # (logged: the old one serves)
                        await self.load(name)
            for name in set(seen) - set(names):
                del seen[name]
                await self.unload(name)

    def index(self) -> list[dict[str, str]]:
        """Every model of the repository and its state, each version served READY, those
        that did not load or were unloaded UNAVAILABLE with why."""
        entries = [
            {"name": name, "version": str(version), "state": "READY"}
            for name, versions in self.versions.items()
            for version in versions
        ]
        entries += [
            {"name": name, "state": "UNAVAILABLE", "reason": error}
            for name, error in self.failed.items()
        ]
        entries += [
            {"name": name, "state": "UNAVAILABLE", "reason": "unloaded"} for name in self.unloaded
        ]
        return sorted(entries, key=lambda e: (e["name"], e.get("version", "")))

    @property
    def models(self) -> dict[str, Model]:
        """Each model served, at the version a request that names none gets."""
        return {name: newest(versions) for name, versions in self.versions.items()}

    @property
    def schedulers(self) -> dict[str, Scheduler]:
        """The scheduler of each model served by name."""
        return {name: self._served[model].scheduler for name, model in self.models.items()}

    @property
    def started(self) -> bool:
        return bool(self._served)

    @contextlib.asynccontextmanager
    async def running(self, metrics: Metrics) -> AsyncIterator[None]:
        """Schedulers running inside the block; at its end, everything admitted is answered
        (the drain), then they stop."""
        self.start(metrics)
        try:
            yield
        finally:
            await self.drain()
            await self.stop()

    async def stop(self) -> None:
        tasks = [*self._tasks, *(served.task for served in self._served.values())]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
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

    async def infer(self, call: Call) -> Answer:
        """Decide and run one request, in the order of the module docstring."""
        model = self.model(call.model, call.version)
        served = self._served[model]
        with served.using():
            return await self._infer(call, model, served.scheduler)

    async def _infer(self, call: Call, model: Model, scheduler: Scheduler) -> Answer:
        """The request on the model it resolved to, which stays running until it is done."""
        with self.tracing.span("bucketserve.admission", {"bucketserve.model": model.name}):
            wanted = wanted_outputs(model, call.outputs)
            count = call.inputs.count(model)
            if count > self.settings.max_sequences:
                raise InvalidInput(f"too many sequences: {count} > {self.settings.max_sequences}")
            scheduler.refuse_now(count)  # (a text is not tokenised only to be refused)
            if call.inputs.heavy:
                sequences = await asyncio.to_thread(call.inputs.sequences, model)
            else:
                sequences = call.inputs.sequences(model)
            self.within_token_budget(sequences)
        outputs = await scheduler.infer(sequences, self.deadline(call.timeout_ms), call.request_id)
        chosen = [{name: out[name] for name in wanted} for out in outputs]
        return Answer(model, chosen, [len(s) for s in sequences])

    async def drain(self) -> bool:
        """Refuse new work, wait until everything admitted is answered; False on timeout.
        Said once in the log, however many callers wait (SIGTERM, then the app's shutdown)."""
        first = not self.draining
        self.draining = True
        schedulers = [served.scheduler for served in self._served.values()]
        for scheduler in schedulers:
            scheduler.stop_admitting()
        settled = asyncio.gather(*(s.settled() for s in schedulers))
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
                sum(s.admitted for s in schedulers),
                sum(s.answered for s in schedulers),
            )
        return True


class Loader(Protocol):
    """What builds the repository's models for model control (`bucketserve.loading.Loader`)."""

    def names(self) -> list[str]: ...

    def load(self, name: str) -> dict[int, Model]: ...

    def fingerprint(self, name: str) -> Hashable: ...

    def released(self) -> None: ...


def newest(versions: Mapping[int, Model]) -> Model:
    """The version a request that names none gets."""
    return versions[max(versions)]


@dataclass(eq=False)
class Served:
    """A model running: its scheduler and that scheduler's task, and how many requests that
    resolved to the model are still in the engine (a model is released only once none is)."""

    scheduler: Scheduler
    task: asyncio.Task[None]
    users: int = 0

    @contextlib.contextmanager
    def using(self) -> Iterator[None]:
        self.users += 1
        try:
            yield
        finally:
            self.users -= 1


def wanted_outputs(model: Model, names: Sequence[str] | None) -> list[str]:
    """The outputs to send back, each once: all of them by default. Asking for fewer saves
    encoding and bytes (a per-token hidden state is hundreds of floats per token)."""
    known = model.info.layout.output_names
    if names is None:
        return known
    unknown = [n[:64] for n in names if n not in known]
    if unknown:
        raise InvalidInput(f"model {model.name} has no output(s) {unknown}; it has {known}")
    return list(dict.fromkeys(names))

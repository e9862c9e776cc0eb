"""Model control: models loaded, replaced and unloaded while the server runs (KServe's repository
extension, `--model-control explicit`), and the repository folder followed (`poll`). It sits
between the edges that ask for it and the core it changes; it builds nothing itself: a `Loader`
(`bucketserve.loading.Loader`, handed over by the process) builds a model's versions and
words every failed load, at start and here alike. Imports the core and the errors only.

A load builds every version the model's config serves beside what is served (each run at load
holding its memory in the engine's budget, as a batch does), then the registry switches new
requests to it and the engine runs it; the versions it replaced retire once the
requests they took are answered. Nothing changes during a drain: a load or an unload asked for
then is refused (503, retry on another replica), a load that was building when the drain began
is dropped, and the poller stops when the drain begins.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections import Counter
from collections.abc import AsyncIterator, Hashable, Iterator
from typing import Protocol

from bucketserve.core.budget import Hold, MemoryBudget
from bucketserve.core.engine import Engine
from bucketserve.core.model import Model
from bucketserve.core.registry import check_name
from bucketserve.errors import ConfigError, LoadFailed, ModelControlOff, Unavailable

log = logging.getLogger(__name__)


class Loader(Protocol):
    """What builds the repository's models by name (`bucketserve.loading.Loader`)."""

    def names(self) -> list[str]:
        """The models the repository folder holds now."""

    def load(self, name: str, hold: Hold | None = None) -> dict[int, Model]:
        """Every served version of `name`, built, checked and warm, or LoadFailed saying why
        (in the words a load at start uses); each run at load holding its memory by `hold`."""

    def folder_digest(self, name: str) -> Hashable:
        """What changes when the model's files do."""

    def released(self) -> None:
        """A model was released: what its sessions held goes back to the system."""


class Control:
    def __init__(
        self, engine: Engine, loader: Loader | None, poll: bool = False, interval_s: float = 5.0
    ) -> None:
        """Control over `engine`'s models with `loader` (None: model control is off); `poll`:
        the repository folder read every `interval_s` while serving."""
        self.engine = engine
        self.loader = loader
        self.poll = poll and loader is not None
        self.interval_s = interval_s
        self._locks: dict[str, asyncio.Lock] = {}  # by model, while in use
        self._users: Counter[str] = Counter()  # of each lock: holding it, or waiting
        self._tasks: set[asyncio.Task[None]] = set()
        self._loads: dict[str, asyncio.Task[None]] = {}  # the load under way, by model

    async def load(self, name: str) -> None:
        """Load `name` from the repository, or replace what is served under it. A load that
        fails leaves what was served serving, and says why. One load of a model runs at a
        time: asked for while one is under way, the caller waits for that one and gets its
        outcome; a caller that leaves (cancelled, past its deadline) leaves the load to finish
        once, rather than a build per caller piling up in threads that cannot be stopped."""
        loader = self._loader("load", name)
        running = self._loads.get(name)
        if running is None:
            running = asyncio.create_task(self._load(loader, name), name=f"load-{name}")
            self._loads[name] = running
            running.add_done_callback(functools.partial(self._loaded, name))
        await asyncio.shield(running)

    def _loaded(self, name: str, task: asyncio.Task[None]) -> None:
        del self._loads[name]
        if not task.cancelled():
            task.exception()  # (said to every caller that waited; none may be left)

    async def _load(self, loader: Loader, name: str) -> None:
        async with self._exclusive(name):
            try:
                hold = functools.partial(_held, self.engine.memory, asyncio.get_running_loop())
                loaded = await asyncio.to_thread(loader.load, name, hold)
            except LoadFailed as failed:
                served = self.engine.registry.versions(name)
                kept = "what was served keeps serving" if served else "not served"
                raise LoadFailed(f"model {name} did not load ({kept}): {failed.message}") from None
            if self.engine.draining:  # (it began while the model was building)
                log.info("model %s: loaded during the drain, so not served", name)
                raise Unavailable(f"the server began draining while model {name} loaded")
            try:  # (put, then run: no request runs between the two, both being synchronous)
                replaced = self.engine.registry.put(name, loaded)
            except ConfigError as clash:  # (an alias another model answers to)
                raise LoadFailed(f"model {name} did not load: {clash.message}") from None
            for model in loaded.values():
                self.engine.run(model)
            log.info("model %s: versions %s loaded", name, sorted(loaded))
            self._retire_later(replaced)

    async def unload(self, name: str) -> None:
        """Serve `name` no more: new requests are refused (404), the ones it took are
        answered, then its versions are released."""
        self._loader("unload", name)
        async with self._exclusive(name):
            removed = self.engine.registry.remove(name)
            await self._retire(removed)
            log.info("model %s unloaded", name)

    @contextlib.asynccontextmanager
    async def _exclusive(self, name: str) -> AsyncIterator[None]:
        """A model's loads and unloads one at a time; its lock kept only while in use (names
        a client made up leave nothing behind)."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        self._users[name] += 1
        try:
            async with lock:
                yield
        finally:
            self._users[name] -= 1
            if not self._users[name]:
                del self._locks[name], self._users[name]

    def _loader(self, what: str, name: str) -> Loader:
        """The loader, for a `what` (load, unload) of a well-formed `name`, or why not."""
        check_name(name)
        if self.loader is None:
            raise ModelControlOff(
                "model control is off: start the server with --model-control explicit (or poll)"
            )
        if self.engine.draining:
            raise Unavailable(
                f"the server is draining: no model {what} now; retry on another replica"
            )
        return self.loader

    def _retire_later(self, models: list[Model]) -> None:
        task = asyncio.create_task(self._retire(models), name="retire")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _retire(self, models: list[Model]) -> None:
        await asyncio.gather(*(self.engine.retire(model) for model in models))
        models.clear()  # (the last references here: what the models held can be freed)
        if self.loader is not None:
            await asyncio.to_thread(self.loader.released)

    # -- the poller ------------------------------------------------------------------------

    def start(self) -> None:
        """From the running event loop: the poller, under `poll`."""
        if self.poll:
            task = asyncio.create_task(self._follow(), name="repository-poll")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        """The poller stopped; loads under way and models still retiring left as they are."""
        tasks = [*self._tasks, *self._loads.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _follow(self) -> None:
        """The repository folder read every poll interval until the drain begins: a model
        whose files changed (or that appeared) is loaded once they have stayed as they are for
        a whole interval (a copy still being written is not loaded half-done), one whose
        folder went is unloaded."""
        loader = self.loader
        assert loader is not None, "poll without a loader"
        seen = {n: await asyncio.to_thread(loader.folder_digest, n) for n in loader.names()}
        changed: dict[str, Hashable] = {}  # a model's files as last read, while they change
        lifecycle = self.engine.lifecycle
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lifecycle.until_draining(), self.interval_s)
            if self.engine.draining:
                log.info("model control: the drain began; the repository is no longer polled")
                return
            names = await asyncio.to_thread(loader.names)
            for name in names:
                now = await asyncio.to_thread(loader.folder_digest, name)
                if now == seen.get(name):
                    changed.pop(name, None)
                elif changed.get(name) != now:  # changing still (or just changed): wait
                    changed[name] = now
                else:  # changed, then still for an interval: load it
                    seen[name] = changed.pop(name)
                    with contextlib.suppress(LoadFailed, Unavailable):  # (logged; old serves)
                        await self.load(name)
            for name in set(seen) - set(names):
                del seen[name]
                with contextlib.suppress(Unavailable):
                    await self.unload(name)


@contextlib.contextmanager
def _held(memory: MemoryBudget, loop: asyncio.AbstractEventLoop, need: int) -> Iterator[None]:
    """`need` held in the engine's budget (from the load's thread, waiting its turn on the
    engine's loop as a batch does) while the block runs: a model loaded beside those serving
    never takes the process past the budget."""
    owner = threading.current_thread()  # (the load's: its claims apart from the schedulers')
    held = asyncio.run_coroutine_threadsafe(memory.acquire(need, owner, "load"), loop).result()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(memory.end, held)

"""The memory budget, one per engine: the bytes every batch the process runs at once may need
together, and who holds them (`MemoryBudget`). Every model's scheduler asks it before a batch
starts (`may_start`, `start`, `end`, from its loop) and is woken when memory is given back; a
run from elsewhere (a model loaded while others serve) waits its turn in `acquire`. What a
batch needs is its model's footprint (`memory`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

# A batch that needs at most this part of the oldest waiting batch's need may start before
# it (a short sequence beside a long one waiting for room), as long as such batches together
# leave it room for when the long ones it waits on have ended: they end long before those.
SMALL = 1 / 8
# What holds a run's memory in the budget from another thread (a load under model control):
# the need in bytes -> a block during which it is held
Hold = Callable[[int], AbstractContextManager[None]]


@dataclass(frozen=True)
class Held:
    """Memory a running batch holds until it ends."""

    need: int


class MemoryBudget:
    """The bytes that the batches running at once may need together (`total`; None: no
    bound), shared by every model's scheduler, and who holds them.

    A batch starts when its need fits beside those running. One that does not fit waits,
    claimed by its scheduler (`wait`); the oldest claim is protected: a later batch may start
    before it only when both fit together, or when it is small beside it (`SMALL`) and the
    small batches running with it still leave the claim its room once the larger batches it
    waits on have ended. So a long batch waits for room while short ones keep flowing beside
    it, and a stream of short ones never starves it.
    """

    def __init__(self, total: int | None, source: str = "") -> None:
        self.total = total
        self.source = source  # where the figure came from (a flag, the container's limit)
        self.used = 0
        self.peak = 0  # the most held at once since start
        self._running: Counter[int] = Counter()  # the need of each batch running
        self._claims: dict[tuple[object, object], tuple[int, int]] = {}  # -> (need, order)
        self._order = itertools.count()
        self._wakers: list[Callable[[], None]] = []

    @property
    def bounded(self) -> bool:
        return self.total is not None

    def fits_alone(self, need: int) -> bool:
        return self.total is None or need <= self.total

    def may_start(self, need: int, owner: object, key: object) -> bool:
        """Whether `owner`'s batch of `key` that needs `need` may start now."""
        if self.total is None:
            return True
        if self.used + need > self.total:
            return False
        oldest = self._oldest()
        if oldest is None or oldest[0] == (owner, key):  # (the oldest waiting starts when it fits)
            return True
        claimed = oldest[1]
        if self.used + need + claimed <= self.total:
            return True
        if need > claimed * SMALL:
            return False
        small = sum(n * count for n, count in self._running.items() if n <= claimed * SMALL)
        return small + need + claimed <= self.total

    def _oldest(self) -> tuple[tuple[object, object], int] | None:
        """The claim that has waited longest: who, and its need."""
        if not self._claims:
            return None
        who, (need, _) = min(self._claims.items(), key=lambda claim: claim[1][1])
        return who, need

    def wait(self, owner: object, claims: Mapping[Any, int]) -> None:
        """`owner`'s batches that wait for room now, by key, with their needs (replacing what
        it claimed before; a key that still waits keeps its place)."""
        for who in [who for who in self._claims if who[0] is owner and who[1] not in claims]:
            del self._claims[who]
        for key, need in claims.items():
            held = self._claims.get((owner, key))
            order = held[1] if held is not None else next(self._order)
            self._claims[(owner, key)] = (need, order)

    def start(self, need: int, owner: object, key: object) -> Held:
        """A batch starts, holding `need` until `end`; its claim, if it had one, is met."""
        self._claims.pop((owner, key), None)
        self._running[need] += 1
        self.used += need
        self.peak = max(self.peak, self.used)
        return Held(need)

    def end(self, held: Held) -> None:
        """A batch ended: its memory is free, and every scheduler held back looks again."""
        self._running[held.need] -= 1
        if not self._running[held.need]:
            del self._running[held.need]
        self.used -= held.need
        for wake in list(self._wakers):
            wake()

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call `wake` whenever memory is given back; returns what stops it."""
        self._wakers.append(wake)

        def stop() -> None:
            self._wakers.remove(wake)

        return stop

    async def acquire(self, need: int, owner: object, key: object) -> Held:
        """`need` held for `owner`'s `key` once it may start (waiting its turn, claimed, as a
        batch does): a model loading beside those serving holds each of its runs so."""
        woken = asyncio.Event()
        unwatch = self.watch(woken.set)
        try:
            while not self.may_start(need, owner, key):
                self.wait(owner, {key: need})
                woken.clear()
                await woken.wait()
            return self.start(need, owner, key)
        finally:
            unwatch()

    def forget(self, owner: object) -> None:
        """`owner` (a scheduler that stopped) claims nothing any more."""
        self.wait(owner, {})

    @property
    def waiting(self) -> int:
        """Batches waiting for room now."""
        return len(self._claims)

"""Memory, pure: what a batch of a model needs while it runs (`Footprint`, measured at load by
`bucketserve.loading.footprint`), and the budget that every batch the process runs at once is
held inside (`MemoryBudget`, one per engine, asked by every model's scheduler).

Tokens grow a batch's cost linearly; attention in a plain export holds heads x length x length
numbers per row, so memory grows with the square of the length: one sequence of 8,192 tokens
of a tiny ModernBERT-shaped export took 2.4 GiB, of 2,048 tokens 164 MiB. A token budget cannot
bound that; this can. No asyncio and no ONNX Runtime here: the scheduler calls `may_start`,
`start` and `end` from its loop, and the budget wakes the schedulers it holds back when memory
is given back.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# The fit is raised so that every measured point lies under it, then by this much more: a
# point between those measured, or past them, is read from a curve that was never below one.
MARGIN = 1.1
# A batch that needs at most this part of the oldest waiting batch's need may start before
# it (a short sequence beside a long one waiting for room), as long as such batches together
# leave it room for when the long ones it waits on have ended: they end long before those.
SMALL = 1 / 8


@dataclass(frozen=True)
class Footprint:
    """The bytes a batch of `rows` sequences padded to `length` needs while it runs, above
    what the process holds idle: fixed + per_token x rows x length + per_square x rows x
    length², fitted to runs measured at load (`points`: rows, length, peak bytes)."""

    fixed: float
    per_token: float
    per_square: float
    points: tuple[tuple[int, int, int], ...] = ()

    def need(self, rows: int, length: int) -> int:
        tokens = rows * length
        return math.ceil(self.fixed + self.per_token * tokens + self.per_square * tokens * length)

    def rows(self, length: int, room: float) -> int:
        """The most rows of `length` whose batch fits in `room` bytes (0: not even one)."""
        per_row = self.per_token * length + self.per_square * length * length
        if room < self.fixed + per_row:
            return 0
        return max(1, int((room - self.fixed) // per_row)) if per_row > 0 else 1 << 30

    def longest(self, room: float, rows: int = 1) -> int:
        """The longest length whose batch of `rows` fits in `room` bytes (0: none)."""
        left = room - self.fixed
        if left <= 0:
            return 0
        a, b = self.per_square * rows, self.per_token * rows
        if a > 0:
            found = int((-b + math.sqrt(b * b + 4 * a * left)) / (2 * a))
        elif b > 0:
            found = int(left // b)
        else:
            return 1 << 30
        while found > 0 and self.need(rows, found) > room:  # (the float's last step)
            found -= 1
        return found

    @property
    def terms(self) -> dict[str, float]:
        """The curve's terms, by the names the metrics give them."""
        return {
            "fixed": self.fixed,
            "per_token": self.per_token,
            "per_token_squared": self.per_square,
        }

    def described(self) -> dict[str, Any]:
        """For the config route: the curve and the points it was fitted to."""
        return {
            "fixed_bytes": round(self.fixed),
            "bytes_per_token": round(self.per_token, 1),
            "bytes_per_token_squared": round(self.per_square, 4),
            "measured": [
                {"rows": r, "length": n, "peak_bytes": b, "modelled_bytes": self.need(r, n)}
                for r, n, b in self.points
            ],
        }


def fit_footprint(points: Sequence[tuple[int, int, int]]) -> Footprint:
    """The footprint whose three non-negative terms fit the measured (rows, length, peak
    bytes) best in least squares, raised so that no point lies above it, then by `MARGIN`."""
    rows = np.array([p[0] for p in points], np.float64)
    length = np.array([p[1] for p in points], np.float64)
    peak = np.array([p[2] for p in points], np.float64)
    terms = np.stack([np.ones_like(rows), rows * length, rows * length * length], axis=1)
    best: np.ndarray | None = None
    best_error = math.inf
    for used in itertools.chain.from_iterable(
        itertools.combinations(range(3), k) for k in (1, 2, 3)
    ):  # (three terms: every subset, the best one whose coefficients are all >= 0)
        columns = list(used)
        found, *_ = np.linalg.lstsq(terms[:, columns], peak, rcond=None)
        if (found < 0).any():
            continue
        coefficients = np.zeros(3)
        coefficients[columns] = found
        error = float(np.sum((terms @ coefficients - peak) ** 2))
        if error < best_error:
            best, best_error = coefficients, error
    assert best is not None  # (the fixed term alone always fits: the mean, never negative)
    # Raised to lie over every point: by a factor over the points that matter (a tenth of
    # the largest peak or more; below that, a heap's reuse makes a peak noise), then by
    # the fixed term over the rest.
    modelled = terms @ best
    large = peak >= 0.1 * peak.max()
    scale = max(1.0, float(np.max(peak[large] / np.maximum(modelled[large], 1.0)))) * MARGIN
    fixed, per_token, per_square = (float(c) * scale for c in best)
    fixed += max(0.0, float(np.max(peak - terms @ (best * scale))))
    measured = tuple((int(r), int(n), int(b)) for r, n, b in points)
    return Footprint(fixed, per_token, per_square, measured)


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

    def forget(self, owner: object) -> None:
        """`owner` (a scheduler that stopped) claims nothing any more."""
        self.wait(owner, {})

    @property
    def waiting(self) -> int:
        """Batches waiting for room now."""
        return len(self._claims)

"""Memory, pure: what a batch of a model needs while it runs (`Footprint`, measured at load by
`bucketserve.loading.footprint`); the budget every batch the process runs at once is held
inside is `budget`'s.

Tokens grow a batch's cost linearly; attention in a plain export holds heads x length x length
numbers per row, so memory grows with the square of the length: one sequence of 8,192 tokens
of a tiny ModernBERT-shaped export took 2.4 GiB, of 2,048 tokens 164 MiB. A token budget cannot
bound that; this can.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# The fit is raised so that every measured point lies under it, then by this much more: a
# point between those measured, or past them, is read from a curve that was never below one.
MARGIN = 1.1


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

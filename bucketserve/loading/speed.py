"""Whether batching pays, measured at load: after the check has found a model's batches exact,
a batch at the first quarter's bucket against the same sequences run one at a time, each the way
serving runs it (into buffers bound at its shape). Batching usually wins several times over; a
model whose cost grows faster than its rows (an op over every pair of rows and steps, a page
detector whose images fill a core alone) can lose, and is then served one sequence a run, said
with the figures. Timings on a shared machine move: only a clear loss (`LOSS`) changes the
policy, each side is the fastest of a few tries, the two sides taking turns, a loss is
measured twice before it is believed, and a batch that runs in under 2 ms (the runtime's
overhead, mostly) never turns it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bucketserve.core.bucketing import BucketPlan
from bucketserve.core.layout import Layout
from bucketserve.core.model import SequenceRules
from bucketserve.loading.check import random_sequences
from bucketserve.runtime.binding import BufferBinding
from bucketserve.runtime.sessions import Session

TRIES = 3
LOSS = 0.8  # batched at under this share of one-at-a-time's throughput: served one at a time
MIN_RUN_S = 0.002  # a batch's run shorter than this never turns the policy
ROWS = 4  # at most, in the batch measured (enough to show the trend, few runs one at a time)


@dataclass(frozen=True)
class Speed:
    rows: int
    length: int
    batched_per_s: float  # sequences a second, in full batches
    single_per_s: float  # sequences a second, one a run
    batch_s: float  # one batch's run

    @property
    def ratio(self) -> float:
        return self.batched_per_s / self.single_per_s

    @property
    def batching_loses(self) -> bool:
        """A clear loss, on runs long enough to tell: under `MIN_RUN_S` a batch is mostly the
        runtime's overhead, and a loss there is the machine's noise."""
        return self.ratio < LOSS and self.batch_s >= MIN_RUN_S

    def described(self) -> dict[str, float | int]:
        return {
            "rows": self.rows,
            "length": self.length,
            "batched_per_s": round(self.batched_per_s, 1),
            "single_per_s": round(self.single_per_s, 1),
            "ratio": round(self.ratio, 2),
        }


def measure_speed(
    session: Session, layout: Layout, rules: SequenceRules, plan: BucketPlan
) -> Speed | None:
    """Batched against one at a time at the first quarter's edge, as many rows as a batch of
    that length holds (up to `ROWS`), each into buffers bound once at its shape; None when a
    batch there holds one row (nothing to compare)."""
    edges = [e for e in plan.edges if e >= rules.min_length] or [plan.max_length]
    length = edges[len(edges) // 4]
    rows = min(ROWS, plan.capacity(length))
    if rows < 2:
        return None
    sequences = random_sequences(rules, [length] * rows, seed=5)
    batch = layout.collate(sequences, rows, length)
    alone = [layout.collate([seq], 1, length) for seq in sequences]
    together = BufferBinding(session, layout, [(rows, length)])
    one = BufferBinding(session, layout, [(1, length)])

    def measured() -> Speed:
        batched, single = _fastest(
            lambda: together.run(batch, rows, length),
            lambda: [one.run(feeds, 1, length) for feeds in alone],
        )
        return Speed(rows, length, rows / batched, rows / single, batched)

    speed = measured()
    if speed.batching_loses:  # said twice before it is believed (a burst lands on one side)
        again = measured()
        speed = max(speed, again, key=lambda s: s.ratio)
    return speed


def _fastest(*runs: Callable[[], object]) -> list[float]:
    """Each of `runs` timed `TRIES` times, taking turns (a burst on the machine lands on both),
    after one untimed round (buffers bound, caches warm): the fastest time of each."""
    for run in runs:
        run()
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(TRIES):
        for run, taken in zip(runs, times, strict=True):
            began = time.perf_counter()
            run()
            taken.append(time.perf_counter() - began)
    return [float(np.min(taken)) for taken in times]

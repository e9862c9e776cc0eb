"""The bucket queues, deterministically: batch compositions under an explicit clock."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from bucketserve.core.bucketing import BucketKey, BucketPlan
from bucketserve.core.queues import BucketQueues, Pending
from bucketserve.settings import BULK_LEVEL

PLAN = BucketPlan(edges=(8, 16, 32), max_batch_size=4, max_batch_tokens=64)
DELAY = 0.005


def pending(ident: int, length: int, now: float = 0.0, deadline: float = 10.0) -> Pending:
    seq = np.full(length, ident)
    return Pending(seq, asyncio.get_running_loop().create_future(), now, deadline)


def ids(batch: tuple[BucketKey, list[Pending]] | None) -> tuple[int, list[int]] | None:
    if batch is None:
        return None
    key, items = batch
    return key.length, [int(item.sequence[0]) for item in items]


def fill(queues: BucketQueues, lengths: Sequence[int], now: float = 0.0) -> None:
    for ident, length in enumerate(lengths):
        queues.add(PLAN.key_for(length), pending(ident, length, now))


async def test_exact_batches_for_mixed_lengths() -> None:
    """ids 0..11 over buckets 8 (4 rows), 16 (4 rows) and 32 (2 rows: 64 tokens // 32).
    Full keys go at once; partial ones wait for the max delay."""
    queues = BucketQueues(DELAY)
    now = 0.0
    fill(queues, [3, 12, 30, 5, 7, 14, 2, 8, 31, 16, 20, 1])
    taken = [ids(queues.take(now)) for _ in range(2)]
    assert taken == [(8, [0, 3, 4, 6]), (32, [2, 8])]
    assert queues.take(now + DELAY / 2) is None  # 8: two waiting, 16: three, 32: one
    assert queues.next_ready_at(now + DELAY / 2) == pytest.approx(DELAY)
    rest = [ids(queues.take(now + DELAY)) for _ in range(3)]
    assert rest == [(8, [7, 11]), (16, [1, 5, 9]), (32, [10])]
    assert len(queues) == 0
    assert queues.take(now + 1) is None


async def test_max_delay_counts_from_the_first_sequence() -> None:
    queues = BucketQueues(DELAY)
    queues.add(PLAN.key_for(3), pending(0, 3, now=0.0))
    assert queues.take(0.004) is None
    queues.add(PLAN.key_for(4), pending(1, 4, now=0.004))
    assert queues.take(0.0049) is None
    assert ids(queues.take(0.005)) == (8, [0, 1])  # the second rides with the first's delay


async def test_token_budget_caps_rows_of_long_buckets() -> None:
    queues = BucketQueues(DELAY)
    fill(queues, [32, 30, 29, 25, 17])
    assert ids(queues.take(0.0)) == (32, [0, 1])
    assert ids(queues.take(0.0)) == (32, [2, 3])
    assert queues.take(0.0) is None
    assert ids(queues.take(DELAY)) == (32, [4])


async def test_a_rare_bucket_never_starves() -> None:
    queues = BucketQueues(DELAY)
    queues.add(PLAN.key_for(30), pending(99, 30, now=0.0, deadline=1.0))  # rare and alone
    for t in range(10):  # a hot bucket that is always full
        now = 0.001 * t
        for i in range(4):
            queues.add(PLAN.key_for(5), pending(t * 10 + i, 5, now=now, deadline=now + 1.0))
    # before the delay, only the full hot bucket is ready
    assert ids(queues.take(0.001))[0] == 8  # type: ignore[index]
    # once the rare one is ready, its older deadline puts it ahead of the still-full hot bucket
    assert ids(queues.take(DELAY)) == (32, [99])


async def test_cancelled_and_expired_sequences_are_dropped_before_compute() -> None:
    queues = BucketQueues(DELAY)
    gone, late, kept = pending(0, 3), pending(1, 3, deadline=0.002), pending(2, 3)
    for item in (gone, late, kept):
        queues.add(PLAN.key_for(3), item)
    gone.future.cancel()  # the client went away
    dropped = queues.purge(0.003)
    assert dropped == {"cancelled": [gone], "expired": [late]}
    assert ids(queues.take(DELAY)) == (8, [2])


def test_bulk_work_waits_behind_every_level_and_is_never_promoted() -> None:
    """A request's sequence goes before bulk work however often the bulk work was passed
    over (a request's level is promoted after `max_overtakes`; bulk work never is)."""
    queues = BucketQueues(max_delay=0.0, max_overtakes=2)
    key = BucketKey(rows=2, length=16)
    loop = asyncio.new_event_loop()

    def pending(level: int, at: float) -> Pending:
        return Pending(np.zeros(4, np.int64), loop.create_future(), at, 1e9, level=level)

    bulk = [pending(BULK_LEVEL, 0.0) for _ in range(2)]
    for item in bulk:
        queues.add(key, item)
    for round_ in range(6):
        live = [pending(3, 1.0 + round_) for _ in range(2)]
        for item in live:
            queues.add(key, item)
        taken = queues.take(now=10.0 + round_)
        assert taken == (key, live)
    assert queues.take(now=100.0) == (key, bulk)
    loop.close()

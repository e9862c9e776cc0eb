"""The batcher, deterministically: queue logic under an injected clock, and a fake model."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from serve.batcher import Batcher, BucketQueues, Outputs, Pending
from serve.bucketing import BucketKey, BucketPlan
from serve.errors import DeadlineExceeded, InferenceFailed

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
    assert queues.next_ready_at() == pytest.approx(DELAY)
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


class FakeModel:
    """Records the batches it is given; optionally fails on a chosen sequence."""

    name = "fake"
    plan = PLAN

    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: list[tuple[BucketKey, list[int]]] = []
        self.fail_on = fail_on

    def batch_shape(self, key: BucketKey, lengths: Sequence[int]) -> tuple[int, int]:
        return len(lengths), key.length

    def run_batch(self, key: BucketKey, sequences: Sequence[np.ndarray]) -> list[Outputs]:
        self.batches.append((key, [int(s[0]) for s in sequences]))
        if self.fail_on is not None and any(int(s[0]) == self.fail_on for s in sequences):
            raise RuntimeError("boom")
        return [{"id": s[:1].copy(), "length": np.array(len(s))} for s in sequences]


class NullObserver:
    def __init__(self) -> None:
        self.drops: dict[str, int] = {}

    def batch_done(self, *args: object) -> None:
        pass

    def dropped(self, model: str, reason: str, count: int) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + count

    def queue_depth(self, model: str, depth: int) -> None:
        pass


async def run_batcher(
    model: FakeModel, submissions: list[list[int]], deadline: float = 1e12
) -> tuple[list[list[Outputs] | BaseException], NullObserver]:
    """Submit everything before the loop starts, so the batches formed are deterministic."""
    observer = NullObserver()
    batcher = Batcher(model, 0.0, observer)
    groups = [
        batcher.submit([np.full(n, i * 100 + j) for j, n in enumerate(lengths)], deadline)
        for i, lengths in enumerate(submissions)
    ]
    task = asyncio.create_task(batcher.run())
    results = [await asyncio.gather(*g, return_exceptions=True) for g in groups]
    await batcher.wait_idle()
    task.cancel()
    return results, observer  # type: ignore[return-value]


async def test_requests_split_across_buckets_are_reassembled_in_order() -> None:
    model = FakeModel()
    results, _ = await run_batcher(model, [[3, 20, 9], [7, 30]])
    assert [[int(o["id"][0]) for o in r] for r in results] == [[0, 1, 2], [100, 101]]  # type: ignore[union-attr]
    assert [[int(o["length"]) for o in r] for r in results] == [[3, 20, 9], [7, 30]]  # type: ignore[union-attr]
    # every batch holds one bucket's sequences only
    assert sorted(model.batches, key=lambda b: b[0].length) == [
        (BucketKey(4, 8), [0, 100]),
        (BucketKey(4, 16), [2]),
        (BucketKey(2, 32), [1, 101]),
    ]


async def test_a_failing_batch_fails_only_its_own_requests() -> None:
    model = FakeModel(fail_on=100)
    results, _ = await run_batcher(model, [[3], [4], [20]])
    first, second, third = results
    assert isinstance(first, list)  # type: ignore[unreachable]
    assert isinstance(first[0], InferenceFailed)  # same batch as the bad one
    assert isinstance(second[0], InferenceFailed)
    assert int(third[0]["id"][0]) == 200  # another batch: untouched


async def test_expired_sequences_are_never_computed() -> None:
    model = FakeModel()
    results, observer = await run_batcher(model, [[3, 4]], deadline=0.0)
    assert all(isinstance(r, DeadlineExceeded) for r in results[0])  # type: ignore[union-attr]
    assert model.batches == []
    assert observer.drops == {"expired": 2}


class MeetingModel(FakeModel):
    """Each batch waits, in its worker thread, until `meet` batches are running at once."""

    def __init__(self, meet: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(meet, timeout=0.5)
        self.met = 0

    def run_batch(self, key: BucketKey, sequences: Sequence[np.ndarray]) -> list[Outputs]:
        with contextlib.suppress(threading.BrokenBarrierError):
            self.barrier.wait()
            self.met += 1
        return super().run_batch(key, sequences)


@pytest.mark.parametrize(("instances", "met"), [(2, 2), (1, 0)])
async def test_instances_run_that_many_batches_at_once(instances: int, met: int) -> None:
    """Two batches (two buckets) meet inside the model only when two instances exist; with one,
    the first waits out the barrier alone and everything is still answered, in order."""
    model = MeetingModel(meet=2)
    batcher = Batcher(model, 0.0, NullObserver(), instances=instances)
    futures = batcher.submit([np.full(3, 1), np.full(20, 2)], deadline=1e12)
    task = asyncio.create_task(batcher.run())
    outputs = await asyncio.wait_for(asyncio.gather(*futures), 10)
    await asyncio.wait_for(batcher.wait_idle(), 5)
    task.cancel()
    assert [int(o["length"]) for o in outputs] == [3, 20]
    assert model.met == met

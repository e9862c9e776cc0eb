"""The scheduler: admission, batches formed across requests and reassembled, failures kept to
their own batch, expired sequences never computed, instances running at once; with a fake
model and, where time matters, an explicit clock."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from serve.core.bucketing import BucketKey, BucketPlan
from serve.core.layout import Outputs
from serve.core.scheduler import Scheduler
from serve.errors import DeadlineExceeded, InferenceFailed, Unavailable

PLAN = BucketPlan(edges=(8, 16, 32), max_batch_size=4, max_batch_tokens=64)
DELAY = 0.005


class FakeModel:
    """Records the batches it is given; optionally fails on a chosen sequence."""

    name = "fake"
    plan = PLAN
    lone_takes_every_core = False

    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: list[tuple[BucketKey, list[int]]] = []
        self.alone: list[bool] = []  # per batch: whether the scheduler said it runs alone
        self.fail_on = fail_on

    def batch_shape(self, key: BucketKey, lengths: Sequence[int]) -> tuple[int, int]:
        return len(lengths), key.length

    def run_batch(
        self, key: BucketKey, sequences: Sequence[np.ndarray], alone: bool = False
    ) -> list[Outputs]:
        self.batches.append((key, [int(s[0]) for s in sequences]))
        self.alone.append(alone)
        if self.fail_on is not None and any(int(s[0]) == self.fail_on for s in sequences):
            raise RuntimeError("boom")
        return [{"id": s[:1].copy(), "length": np.array(len(s))} for s in sequences]


class NullObserver:
    def __init__(self) -> None:
        self.drops: dict[str, int] = {}
        self.rejected: list[str] = []

    def admitted(self, model: str, lengths: Sequence[int]) -> None:
        pass

    def reject(self, reason: str) -> None:
        self.rejected.append(reason)

    def batch_done(self, *args: object) -> None:
        pass

    def dropped(self, model: str, reason: str, count: int) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + count

    def queue_depth(self, model: str, depth: int) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def scheduler(model: FakeModel, **options: object) -> tuple[Scheduler, NullObserver]:
    observer = NullObserver()
    options = {"max_delay_s": 0.0, "capacity": 100, **options}
    return Scheduler(model, observer, **options), observer  # type: ignore[arg-type]


async def run_requests(
    model: FakeModel, submissions: list[list[int]]
) -> list[list[Outputs] | BaseException]:
    """Every request admitted before the loop starts, so the batches formed are deterministic."""
    sched, _ = scheduler(model)
    requests = [
        asyncio.create_task(
            sched.infer([np.full(n, i * 100 + j) for j, n in enumerate(lengths)], 1e12)
        )
        for i, lengths in enumerate(submissions)
    ]
    await asyncio.sleep(0)  # each request task runs up to its wait: all admitted
    assert sched.depth == sum(len(s) for s in submissions)
    loop = asyncio.create_task(sched.run())
    results = await asyncio.gather(*requests, return_exceptions=True)
    await asyncio.wait_for(sched.settled(), 5)
    loop.cancel()
    return results


async def test_requests_split_across_buckets_are_reassembled_in_order() -> None:
    model = FakeModel()
    results = await run_requests(model, [[3, 20, 9], [7, 30]])
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
    first, second, third = await run_requests(model, [[3], [4], [20]])
    assert isinstance(first, InferenceFailed)  # same batch as the bad one
    assert isinstance(second, InferenceFailed)
    assert int(third[0]["id"][0]) == 200  # type: ignore[index]  # another batch: untouched


async def test_a_request_is_refused_whole_or_admitted_whole() -> None:
    sched, observer = scheduler(FakeModel(), capacity=3)
    sched.admit([np.full(3, 1), np.full(20, 2)], deadline=1e12)
    with pytest.raises(Unavailable, match="queue full"):
        sched.admit([np.full(3, 3), np.full(3, 4)], deadline=1e12)  # 2 more than fits
    assert sched.depth == 2  # nothing of the refused request was queued
    with pytest.raises(DeadlineExceeded):
        sched.admit([np.full(3, 5)], deadline=-1.0)
    sched.stop_admitting()
    with pytest.raises(Unavailable, match="draining"):
        sched.admit([np.full(3, 6)], deadline=1e12)
    assert observer.rejected == ["queue_full", "deadline", "draining"]
    assert sched.admitted == 1


async def test_expired_sequences_are_never_computed() -> None:
    model, clock = FakeModel(), Clock()
    sched, observer = scheduler(model, clock=clock)
    futures = sched.admit([np.full(3, 1), np.full(4, 2)], deadline=1.0)
    clock.now = 2.0  # the deadline passes while they wait
    loop = asyncio.create_task(sched.run())
    results = await asyncio.gather(*futures, return_exceptions=True)
    for future in futures:
        future.cancel()  # (what `infer` does when it gives up)
    await asyncio.wait_for(sched.settled(), 5)
    loop.cancel()
    assert all(isinstance(r, DeadlineExceeded) for r in results)
    assert model.batches == []
    assert observer.drops == {"expired": 2}


class MeetingModel(FakeModel):
    """Each batch waits, in its worker thread, until `meet` batches are running at once."""

    def __init__(self, meet: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(meet, timeout=0.5)
        self.met = 0

    def run_batch(
        self, key: BucketKey, sequences: Sequence[np.ndarray], alone: bool = False
    ) -> list[Outputs]:
        with contextlib.suppress(threading.BrokenBarrierError):
            self.barrier.wait()
            self.met += 1
        return super().run_batch(key, sequences, alone)


@pytest.mark.parametrize(("instances", "met"), [(2, 2), (1, 0)])
async def test_instances_run_that_many_batches_at_once(instances: int, met: int) -> None:
    """Two batches (two buckets) meet inside the model only when two instances exist; with one,
    the first waits out the barrier alone and everything is still answered, in order."""
    model = MeetingModel(meet=2)
    sched, _ = scheduler(model, instances=instances)
    request = asyncio.create_task(sched.infer([np.full(3, 1), np.full(20, 2)], deadline=1e12))
    await asyncio.sleep(0)
    task = asyncio.create_task(sched.run())
    outputs = await asyncio.wait_for(request, 10)
    await asyncio.wait_for(sched.settled(), 5)
    task.cancel()
    assert [int(o["length"]) for o in outputs] == [3, 20]
    assert model.met == met


async def test_a_batch_is_told_whether_it_runs_alone() -> None:
    """Alone: when it was formed, no other batch was running, nothing was left waiting, and it
    took no more sequences than there are instances."""
    model = FakeModel()
    await run_requests(model, [[3]])
    assert model.alone == [True]
    # one instance, two buckets waiting: the first batch leaves the second behind it
    model = FakeModel()
    await run_requests(model, [[3, 20]])
    assert model.alone == [False, True]
    # more sequences in the batch than instances: they waited together, so not alone
    model = FakeModel()
    await run_requests(model, [[3, 4]])
    assert model.alone == [False]
    # two instances: the second batch is formed while the first still runs
    model = MeetingModel(meet=2)
    sched, _ = scheduler(model, instances=2)
    request = asyncio.create_task(sched.infer([np.full(3, 1), np.full(20, 2)], deadline=1e12))
    await asyncio.sleep(0)
    task = asyncio.create_task(sched.run())
    await asyncio.wait_for(request, 10)
    await asyncio.wait_for(sched.settled(), 5)
    task.cancel()
    assert model.met == 2
    assert model.alone == [False, False]


class GatedModel(FakeModel):
    """Each batch waits, in its worker thread, until the test opens the gate."""

    def __init__(self, lone_takes_every_core: bool) -> None:
        super().__init__()
        self.lone_takes_every_core = lone_takes_every_core
        self.gate = threading.Event()

    def run_batch(
        self, key: BucketKey, sequences: Sequence[np.ndarray], alone: bool = False
    ) -> list[Outputs]:
        outputs = super().run_batch(key, sequences, alone)
        self.gate.wait(timeout=10)
        return outputs


@pytest.mark.parametrize("wide", [True, False])
async def test_a_batch_that_runs_alone_on_every_core_holds_every_instance(wide: bool) -> None:
    """Where a lone batch runs on every core, a batch formed meanwhile waits for it rather
    than share them (and then runs alone in its turn); elsewhere it takes the idle instance."""
    model = GatedModel(lone_takes_every_core=wide)
    sched, _ = scheduler(model, instances=2)
    task = asyncio.create_task(sched.run())
    first = asyncio.create_task(sched.infer([np.full(3, 1)], deadline=1e12))

    async def started(count: int) -> None:
        while len(model.batches) < count:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(started(1), 5)
    second = asyncio.create_task(sched.infer([np.full(20, 2)], deadline=1e12))
    if wide:
        await asyncio.sleep(0.05)
        assert len(model.batches) == 1  # the second instance is idle, yet the batch waits
    else:
        await asyncio.wait_for(started(2), 5)  # on the idle instance, beside the first
    model.gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    await asyncio.wait_for(sched.settled(), 5)
    task.cancel()
    assert model.alone == ([True, True] if wide else [True, False])

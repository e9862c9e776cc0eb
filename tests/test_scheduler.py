"""The scheduler: admission, batches formed across requests and reassembled, failures kept to
their own batch, expired sequences never computed, instances running at once; on the one fake
model (tests/fakes.py) and, where time matters, an explicit clock."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from bucketserve.core.bucketing import BucketKey
from bucketserve.core.layout import Outputs
from bucketserve.core.lifecycle import Lifecycle
from bucketserve.core.model import Model
from bucketserve.core.scheduler import Scheduler
from bucketserve.errors import DeadlineExceeded, InferenceFailed, Unavailable
from tests.fakes import FakeExecutor, fake_model


def model_and_executor(lone: bool = False) -> tuple[Model, FakeExecutor]:
    """Buckets of 8, 16 and 32 steps, at most 4 rows and 64 tokens a batch. `lone`: a second
    runner for batches that run alone (the model then runs them on every core); the batches
    it ran are those the scheduler called alone."""
    model, executor = fake_model(edges=(8, 16, 32), max_batch_size=4, max_batch_tokens=64)
    if lone:
        model.lone = FakeExecutor()
    return model, executor


def first_ids(outputs: Sequence[Outputs]) -> list[int]:
    return [int(o["doubled"][0]) // 2 for o in outputs]


class NullObserver:
    def __init__(self) -> None:
        self.drops: dict[str, int] = {}
        self.rejected: list[str] = []

    def admitted(self, model: str, lengths: Sequence[int]) -> None:
        pass

    def reject(self, reason: str, level: int = 0, tenant: str = "") -> None:
        self.rejected.append(reason)

    def served(self, *args: object) -> None:
        pass

    def shared(self, *args: object) -> None:
        pass

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


def scheduler(model: Model, **options: object) -> tuple[Scheduler, NullObserver]:
    observer = NullObserver()
    options = {"max_delay_s": 0.0, "capacity": 100, **options}
    return Scheduler(model, observer, **options), observer  # type: ignore[arg-type]


async def run_requests(
    model: Model, submissions: list[list[int]]
) -> list[list[Outputs] | BaseException]:
    """Every request admitted before the loop starts, so the batches formed are deterministic.
    Sequence j of request i is `len` steps of the id 100 i + j + 1."""
    sched, _ = scheduler(model)
    requests = [
        asyncio.create_task(
            sched.infer([np.full(n, i * 100 + j + 1) for j, n in enumerate(lengths)], 1e12)
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
    model, executor = model_and_executor()
    results = await run_requests(model, [[3, 20, 9], [7, 30]])
    assert [first_ids(r) for r in results] == [[1, 2, 3], [101, 102]]  # type: ignore[arg-type]
    assert [[len(o["doubled"]) for o in r] for r in results] == [[3, 20, 9], [7, 30]]  # type: ignore[union-attr]
    # every batch holds one bucket's sequences only
    batches = zip(executor.batches, executor.first_ids, strict=True)
    assert sorted((key, ids) for (key, _), ids in batches) == [
        (BucketKey(2, 32), [2, 102]),
        (BucketKey(4, 8), [1, 101]),
        (BucketKey(4, 16), [3]),
    ]


async def test_a_failing_batch_fails_only_the_sequence_that_fails_alone() -> None:
    """The batch fails; its sequences run again one by one: only the bad one's request fails,
    and its error says which of its sequences failed."""
    model, executor = model_and_executor()
    executor.failure, executor.fail_on = RuntimeError("boom"), 101
    first, second, third = await run_requests(model, [[3], [4, 5], [20]])
    assert first_ids(first) == [1]  # type: ignore[arg-type]  # same batch as the bad one
    assert isinstance(second, InferenceFailed)
    assert str(second).startswith("sequence 0 of 2: inference failed")
    assert first_ids(third) == [201]  # type: ignore[arg-type]  # another batch: untouched
    assert sorted(len(ids) for ids in executor.first_ids) == [1, 1, 1, 1, 3]


async def test_a_request_is_refused_whole_or_admitted_whole() -> None:
    lifecycle = Lifecycle()
    sched, observer = scheduler(model_and_executor()[0], capacity=3, lifecycle=lifecycle)
    sched.admit([np.full(3, 1), np.full(20, 2)], deadline=1e12)
    with pytest.raises(Unavailable, match="queue full"):
        sched.admit([np.full(3, 3), np.full(3, 4)], deadline=1e12)  # 2 more than fits
    assert sched.depth == 2  # nothing of the refused request was queued
    with pytest.raises(DeadlineExceeded):
        sched.admit([np.full(3, 5)], deadline=-1.0)
    lifecycle.drain()  # the engine's drain, which every scheduler obeys
    with pytest.raises(Unavailable, match="draining"):
        sched.admit([np.full(3, 6)], deadline=1e12)
    assert observer.rejected == ["queue_full", "deadline", "draining"]
    assert sched.admitted == 1


async def test_expired_sequences_are_never_computed() -> None:
    (model, executor), clock = model_and_executor(), Clock()
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
    assert executor.batches == []
    assert observer.drops == {"expired": 2}


async def started(executor: FakeExecutor, count: int) -> None:
    """Until `count` batches have entered the runner."""
    while len(executor.batches) < count:
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("instances", [2, 1])
async def test_instances_run_that_many_batches_at_once(instances: int) -> None:
    """Two batches (two buckets), both held at the gate: with two instances both are inside
    the runner at once; with one, the second waits for the first. Answered in order either
    way."""
    model, executor = model_and_executor()
    executor.gate.clear()
    sched, _ = scheduler(model, instances=instances)
    request = asyncio.create_task(sched.infer([np.full(3, 1), np.full(20, 2)], deadline=1e12))
    task = asyncio.create_task(sched.run())
    await asyncio.wait_for(started(executor, instances), 5)
    await asyncio.sleep(0.05)  # (room for a second batch to start, where none may)
    assert executor.running == instances
    executor.gate.set()
    outputs = await asyncio.wait_for(request, 10)
    await asyncio.wait_for(sched.settled(), 5)
    task.cancel()
    assert first_ids(outputs) == [1, 2]
    assert executor.most_at_once == instances


async def test_a_batch_is_told_whether_it_runs_alone() -> None:
    """Alone: when it was formed, no other batch was running, nothing was left waiting, and it
    took no more sequences than there are instances. (The lone runner ran exactly those.)"""
    model, executor = model_and_executor(lone=True)
    await run_requests(model, [[3]])
    assert (len(executor.batches), len(model.lone.batches)) == (0, 1)  # type: ignore[union-attr]
    # one instance, two buckets waiting: the first batch leaves the second behind it
    model, executor = model_and_executor(lone=True)
    await run_requests(model, [[3, 20]])
    assert executor.first_ids == [[1]]
    assert model.lone.first_ids == [[2]]  # type: ignore[union-attr]
    # more sequences in the batch than instances: they waited together, so not alone
    model, executor = model_and_executor(lone=True)
    await run_requests(model, [[3, 4]])
    assert (len(executor.batches), len(model.lone.batches)) == (1, 0)  # type: ignore[union-attr]
    # two instances: the second batch is formed while the first still runs
    model, executor = model_and_executor(lone=True)
    executor.gate.clear()
    sched, _ = scheduler(model, instances=2)
    request = asyncio.create_task(sched.infer([np.full(3, 1), np.full(20, 2)], deadline=1e12))
    task = asyncio.create_task(sched.run())
    await asyncio.wait_for(started(executor, 2), 5)
    executor.gate.set()
    await asyncio.wait_for(request, 10)
    await asyncio.wait_for(sched.settled(), 5)
    task.cancel()
    assert executor.most_at_once == 2
    assert model.lone.batches == []  # type: ignore[union-attr]


@pytest.mark.parametrize("wide", [True, False])
async def test_a_batch_that_runs_alone_on_every_core_holds_every_instance(wide: bool) -> None:
    """Where a lone batch runs on every core, a batch formed meanwhile waits for it rather
    than share them (and then runs alone in its turn); elsewhere it takes the idle instance."""
    model, executor = model_and_executor(lone=wide)
    runner = model.lone if wide else executor
    assert isinstance(runner, FakeExecutor)
    runner.gate.clear()
    executor.gate.clear()
    sched, _ = scheduler(model, instances=2)
    task = asyncio.create_task(sched.run())
    first = asyncio.create_task(sched.infer([np.full(3, 1)], deadline=1e12))
    await asyncio.wait_for(started(runner, 1), 5)
    second = asyncio.create_task(sched.infer([np.full(20, 2)], deadline=1e12))
    if wide:
        await asyncio.sleep(0.05)
        assert runner.batches == [(BucketKey(4, 8), [3])]  # an instance is idle, yet it waits
    else:
        await asyncio.wait_for(started(executor, 2), 5)  # on the idle instance, beside it
    runner.gate.set()
    executor.gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    await asyncio.wait_for(sched.settled(), 5)
    task.cancel()
    # wide: both ran alone, one after the other, on the lone runner; else both on the first
    assert runner.first_ids == [[1], [2]]
    assert executor.most_at_once == (0 if wide else 2)


async def test_requests_are_counted_waiting_then_running_as_routers_count_them() -> None:
    """Waiting until a batch takes one of a request's sequences, running until it is
    answered; the tokens waiting are the steps queued. One instance held at the gate: the
    first batch (bucket 8, two requests' sequences) runs, the rest waits behind it."""
    model, executor = model_and_executor()
    executor.gate.clear()
    sched, _ = scheduler(model, instances=1)
    first = asyncio.create_task(sched.infer([np.full(3, 1), np.full(20, 2)], deadline=1e12))
    second = asyncio.create_task(sched.infer([np.full(5, 3)], deadline=1e12))
    third = asyncio.create_task(sched.infer([np.full(30, 4)], deadline=1e12))
    await asyncio.sleep(0)
    assert (sched.requests_waiting, sched.requests_running) == (3, 0)
    assert sched.queued_tokens == 3 + 20 + 5 + 30
    loop = asyncio.create_task(sched.run())
    await asyncio.wait_for(started(executor, 1), 5)
    # the bucket of 8 took the first's 3 steps and the second's 5: both running, one waits
    assert (sched.requests_waiting, sched.requests_running) == (1, 2)
    assert sched.queued_tokens == 20 + 30
    executor.gate.set()
    await asyncio.wait_for(asyncio.gather(first, second, third), 10)
    await asyncio.wait_for(sched.settled(), 5)
    loop.cancel()
    assert (sched.requests_waiting, sched.requests_running, sched.queued_tokens) == (0, 0, 0)

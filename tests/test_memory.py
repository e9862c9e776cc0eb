"""Memory: a batch's footprint fitted to measured peaks, the budget every batch running at once
shares (a long batch waits for room, short ones flow beside it, none is starved), sequences
whose batch of one cannot fit refused before they queue, and nothing at load running a shape
serving never runs. The scheduler on the one fake model; the load on a real ONNX Runtime
session over a graph the project builds (no torch)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from bucketserve.core.bucketing import BucketKey
from bucketserve.core.budget import MemoryBudget
from bucketserve.core.calls import Call, Sequences
from bucketserve.core.engine import Engine
from bucketserve.core.memory import Footprint, fit_footprint
from bucketserve.core.registry import Registry
from bucketserve.errors import PayloadTooLarge
from bucketserve.loading.builder import build_model
from bucketserve.loading.repository import load_model_spec
from bucketserve.metrics import Metrics
from bucketserve.runtime.memory import peak_of
from modelgen.graphs import encoder
from modelgen.save import save_model
from tests.fakes import fake_model
from tests.helpers import ENCODER_CONFIG
from tests.test_scheduler import scheduler

MIB = 2**20


# -- the footprint -----------------------------------------------------------------------------


def test_the_fit_lies_over_every_point_and_follows_the_square() -> None:
    """Peaks from a known curve (with a heap's noise below a tenth of the largest): the fit is
    never under a measured point, and reads the curve past the last one within its margin."""
    true = Footprint(2 * MIB, 900.0, 40.0)
    rng = np.random.default_rng(0)
    points = [(1, n, true.need(1, n)) for n in (64, 128, 256, 512, 1024, 2048)]
    points += [(r, 512, true.need(r, 512)) for r in (2, 4)]
    points = [(r, n, int(b * rng.uniform(0.5, 1.0)) if b < 20 * MIB else b) for r, n, b in points]
    fit = fit_footprint(points)
    assert all(fit.need(r, n) >= b for r, n, b in points)
    for rows, length in [(1, 4096), (1, 8192), (3, 2048)]:
        assert true.need(rows, length) <= fit.need(rows, length) <= 1.3 * true.need(rows, length)


def test_the_longest_and_the_rows_that_fit_are_the_curve_inverted() -> None:
    footprint = Footprint(MIB, 1000.0, 50.0)
    for room in (64 * MIB, 700 * MIB, 3 * 2**30):
        longest = footprint.longest(room)
        assert footprint.need(1, longest) <= room < footprint.need(1, longest + 1)
        for length in (16, 300, longest):
            rows = footprint.rows(length, room)
            assert footprint.need(rows, length) <= room < footprint.need(rows + 1, length)
    assert footprint.longest(MIB // 2) == 0  # (not even the fixed part fits)
    assert footprint.rows(10**6, 64 * MIB) == 0


def test_a_peak_is_what_a_run_held_above_the_process() -> None:
    """A run that holds 64 MiB at once (and frees it) reads as 64 MiB, whatever the process
    held before it."""

    def holds() -> int:
        block = np.ones(64 * MIB // 8)  # (written: resident)
        return int(block.size)

    _, peak = peak_of(holds)
    assert 60 * MIB <= peak <= 80 * MIB
    _, idle = peak_of(lambda: 0)
    assert idle < 8 * MIB


# -- the budget's rule -------------------------------------------------------------------------


def test_a_batch_starts_when_it_fits_and_the_oldest_waiting_is_protected() -> None:
    budget = MemoryBudget(1000)
    long_a = budget.start(600, "a", "long")
    assert not budget.may_start(600, "b", "long")  # 1200 > 1000: it waits, claiming
    budget.wait("b", {"long": 600})
    assert budget.may_start(50, "c", "short")  # small beside it: 50 + its 600 fit
    short = budget.start(50, "c", "short")
    assert budget.may_start(60, "c", "short")  # the small ones: 50 + 60 + 600 <= 1000
    assert not budget.may_start(350, "c", "mid")  # fits now, but not small: it waits too
    budget.end(short)
    budget.end(long_a)
    assert budget.may_start(600, "b", "long")  # its turn
    budget.start(600, "b", "long")
    assert budget.waiting == 0


def test_short_batches_never_starve_the_long_one_waiting() -> None:
    """Small batches may start beside a waiting large one only while the small ones running
    together would still leave it its room: once they would not, they wait too."""
    budget = MemoryBudget(1000)
    budget.wait("long", {"key": 900})  # (waits for the small ones running to end)
    held = [budget.start(40, "s", i) for i in range(2)]  # 80 held: 80 + 900 > 1000
    assert not budget.may_start(40, "s", 2)  # another small one would delay it further
    for one in held:
        budget.end(one)
    assert budget.may_start(900, "long", "key")
    assert budget.may_start(40, "s", 3)  # (100 small beside 900 fit)


def test_unbounded_lets_everything_start() -> None:
    budget = MemoryBudget(None)
    budget.start(10**15, "a", 1)
    assert budget.may_start(10**15, "b", 2)


# -- the scheduler in the budget ---------------------------------------------------------------

# 100 bytes a token²: 32 steps need 102,400; 8 steps 6,400 (a row).
SQUARE = Footprint(0.0, 0.0, 100.0)


async def test_a_long_batch_waits_for_room_while_short_ones_are_answered() -> None:
    """Budget for one long batch (32 steps) at a time, two instances: the second long waits
    while the first runs (held at the gate), and short requests sent meanwhile are answered
    beside it; never more than the budget running at once."""
    budget = MemoryBudget(150_000)
    model, executor = fake_model(edges=(8, 32), max_batch_size=1, footprint=SQUARE, budget=150_000)
    executor.gated_from = 32  # (the long batches wait at the gate the test opens)
    executor.gate.clear()
    sched, _ = scheduler(model, instances=2, memory=budget)
    loop = asyncio.create_task(sched.run())
    longs = [asyncio.create_task(sched.infer([np.full(32, 1 + i)], 1e12)) for i in range(2)]
    while executor.running < 1:  # the first long runs, holding 102,400 of 150,000
        await asyncio.sleep(0.001)
    shorts = [await sched.infer([np.full(8, 10 + i)], 1e12) for i in range(5)]
    assert [int(s[0]["doubled"][0]) // 2 for s in shorts] == [10, 11, 12, 13, 14]
    assert budget.waiting == 1
    assert executor.running == 1
    executor.gate.set()
    done = await asyncio.gather(*longs)
    assert [int(d[0]["total"]) for d in done] == [32, 64]
    assert budget.peak <= 150_000
    assert budget.used == 0
    loop.cancel()


async def test_a_key_holds_no_more_rows_than_fit_alone() -> None:
    model, _ = fake_model(edges=(8, 32), max_batch_size=8, footprint=SQUARE, budget=250_000)
    assert model.plan.key_for(32) == BucketKey(2, 32)  # 3 rows would need 307,200
    assert model.plan.key_for(8) == BucketKey(8, 8)


async def test_a_sequence_whose_batch_of_one_cannot_fit_is_refused_before_it_queues() -> None:
    """The plan's buckets end where a batch of one fits (24 here, under 64 in the config):
    a longer sequence is a 413 that names the longest that fits and the fixes."""
    model, executor = fake_model(edges=(8, 24), footprint=SQUARE, budget=60_000)
    rules = dataclasses.replace(model.info.rules, max_length=64)  # (the config's longest)
    model.info = dataclasses.replace(model.info, rules=rules)
    engine = Engine(Registry({"fake": {1: model}}, "fake"), memory=MemoryBudget(60_000))
    async with engine.running(Metrics()):
        with pytest.raises(PayloadTooLarge, match=r"longest model fake runs here is 24") as err:
            await engine.infer(Call(Sequences([list(range(1, 30))]), "fake"))
        assert "long_inputs" in err.value.message
        assert "--memory-budget" in err.value.message
        answer = await engine.infer(Call(Sequences([list(range(1, 20))]), "fake"))
        assert len(answer.outputs) == 1
    assert executor.sequences == 1  # (the refused one never ran)


# -- load time runs only what serving runs -----------------------------------------------------


def test_load_never_runs_a_shape_serving_cannot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An encoder with attention over 2,048 positions, loaded in a budget that one sequence of
    2,048 does not fit: the buckets end at the longest that fits, and every run at load (the
    footprint's points, the probe, the check, the speed) is a shape serving may run: rows x
    length within max_batch_tokens and its need within the budget."""
    folder = tmp_path / "long" / "1"
    save_model(
        encoder(vocab=300, dim=32, heads=4, max_positions=2048, seed=3), folder / "model.onnx"
    )
    config = ENCODER_CONFIG.format(
        binding="shared-session",
        mode="bucketing",
        vocab=300,
        buckets=[16, 64, 256, 1024, 2048],
        max_batch_size=8,
        max_batch_tokens=2048,
    )
    (tmp_path / "long" / "config.toml").write_text(config)
    spec = load_model_spec(tmp_path / "long")
    assert spec is not None
    budget = 48 * MIB
    with caplog.at_level(logging.DEBUG, logger="bucketserve.loading"):
        model = build_model(spec, cache_dir=tmp_path / "cache", budget=budget)
    plan = model.plan
    assert plan.footprint is not None
    assert 256 < plan.max_length < 2048  # (cut where one sequence stops fitting)
    assert plan.need(1, plan.max_length) <= budget < plan.need(1, plan.max_length + 1)
    shapes = [(int(r), int(n)) for r, n in re.findall(r"load runs (\d+) x (\d+)", caplog.text)]
    assert len(shapes) > 20
    outside = [
        (r, n)
        for r, n in shapes
        if n > plan.max_length or r * n > max(2048, n) or plan.need(r, n) > budget
    ]
    assert outside == []
    assert "serving never runs" not in caplog.text
    assert max(n for _, n in shapes) == plan.max_length  # (it was run at its longest)
    memory = model.info.served_config["memory"]
    assert memory["longest"] == plan.max_length
    assert memory["cut_from"] == 2048


def test_the_oldest_waiting_starts_whatever_waits_behind_it() -> None:
    """Two long batches waiting, neither fitting beside the other: the oldest starts once it
    fits (a rule that protected each from the other would leave both waiting forever)."""
    budget = MemoryBudget(1000)
    running = budget.start(900, "x", "first")
    budget.wait("a", {"long": 700})
    budget.wait("b", {"long": 600})
    assert not budget.may_start(700, "a", "long")  # (the first still runs)
    budget.end(running)
    assert not budget.may_start(600, "b", "long")  # the younger waits for the older
    assert budget.may_start(700, "a", "long")
    budget.start(700, "a", "long")
    assert not budget.may_start(600, "b", "long")  # 700 + 600 > 1000


async def test_a_model_loaded_beside_those_serving_waits_for_room(tmp_path: Path) -> None:
    """Model control loads the long encoder while a batch of another model holds 40 of the 48
    MiB: the load's runs wait for room (claimed, as a batch's would be) until that batch
    ends, then the load completes; the budget is never passed."""
    from bucketserve.control import Control
    from bucketserve.loading.loader import Loader
    from bucketserve.settings import Settings

    root = tmp_path / "models"
    folder = root / "long"
    save_model(
        encoder(vocab=300, dim=32, heads=4, max_positions=2048, seed=3), folder / "1" / "model.onnx"
    )
    config = ENCODER_CONFIG.format(
        binding="shared-session",
        mode="bucketing",
        vocab=300,
        buckets=[16, 64, 256, 1024, 2048],
        max_batch_size=8,
        max_batch_tokens=2048,
    )
    (folder / "config.toml").write_text(config)
    budget = 48 * MIB
    holding = Footprint(40 * MIB, 0.0, 0.0)  # (every batch of the served model needs 40 MiB)
    model, executor = fake_model(footprint=holding, budget=budget)
    executor.gate.clear()
    memory = MemoryBudget(budget)
    engine = Engine(Registry({"fake": {1: model}}, "fake"), memory=memory)
    settings = Settings(models=root, cache_dir=tmp_path / "cache")
    control = Control(engine, Loader(settings, None, budget))
    async with engine.running(Metrics()):
        serving = asyncio.create_task(engine.infer(Call(Sequences([[1, 2, 3]]), "fake")))
        while memory.used < 40 * MIB:
            await asyncio.sleep(0.01)
        loading = asyncio.create_task(control.load("long"))
        while not memory.waiting:  # (the load's first run that does not fit beside it)
            assert not loading.done(), loading
            await asyncio.sleep(0.01)
        assert not loading.done()
        executor.gate.set()
        await asyncio.wait_for(loading, 300)
        await serving
        assert engine.model("long").plan.max_length > 256
    assert memory.peak <= budget

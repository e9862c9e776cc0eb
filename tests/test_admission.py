"""Overload, deadlines and abandoned requests: 503 with Retry-After, 504, nothing computed in
vain, nothing admitted lost, nothing hangs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import numpy as np
import pytest

from bucketserve.core.calls import Call, Sequences
from bucketserve.core.engine import Engine
from bucketserve.core.registry import Registry
from bucketserve.settings import Settings
from tests.engines import serving
from tests.fakes import FakeExecutor, fake_model
from tests.helpers import error_of


def gated_engine(queue_capacity: int = 2048, **settings: object) -> tuple[Engine, FakeExecutor]:
    """A fake model (no ONNX Runtime) with its batches held at a gate the test opens; one
    instance, so that the batch at the gate holds back every later one."""
    model, executor = fake_model(queue_capacity=queue_capacity)
    executor.gate.clear()
    engine = Engine(Registry({model.name: model}, model.name), Settings(**settings), instances=1)
    return engine, executor


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def test_full_queue_gets_503_with_retry_after_and_admitted_requests_succeed() -> None:
    engine, log = gated_engine(queue_capacity=8)
    async with serving(engine) as client:
        running = asyncio.create_task(client.post("/predict", json={"sequences": [[1, 2, 3]]}))
        await asyncio.to_thread(log.entered.wait, 5)  # the worker is now busy with it
        queued = [
            asyncio.create_task(client.post("/predict", json={"sequences": [[i + 1] * 20]}))
            for i in range(8)
        ]
        await until(lambda: engine.schedulers["fake"].depth == 8)

        started = time.monotonic()
        refused = await asyncio.gather(
            *(client.post("/predict", json={"sequences": [[9] * 5]}) for _ in range(5))
        )
        assert time.monotonic() - started < 2  # refused at once, not after a wait
        for response in refused:
            assert response.status_code == 503
            assert error_of(response)[0] == "unavailable"
            assert int(response.headers["retry-after"]) >= 1

        log.gate.set()
        admitted = await asyncio.wait_for(asyncio.gather(running, *queued), 10)
        metrics = (await client.get("/metrics")).text
    assert [r.status_code for r in admitted] == [200] * 9
    assert 'bucketserve_rejected_total{reason="queue_full"} 5.0' in metrics
    assert log.sequences == 9


async def test_deadline_gives_504_and_the_request_is_never_computed() -> None:
    engine, log = gated_engine(request_timeout_ms=300)
    async with serving(engine) as client:
        running = asyncio.create_task(client.post("/predict", json={"sequences": [[1, 2, 3]]}))
        await asyncio.to_thread(log.entered.wait, 5)
        started = time.monotonic()
        short = await client.post(
            "/predict", json={"sequences": [[7] * 40]}, headers={"X-Request-Timeout-Ms": "100"}
        )
        short_s = time.monotonic() - started
        # a client cannot lengthen the server's deadline (300 ms)
        longer = await client.post(
            "/predict", json={"sequences": [[7] * 90]}, headers={"X-Request-Timeout-Ms": "60000"}
        )
        long_s = time.monotonic() - started - short_s
        # the held batch passed its deadline too: answered 504 on time, not left hanging
        assert (await running).status_code == 504
        log.gate.set()
        await engine.schedulers["fake"].settled()
        metrics = (await client.get("/metrics")).text

    assert short.status_code == longer.status_code == 504
    assert error_of(short)[0] == "deadline_exceeded"
    assert 0.09 < short_s < 2
    assert 0.29 < long_s < 2
    assert [lengths for _, lengths in log.batches] == [[3]]  # 40 and 90 were never computed
    assert 'bucketserve_dropped_total{model="fake",reason="expired"} 2.0' in metrics


async def test_abandoned_request_is_dropped_before_compute() -> None:
    engine, log = gated_engine()
    async with serving(engine) as client:
        running = asyncio.create_task(client.post("/predict", json={"sequences": [[1, 2, 3]]}))
        await asyncio.to_thread(log.entered.wait, 5)
        abandoned = asyncio.create_task(engine.infer(Call(Sequences([np.full(50, 4, np.int64)]))))
        await until(lambda: engine.schedulers["fake"].depth == 1)
        abandoned.cancel()  # what the HTTP layer does when the client disconnects
        log.gate.set()
        assert (await running).status_code == 200
        answer = await client.post("/predict", json={"sequences": [[5] * 50]})  # wakes the batcher
        assert answer.status_code == 200
        await engine.schedulers["fake"].settled()
        metrics = (await client.get("/metrics")).text
    assert [lengths for _, lengths in log.batches] == [[3], [50]]  # only the live 50
    assert 'bucketserve_dropped_total{model="fake",reason="cancelled"} 1.0' in metrics


async def test_draining_refuses_new_work_and_readiness_turns_false() -> None:
    engine, log = gated_engine()
    async with serving(engine) as client:
        assert (await client.get("/v2/health/ready")).status_code == 200
        running = asyncio.create_task(client.post("/predict", json={"sequences": [[1, 2, 3]]}))
        await asyncio.to_thread(log.entered.wait, 5)
        drained = asyncio.create_task(engine.drain())
        await until(lambda: engine.draining)
        assert (await client.get("/v2/health/ready")).status_code == 503
        refused = await client.post("/predict", json={"sequences": [[1]]})
        assert refused.status_code == 503
        assert "retry-after" in refused.headers
        assert not drained.done()  # still waiting for the admitted request
        log.gate.set()
        assert (await running).status_code == 200
        assert await asyncio.wait_for(drained, 5) is True


async def test_text_meeting_a_full_queue_is_refused_before_it_is_tokenised() -> None:
    """Under overload, refusing costs little: a text request is refused before its texts are
    tokenised (the fake model has no tokenizer: tokenising would have answered 422)."""
    engine, executor = gated_engine(queue_capacity=1)
    async with serving(engine) as client:
        running = asyncio.create_task(client.post("/predict", json={"sequences": [[1, 2, 3]]}))
        await asyncio.to_thread(executor.entered.wait, 5)
        queued = asyncio.create_task(client.post("/predict", json={"sequences": [[4] * 5]}))
        await until(lambda: engine.schedulers["fake"].depth == 1)
        refused = await client.post("/predict", json={"text": ["a text that is never tokenised"]})
        executor.gate.set()
        assert [(await r).status_code for r in (running, queued)] == [200, 200]
    assert refused.status_code == 503
    assert error_of(refused)[0] == "unavailable"


async def test_buckets_longer_than_a_request_may_hold_are_said_with_the_flag(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A model whose buckets reach past --max-request-tokens (audio clips of 320,000 samples
    beside the default 65,536): said at start, naming the flag, and a request refused past
    it names the flag too."""
    model, _ = fake_model(edges=(8, 128))
    engine = Engine(Registry({model.name: model}, model.name), Settings(max_request_tokens=64))
    with caplog.at_level(logging.WARNING, logger="bucketserve.core.engine"):
        async with serving(engine) as client:
            refused = await client.post("/predict", json={"sequences": [list(range(1, 100))]})
    assert "buckets reach 128 steps" in caplog.text
    assert "--max-request-tokens" in caplog.text
    assert refused.status_code == 422
    assert "--max-request-tokens" in error_of(refused)[1]

"""Scheduling beyond arrival order: priority levels with bounded overtaking, tenants' fair
shares of tokens and of the queue, and identical sequences computed once (the exact result
cache, and sharing in flight). The rules on the pure queues under an explicit clock; then
through the engine and HTTP on the fake model; the cache's answers against a real model run
alone, and its invalidation when a model is reloaded."""

from __future__ import annotations

import asyncio
import functools
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bucketserve.core.bucketing import BucketPlan, Invariance
from bucketserve.core.engine import Engine
from bucketserve.core.queues import BucketQueues, Pending
from bucketserve.core.registry import Registry
from bucketserve.core.result_cache import ResultCache, exact_inputs
from bucketserve.core.shares import Shares
from bucketserve.edges.auth import ApiKeys
from bucketserve.process.wiring import wire
from bucketserve.settings import Settings
from modelgen.graphs import encoder
from modelgen.save import save_model
from tests.engines import Reference, make_engine, serving, spec_of
from tests.fakes import FakeExecutor, fake_model
from tests.helpers import error_of
from tests.test_admission import until
from tests.test_model_control import NAME, ask, expected, write_version

PLAN = BucketPlan(edges=(8, 16, 32), max_batch_size=4, max_batch_tokens=64)
DELAY = 0.005


def pending(ident: int, length: int, level: int = 2, tenant: str = "", now: float = 0.0) -> Pending:
    future = asyncio.get_running_loop().create_future()
    return Pending(np.full(length, ident), future, now, 10.0, level=level, tenant=tenant)


def add(queues: BucketQueues, item: Pending) -> None:
    queues.add(PLAN.key_for(len(item.sequence)), item)


def taken(queues: BucketQueues, now: float) -> tuple[int, list[int]]:
    batch = queues.take(now)
    assert batch is not None
    key, items = batch
    return key.length, [int(item.sequence[0]) for item in items]


# -- priority ---------------------------------------------------------------------------------


async def test_the_best_level_runs_first_and_batches_still_form_by_length() -> None:
    queues = BucketQueues(DELAY)
    for ident in range(4):  # bucket 8 full of bulk work (4 rows)
        add(queues, pending(ident, 5, level=3))
    assert taken(queues, 0.0) == (8, [0, 1, 2, 3])
    add(queues, pending(10, 12, level=1))  # one interactive query, alone in bucket 16
    for ident in range(4, 8):
        add(queues, pending(ident, 5, level=3))
    assert taken(queues, 0.0) == (8, [4])  # the query waits its delay, as any sequence does
    assert taken(queues, DELAY) == (16, [10])  # both ready: the better level goes first
    # within one key the best levels first, each level in the order it came; the batch fills
    # with the rest (never padded to another length for it)
    add(queues, pending(20, 7, level=2))
    add(queues, pending(21, 3, level=1))
    assert taken(queues, DELAY) == (8, [21, 20, 5, 6])


async def test_a_worse_level_runs_short_batches_while_a_better_one_sends() -> None:
    """A query that arrives while a bulk batch runs waits for it: while queries come, bulk
    batches take a third of their rows; a second after the last query, all of them."""
    plan = BucketPlan(edges=(8,), max_batch_size=8, max_batch_tokens=64)
    queues = BucketQueues(DELAY)

    def firsts(now: float) -> list[int]:
        batch = queues.take(now)
        assert batch is not None
        return [int(item.sequence[0]) for item in batch[1]]

    for ident in range(32):
        queues.add(plan.key_for(5), pending(ident, 5, level=3))
    assert len(firsts(0.0)) == 8
    queues.add(plan.key_for(3), pending(100, 3, level=1, now=0.1))
    assert firsts(0.2) == [100, 8, 9, 10, 11, 12, 13, 14]  # the query's batch: full
    assert firsts(0.5) == [15, 16]  # a third of 8 rows
    assert len(firsts(1.2)) == 8  # no query for a second: full batches again


async def test_a_sequence_is_overtaken_at_most_max_overtakes_times() -> None:
    queues = BucketQueues(DELAY, max_overtakes=2)
    add(queues, pending(0, 5, level=3))  # bulk, alone in bucket 8: ready once its delay passed
    order = []
    for turn in range(3):
        for ident in range(4):  # bucket 16 full of interactive queries every turn
            add(queues, pending(100 * (turn + 1) + ident, 12, level=1, now=DELAY))
        order.append(taken(queues, DELAY)[0])
    assert order == [16, 16, 8]  # passed over twice, then it goes before a better level
    assert taken(queues, DELAY) == (16, [300, 301, 302, 303])


async def test_only_a_ready_sequence_counts_as_overtaken() -> None:
    queues = BucketQueues(DELAY, max_overtakes=1)
    bulk = pending(0, 5, level=3, now=0.0)
    add(queues, bulk)
    for ident in range(4):
        add(queues, pending(10 + ident, 12, level=1))
    assert taken(queues, DELAY / 2) == (16, [10, 11, 12, 13])  # bucket 8 not ready yet
    assert bulk.overtaken == 0


async def test_only_the_batch_that_would_have_run_counts_as_passed_over() -> None:
    """A flood's backlog waits for its own level's work, not for the queries: only the batch
    that arrival order would have run next counts a query's batch as passing it over (else
    every sequence of a long backlog would soon go before every query)."""
    queues = BucketQueues(DELAY)
    backlog = [pending(ident, 5, level=3) for ident in range(12)]  # three batches of bucket 8
    for item in backlog:
        add(queues, item)
    for ident in range(4):
        add(queues, pending(100 + ident, 12, level=1))
    assert taken(queues, 0.0) == (16, [100, 101, 102, 103])
    assert [item.overtaken for item in backlog] == [1] * 4 + [0] * 8


# -- tenants' shares --------------------------------------------------------------------------


async def test_contended_tenants_get_tokens_in_proportion_to_their_weights() -> None:
    queues = BucketQueues(DELAY, shares=Shares({"search": 3.0, "indexer": 1.0}))
    for ident in range(60):  # the indexer's flood came first
        add(queues, pending(ident, 5, tenant="indexer"))
    for ident in range(60):
        add(queues, pending(1000 + ident, 5, tenant="search"))
    served: Counter[str] = Counter()
    for _ in range(10):  # 40 sequences of the 120
        _, ids = taken(queues, 0.0)
        served.update("search" if i >= 1000 else "indexer" for i in ids)
    assert abs(served["search"] - 30) <= 1
    assert abs(served["indexer"] - 10) <= 1


async def test_shares_are_of_tokens_not_of_sequences() -> None:
    """One tenant sends long texts, the other short ones: with equal weights each gets about
    the same tokens (within one batch), not the same count of sequences."""
    queues = BucketQueues(DELAY)
    for ident in range(100):
        add(queues, pending(ident, 30, tenant="long"))  # bucket 32: 2 rows, 60 tokens
        add(queues, pending(1000 + ident, 6, tenant="short"))  # bucket 8: 4 rows, 24 tokens
    tokens: Counter[str] = Counter()
    for _ in range(20):
        length, ids = taken(queues, 0.0)
        tokens["short" if ids[0] >= 1000 else "long"] += (
            30 * len(ids) if length == 32 else 6 * len(ids)
        )
    assert abs(tokens["long"] - tokens["short"]) <= 60
    assert tokens["short"] > 0
    assert tokens["long"] > 0


def test_idle_time_banks_no_credit() -> None:
    shares = Shares()
    shares.arrive("a")
    shares.charge("a", 1000)
    shares.arrive("b")  # new while a waits: level with a, not 1000 tokens behind it
    assert shares.account("b") == shares.account("a") == 1000
    shares.leave("a")
    shares.leave("b")
    assert shares.accounts == {}  # nobody waits: no account is kept
    shares.arrive("a")
    assert shares.account("a") == 0


def test_a_tenant_room_in_the_queue_holds_some_back_for_others() -> None:
    shares = Shares({"big": 2.0}, reserve=True)
    assert shares.room("big", 900) == 600  # alone: 2 / (2 + 1 held for one more)
    shares.arrive("small", 5)
    assert shares.room("big", 900) == 450  # 2 / (2 + 1 + 1)
    assert shares.room("small", 900) == 450  # 1 / (1 + 1): big waits for nothing
    shares.arrive("big", 1)
    assert shares.room("small", 900) == 225  # 1 / (1 + 2 + 1)
    assert not shares.over_share("other", 900, 900)  # nothing waiting: any request starts
    assert not Shares().over_share("", 5, 10)  # one tenant: only a full queue refuses it


def test_room_is_held_for_another_tenant_only_where_one_may_come() -> None:
    """What the process wires (`Shares(reserve=...)`): two key names, or a tenant header,
    mean another tenant may come; one name (a rotation's two keys included) means none."""
    assert ApiKeys({"sk-1": "search", "sk-2": "indexer"}).tenants_may_differ
    assert not ApiKeys({"sk-1": "search", "sk-2": "search"}).tenants_may_differ
    assert not ApiKeys(()).tenants_may_differ
    assert ApiKeys((), tenant_header="X-Tenant").tenants_may_differ
    keys = ApiKeys({"sk-1": "search"}, tenant_header="X-Tenant")
    assert keys.tenant(["Bearer sk-1"], ["gateway-named"]) == "gateway-named"
    assert keys.tenant(["Bearer sk-1"], []) == "search"  # no header: the key's name
    assert keys.tenant(["Bearer wrong"], []) == ""


def keyed_engine(tmp_path: Path, queue_capacity: int) -> tuple[Engine, FakeExecutor, Settings]:
    """The fake model, gated, behind two named keys (two tenants)."""
    keys = tmp_path / "keys"
    keys.write_text("# name key\nalice sk-alice-1\nbob sk-bob-1\n")
    settings = Settings(api_key_file=keys)
    model, executor = fake_model(queue_capacity=queue_capacity)
    executor.gate.clear()
    shares = functools.partial(Shares, reserve=True)
    engine = Engine(Registry({model.name: model}, model.name), settings, 1, shares=shares)
    return engine, executor, settings


def as_tenant(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer sk-{name}-1"}


async def test_a_full_queue_refuses_the_tenant_over_its_share_first(tmp_path: Path) -> None:
    engine, executor, _ = keyed_engine(tmp_path, queue_capacity=8)
    async with serving(engine) as client:
        idents = iter(range(1, 100))  # (distinct: identical sequences would share a run)

        def predict(tenant: str, count: int) -> Any:
            body = {"sequences": [[next(idents)] * 3 for _ in range(count)]}
            return client.post("/predict", json=body, headers=as_tenant(tenant))

        running = asyncio.create_task(predict("alice", 1))
        await asyncio.to_thread(executor.entered.wait, 5)
        flood = [asyncio.create_task(predict("alice", 1)) for _ in range(4)]
        await until(lambda: engine.schedulers["fake"].depth == 4)
        over = await predict("alice", 1)  # alice holds 4 of 8: all the room she has
        assert over.status_code == 503
        assert "share of the queue" in error_of(over)[1]
        bob = asyncio.create_task(predict("bob", 2))  # the queue has room for bob
        await until(lambda: engine.schedulers["fake"].depth == 6)
        executor.gate.set()
        answered = await asyncio.wait_for(asyncio.gather(running, *flood, bob), 10)
        metrics = (await client.get("/metrics", headers=as_tenant("bob"))).text
    assert [r.status_code for r in answered] == [200] * 6
    assert re.search(
        r'bucketserve_class_rejected_total\{priority="2",reason="tenant_share",tenant="alice"\} 1',
        metrics,
    )
    assert re.search(
        r'bucketserve_class_tokens_total\{model="fake",priority="2",tenant="bob"\} 6', metrics
    )


# -- priority through the edges ---------------------------------------------------------------


def gated(**settings: Any) -> tuple[Engine, FakeExecutor]:
    model, executor = fake_model(max_batch_size=4, edges=(8, 16, 32))
    executor.gate.clear()
    return Engine(Registry({model.name: model}, model.name), Settings(**settings), 1), executor


async def test_an_interactive_query_overtakes_a_queued_flood() -> None:
    """One batch runs; a bulk job has queued 12 sequences (3 batches) at level 3 (a header);
    a query asks for level 1 in its body: it runs next, though it came last."""
    engine, executor = gated()
    async with serving(engine) as client:
        first = asyncio.create_task(client.post("/predict", json={"sequences": [[1] * 3]}))
        await asyncio.to_thread(executor.entered.wait, 5)
        bulk = [
            asyncio.create_task(
                client.post(
                    "/predict",
                    json={"sequences": [[100 + 4 * i + j] * 5 for j in range(4)]},
                    headers={"x-priority": "3"},
                )
            )
            for i in range(3)
        ]
        await until(lambda: engine.schedulers["fake"].depth == 12)
        query = asyncio.create_task(
            client.post("/predict", json={"sequences": [[7] * 12], "priority": 1})
        )
        await until(lambda: engine.schedulers["fake"].depth == 13)
        executor.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(first, *bulk, query), 10)
        metrics = (await client.get("/metrics")).text
    assert all(a.status_code == 200 for a in answers)
    assert [ids[0] for ids in executor.first_ids][:2] == [1, 7]
    bulk_order = [i for ids in executor.first_ids[2:] for i in ids]
    assert bulk_order == list(range(100, 112))  # then the flood, in the order it came
    assert (
        'bucketserve_class_queue_seconds_count{model="fake",priority="1",tenant="none"} 1'
        in metrics
    )
    assert (
        'bucketserve_class_queue_seconds_count{model="fake",priority="3",tenant="none"} 12'
        in metrics
    )


@pytest.mark.parametrize(
    ("headers", "body", "status", "says"),
    [
        ({"x-priority": "4"}, {}, 422, "levels are 1 (first) to 3"),
        ({"x-priority": "high"}, {}, 400, "X-Priority must be a level"),
        ({}, {"priority": -1}, 422, "'priority' must be a level"),
        ({}, {"priority": True}, 422, "'priority' must be a level"),
        ({"x-priority": "0"}, {}, 200, ""),  # Triton's 0: the default
    ],
)
async def test_a_priority_out_of_range_is_refused_clearly(
    headers: dict[str, str], body: dict[str, Any], status: int, says: str
) -> None:
    engine, executor = gated()
    executor.gate.set()
    async with serving(engine) as client:
        answer = await client.post(
            "/predict", json={"sequences": [[1, 2]], **body}, headers=headers
        )
    assert answer.status_code == status, answer.text
    assert says in (error_of(answer)[1] if status != 200 else "")


async def test_v2_takes_triton_priority_parameter_before_its_header() -> None:
    engine, executor = gated()
    async with serving(engine) as client:
        first = asyncio.create_task(client.post("/predict", json={"sequences": [[1] * 3]}))
        await asyncio.to_thread(executor.entered.wait, 5)

        def infer(ident: int, priority: int) -> Any:
            body = {
                "inputs": [
                    {"name": "ids", "datatype": "INT64", "shape": [1, 5], "data": [ident] * 5}
                ],
                "parameters": {"priority": priority},
            }
            return client.post("/v2/models/fake/infer", json=body, headers={"x-priority": "1"})

        late = [asyncio.create_task(infer(50, 3)), asyncio.create_task(infer(60, 0))]
        await until(lambda: engine.schedulers["fake"].depth == 2)
        executor.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(first, *late), 10)
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    # 60 sent Triton's 0 (none of its own), so its header's 1; 50's parameter said 3
    assert executor.first_ids[1] == [60, 50]


# -- identical sequences computed once --------------------------------------------------------


async def test_identical_sequences_waiting_at_once_run_once() -> None:
    engine, executor = gated()
    async with serving(engine) as client:
        first = asyncio.create_task(client.post("/predict", json={"sequences": [[1] * 3]}))
        await asyncio.to_thread(executor.entered.wait, 5)
        body = {"sequences": [[5] * 6, [7] * 3, [5] * 6]}
        same = [asyncio.create_task(client.post("/predict", json=body)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert engine.schedulers["fake"].depth == 2  # one [5]*6 and one [7]*3 queued
        executor.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(*same), 10)
        await first
        metrics = (await client.get("/metrics")).text
    for answer in answers:
        outputs = answer.json()["outputs"]
        assert [o["total"] for o in outputs] == [30, 21, 30]
        assert outputs[0]["doubled"] == [10] * 6
    assert sorted(executor.first_ids[1]) == [5, 7]  # the two distinct ones, once each
    assert executor.sequences == 3
    assert 'bucketserve_shared_sequences_total{model="fake"} 7.0' in metrics
    assert 'bucketserve_result_cache_saved_tokens_total{model="fake"} 36.0' in metrics


async def test_a_sequence_answered_before_is_answered_from_the_cache() -> None:
    engine, executor = gated()
    executor.gate.set()
    async with serving(engine) as client:
        one = await client.post("/predict", json={"sequences": [[3, 4, 5]], "outputs": ["total"]})
        again = await client.post("/predict", json={"sequences": [[3, 4, 5], [3, 4]]})
        ran = executor.sequences
        third = await client.post("/predict", json={"sequences": [[3, 4, 5]], "outputs": ["total"]})
        metrics = (await client.get("/metrics")).text
        config = (await client.get("/v2/models/fake/config")).json()
    assert one.json()["outputs"] == [{"total": 12}]
    # the outputs asked are part of the key: all of them now, so it ran again, with [3, 4]
    assert again.json()["outputs"][0] == {"doubled": [6, 8, 10], "total": 12}
    assert ran == 3
    assert third.json()["outputs"] == [{"total": 12}]
    assert executor.sequences == 3  # from the cache
    assert 'bucketserve_result_cache_hits_total{model="fake"} 1.0' in metrics
    assert 'bucketserve_result_cache_misses_total{model="fake"} 3.0' in metrics
    assert 'bucketserve_result_cache_saved_tokens_total{model="fake"} 3.0' in metrics
    assert re.search(r'bucketserve_result_cache_bytes\{model="fake",version="1"\} [1-9]', metrics)
    assert config["result_cache"]["on"] is True
    assert config["result_cache"]["bytes"] == 64 * 2**20


def test_the_cache_keeps_to_its_bound_least_recently_used_out() -> None:
    cache = ResultCache(bound_bytes=3 * 1400)
    keys = [exact_inputs(np.full(4, i)) for i in range(4)]
    for key in keys[:3]:
        cache.put(key, {"v": np.zeros(256, np.float32)})  # ~1 KiB an entry
    assert cache.get(keys[0]) is not None  # now the most recent
    cache.put(keys[3], {"v": np.zeros(256, np.float32)})
    assert cache.get(keys[1]) is None  # the least recently used went
    assert cache.get(keys[0]) is not None
    assert cache.get(keys[3]) is not None
    assert cache.bytes <= cache.bound_bytes
    kept = cache.get(keys[0])
    assert kept is not None
    assert not kept["v"].flags.writeable
    assert exact_inputs(np.arange(4)) != exact_inputs(np.arange(4).astype(np.int32))


async def test_no_cache_and_no_sharing_for_a_model_served_single_for_batch_variance() -> None:
    varies = Invariance(padding=0.3, batching=0.2, tolerance=1e-4)
    model, executor = fake_model(max_batch_size=4, invariance=varies)
    engine = Engine(Registry({model.name: model}, model.name), Settings(), 1)
    assert engine.cache_refused(model) == (
        "off: the check found batching moves its answers by 0.2 (tolerance 0.0001), so an "
        "answer depends on what it ran with"
    )
    async with serving(engine) as client:
        answers = await asyncio.gather(
            *(client.post("/predict", json={"sequences": [[9] * 4]}) for _ in range(3))
        )
        await client.post("/predict", json={"sequences": [[9] * 4]})
        config = (await client.get("/v2/models/fake/config")).json()
        metrics = (await client.get("/metrics")).text
    assert all(a.json()["outputs"][0]["total"] == 36 for a in answers)
    assert executor.sequences == 4  # each one ran
    assert config["result_cache"] == {
        "on": False,
        "bytes": 0,
        "why": engine.cache_refused(model),
    }
    assert 'bucketserve_result_cache_hits_total{model="fake"}' not in metrics
    assert 'bucketserve_shared_sequences_total{model="fake"}' not in metrics


async def test_the_cache_off_by_setting() -> None:
    model, executor = fake_model()
    executor.gate.set()
    engine = Engine(Registry({model.name: model}, model.name), Settings(result_cache_mb=0), 1)
    assert engine.cache_refused(model) == "off: --result-cache-mb is 0"
    async with serving(engine) as client:
        for _ in range(2):
            await client.post("/predict", json={"sequences": [[9] * 4]})
    assert executor.sequences == 2


# -- the cache on real models: exact, and dropped with the version it kept ------------------


async def test_every_answer_from_the_cache_equals_the_model_alone(tmp_path: Path) -> None:
    """tiny-encoder's texts' ids, sent twice over concurrent requests with repeats: the first
    round runs (identical ones once), the second comes from the cache; every answer equals
    the graph run on that sequence alone, unpadded."""
    engine = make_engine(tmp_path, "tiny-encoder")
    reference = Reference(spec_of(tmp_path, "tiny-encoder"))
    rng = np.random.default_rng(3)
    distinct = [rng.integers(5, 2000, int(n)).tolist() for n in rng.integers(2, 60, 12)]
    requests = [[distinct[int(i)] for i in rng.integers(0, 12, 4)] for _ in range(16)]
    async with serving(engine) as client:
        for _ in range(2):
            answers = await asyncio.gather(
                *(client.post("/predict", json={"sequences": r}) for r in requests)
            )
            for sent, answer in zip(requests, answers, strict=True):
                assert answer.status_code == 200, answer.text
                for seq, out in zip(sent, answer.json()["outputs"], strict=True):
                    alone = reference(np.asarray(seq, np.int64))
                    for name, value in alone.items():
                        np.testing.assert_allclose(out[name], value, rtol=1e-5, atol=1e-5)
        metrics = (await client.get("/metrics")).text
    hits = re.search(r'bucketserve_result_cache_hits_total\{model="tiny-encoder"\} (\S+)', metrics)
    assert hits is not None
    assert float(hits.group(1)) >= 64


async def test_a_reloaded_version_answers_with_its_new_weights(tmp_path: Path) -> None:
    """Version 1 answers (and is kept); its file is replaced and the model loaded again
    under the same version: the answer is the new weights', never the one kept."""
    models = tmp_path / "models"
    write_version(models, 1)
    wired = wire(Settings(models=models, model_control="explicit", instances=1))
    async with serving(wired.engine, wired.control) as client:
        for _ in range(2):  # the second from the cache
            _, old = await ask(client, 0)
            np.testing.assert_allclose(old, expected(models, 1)[0], atol=1e-5)
        graph = encoder(vocab=300, dim=16, heads=2, layers=1, ffn=32, seed=99)
        save_model(graph, models / NAME / "1" / "model.onnx")
        response = await client.post(f"/v2/repository/models/{NAME}/load")
        assert response.status_code == 200, response.text
        version, new = await ask(client, 0)
        metrics = (await client.get("/metrics")).text
    assert version == "1"
    np.testing.assert_allclose(new, expected(models, 1)[0], atol=1e-5)
    assert not np.allclose(new, old, atol=1e-3)
    assert re.search(rf'bucketserve_result_cache_hits_total\{{model="{NAME}"\}} 1\.0', metrics)

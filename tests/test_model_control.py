"""Models loaded, replaced and unloaded while serving (KServe's repository extension, behind
--model-control): a replacement under traffic loses no request and answers each exactly with
a version that was loaded while the request was in the server; a failed load leaves the old
serving; versions side by side; unload and load again; poll follows the folder."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from bucketserve.control import Control, Loader
from bucketserve.core.budget import Hold
from bucketserve.core.engine import Engine
from bucketserve.core.model import Model
from bucketserve.core.registry import Registry
from bucketserve.errors import Unavailable
from bucketserve.loading import load_engine
from bucketserve.process.wiring import wire
from bucketserve.runtime.sessions import own_pools_allowed
from bucketserve.settings import Settings
from modelgen.graphs import encoder
from modelgen.save import save_model
from tests.engines import serving
from tests.fakes import fake_model
from tests.helpers import error_of

NAME = "enc"
CONFIG = """
[inputs.input_ids]
role = "tokens"
vocab_size = 300
[inputs.attention_mask]
role = "mask"
[inputs.token_type_ids]
role = "token_types"
[outputs.last_hidden_state]
[outputs.sentence_embedding]
[batching]
buckets = [8, 16, 32]
max_batch_size = 8
max_queue_delay_ms = 2
{policy}
"""
SEQUENCES = [[5, 9, 2], [7, 1, 4, 4, 8, 20], [3] * 14, [11] * 30]


def write_version(models: Path, version: int, policy: str = "") -> None:
    """Version `version` of the model: its own weights (seeded by the version), so that every
    version answers differently."""
    graph = encoder(vocab=300, dim=16, heads=2, layers=1, ffn=32, seed=version)
    save_model(graph, models / NAME / str(version) / "model.onnx")
    (models / NAME / "config.toml").write_text(CONFIG.format(policy=policy))


def expected(models: Path, version: int) -> list[np.ndarray]:
    """Each of SEQUENCES through the version's graph alone, unpadded."""
    options = ort.SessionOptions()
    options.use_per_session_threads = own_pools_allowed()
    path = str(models / NAME / str(version) / "model.onnx")
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    answers = []
    for seq in SEQUENCES:
        ids = np.asarray([seq], np.int64)
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids),
        }
        answers.append(session.run(["sentence_embedding"], feeds)[0][0])
    return answers


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_version(root, 1)
    return root


@pytest.fixture
async def served(models: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Engine]]:
    # The result cache off: every request runs the model, as a reload under computing traffic
    # is what these tests are about (tests/test_scheduling.py has the cache's reload). With it
    # on, 16 in-process clients sending 4 sequences are all answered from the cache: the
    # event loop never idles, and the load's thread waits for the GIL at each of its runs.
    settings = Settings(models=models, model_control="explicit", instances=2, result_cache_mb=0)
    wired = wire(settings)
    async with serving(wired.engine, wired.control) as client:
        yield client, wired.engine


def infer_body(index: int) -> dict[str, Any]:
    seq = SEQUENCES[index]
    return {
        "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, len(seq)], "data": seq}],
        "outputs": [{"name": "sentence_embedding"}],
    }


async def ask(client: httpx.AsyncClient, index: int, version: str = "") -> tuple[str, np.ndarray]:
    path = f"/v2/models/{NAME}" + (f"/versions/{version}" if version else "") + "/infer"
    response = await client.post(path, json=infer_body(index))
    assert response.status_code == 200, response.text
    body = response.json()
    return body["model_version"], np.asarray(body["outputs"][0]["data"], np.float32)


@dataclass
class Answered:
    sent: float
    received: float
    index: int
    version: str
    embedding: np.ndarray


async def test_off_by_default(models: Path) -> None:
    engine = load_engine(Settings(models=models))
    async with serving(engine) as client:
        refused = await client.post(f"/v2/repository/models/{NAME}/load")
    assert refused.status_code == 403
    assert "--model-control explicit" in error_of(refused)[1]


async def test_reloads_under_traffic_lose_nothing_and_answer_exactly(
    models: Path, served: tuple[httpx.AsyncClient, Engine]
) -> None:
    """16 clients send all along; the model is replaced 4 times (a new version folder each,
    the config serving the newest); every request is answered, exactly, by a version that
    was loaded while it was in the server."""
    client, engine = served
    answers: list[Answered] = []
    loaded: dict[str, float] = {"1": 0.0}  # version -> when its load was asked for
    replaced: dict[str, float] = {}  # version -> when the load that replaced it returned
    stop = asyncio.Event()

    async def sender(offset: int) -> None:
        turn = offset
        while not stop.is_set():
            index = turn % len(SEQUENCES)
            sent = time.monotonic()
            version, embedding = await ask(client, index)
            answers.append(Answered(sent, time.monotonic(), index, version, embedding))
            turn += 1

    senders = [asyncio.create_task(sender(i)) for i in range(16)]

    async def answered_by(version: str) -> None:  # (however busy the machine)
        while not any(a.version == version for a in answers):
            await asyncio.sleep(0.01)

    await answered_by("1")
    for version in range(2, 6):
        write_version(models, version)
        loaded[str(version)] = time.monotonic()
        response = await client.post(f"/v2/repository/models/{NAME}/load")
        assert response.status_code == 200, response.text
        replaced[str(version - 1)] = time.monotonic()
        await answered_by(str(version))
    stop.set()
    await asyncio.gather(*senders)

    references = {str(v): expected(models, v) for v in range(1, 6)}
    assert {a.version for a in answers} == set(references)  # every version answered some
    for answer in answers:
        # loaded at some moment between the request's sending and its answer
        assert loaded[answer.version] <= answer.received
        assert replaced.get(answer.version, float("inf")) >= answer.sent
        want = references[answer.version][answer.index]
        np.testing.assert_allclose(answer.embedding, want, atol=1e-5)
    await until_released(engine, 1)


async def until_released(engine: Engine, count: int) -> None:
    """Until the replaced versions are released: `count` models running."""
    for _ in range(500):
        if engine.running_models == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{engine.running_models} models still running, expected {count}")


async def test_a_failed_load_leaves_the_old_serving(
    models: Path, served: tuple[httpx.AsyncClient, Engine]
) -> None:
    client, _ = served
    (models / NAME / "2").mkdir()
    (models / NAME / "2" / "model.onnx").write_bytes(b"not an onnx file")
    refused = await client.post(f"/v2/repository/models/{NAME}/load")
    assert refused.status_code == 400
    message = error_of(refused)[1]
    assert "what was served keeps serving" in message
    version, embedding = await ask(client, 0)
    assert version == "1"
    np.testing.assert_allclose(embedding, expected(models, 1)[0], atol=1e-5)
    index = (await client.post("/v2/repository/index")).json()
    assert index == [{"name": NAME, "version": "1", "state": "READY"}]


async def test_loading_a_name_the_repository_lacks_is_404(
    served: tuple[httpx.AsyncClient, Engine],
) -> None:
    """As an unload of one is, and as docs/model-control.md says: no model by that name."""
    client, _ = served
    loaded = await client.post("/v2/repository/models/made-up/load")
    assert loaded.status_code == 404, loaded.text
    assert "no model 'made-up' in the repository" in error_of(loaded)[1]
    unloaded = await client.post("/v2/repository/models/made-up/unload")
    assert unloaded.status_code == 404


async def test_two_versions_side_by_side(
    models: Path, served: tuple[httpx.AsyncClient, Engine]
) -> None:
    client, _ = served
    write_version(models, 2, "[version_policy]\nlatest = 2")
    assert (await client.post(f"/v2/repository/models/{NAME}/load")).status_code == 200
    for version in ("1", "2"):
        answered, embedding = await ask(client, 1, version)
        assert answered == version
        np.testing.assert_allclose(embedding, expected(models, int(version))[1], atol=1e-5)
    assert (await ask(client, 1))[0] == "2"  # no version named: the newest
    metadata = (await client.get(f"/v2/models/{NAME}/versions/1")).json()
    assert metadata["versions"] == ["1", "2"]
    index = (await client.post("/v2/repository/index")).json()
    assert [(e["version"], e["state"]) for e in index] == [("1", "READY"), ("2", "READY")]
    metrics = (await client.get("/metrics")).text
    info = 'bucketserve_model_info{model="enc",policy="buckets",strategy="shared-session"'
    assert f'{info},version="1"}} 1.0' in metrics
    assert f'{info},version="2"}} 1.0' in metrics


async def test_unload_then_load_again(
    models: Path, served: tuple[httpx.AsyncClient, Engine]
) -> None:
    client, engine = served
    assert (await client.post(f"/v2/repository/models/{NAME}/unload")).status_code == 200
    gone = await client.post(f"/v2/models/{NAME}/infer", json=infer_body(0))
    assert gone.status_code == 404
    assert "unloaded" in error_of(gone)[1]
    index = (await client.post("/v2/repository/index")).json()
    assert index == [{"name": NAME, "state": "UNAVAILABLE", "reason": "unloaded"}]
    assert not engine.running_models  # released: nothing of it runs
    metrics = (await client.get("/metrics")).text
    assert 'bucketserve_model_info{model="enc"' not in metrics  # its series went with it
    assert (await client.post(f"/v2/repository/models/{NAME}/load")).status_code == 200
    assert (await ask(client, 2))[0] == "1"


async def test_poll_follows_the_folder(models: Path) -> None:
    wired = wire(Settings(models=models, model_control="poll", poll_interval_s=0.1))
    async with serving(wired.engine, wired.control) as client:
        assert (await ask(client, 0))[0] == "1"
        write_version(models, 2)
        for _ in range(200):
            if (await ask(client, 0))[0] == "2":
                break
            await asyncio.sleep(0.05)
        version, embedding = await ask(client, 0)
        assert version == "2"
        np.testing.assert_allclose(embedding, expected(models, 2)[0], atol=1e-5)
        shutil.rmtree(models / NAME)
        for _ in range(200):
            if (
                await client.post(f"/v2/models/{NAME}/infer", json=infer_body(0))
            ).status_code == 404:
                break
            await asyncio.sleep(0.05)
        assert (
            await client.post(f"/v2/models/{NAME}/infer", json=infer_body(0))
        ).status_code == 404


# -- during a drain: nothing loaded admits anything ---------------------------------------


class GatedLoader:
    """The repository's loader, holding each load at a gate once it has built the model."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self.built = threading.Event()
        self.gate = threading.Event()
        self.calls = 0

    def names(self) -> list[str]:
        return self.loader.names()

    def folder_digest(self, name: str) -> Hashable:
        return self.loader.folder_digest(name)

    def released(self) -> None:
        self.loader.released()

    def load(self, name: str, hold: Hold | None = None) -> dict[int, Model]:
        self.calls += 1
        loaded = self.loader.load(name, hold)
        self.built.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return loaded


async def test_poll_notices_new_weights_of_the_same_size_and_mtime(
    models: Path, tmp_path: Path
) -> None:
    """New weights copied over version 1 as `cp -p` and `rsync -a` copy them (the same size,
    the old mtime kept) are loaded: the poll reads content, not only sizes and times."""
    other = tmp_path / "other"
    write_version(other, 7)
    wired = wire(Settings(models=models, model_control="poll", poll_interval_s=0.1))
    async with serving(wired.engine, wired.control) as client:
        _, before = await ask(client, 0)
        np.testing.assert_allclose(before, expected(models, 1)[0], atol=1e-5)
        version = models / NAME / "1"
        for new in sorted((other / NAME / "7").iterdir()):
            old = version / new.name
            assert new.stat().st_size == old.stat().st_size
            kept = old.stat()
            shutil.copyfile(new, old)
            os.utime(old, ns=(kept.st_atime_ns, kept.st_mtime_ns))  # (as cp -p keeps it)
        want = expected(other, 7)[0]
        for _ in range(200):
            if np.allclose((await ask(client, 0))[1], want, atol=1e-5):
                break
            await asyncio.sleep(0.05)
        np.testing.assert_allclose((await ask(client, 0))[1], want, atol=1e-5)


async def test_a_model_loaded_during_a_drain_admits_nothing(models: Path) -> None:
    """A load asked for during a drain is refused; one that was building when the drain
    began is dropped; a scheduler started after the drain began obeys it; every request
    meanwhile is refused, over the old version and the new alike."""
    wired = wire(Settings(models=models, model_control="explicit"))
    engine = wired.engine
    gated = GatedLoader(wired.control.loader)  # type: ignore[arg-type]
    control = Control(engine, gated)
    async with serving(engine, control) as client:
        write_version(models, 2)
        building = asyncio.create_task(client.post(f"/v2/repository/models/{NAME}/load"))
        await asyncio.to_thread(gated.built.wait, 30)
        assert await engine.drain()  # (nothing in flight: it drains at once, and stays so)

        gated.gate.set()
        dropped = await building
        refused = await client.post(f"/v2/repository/models/{NAME}/load")
        unload = await client.post(f"/v2/repository/models/{NAME}/unload")
        infer = await client.post(f"/v2/models/{NAME}/infer", json=infer_body(0))
        ready = await client.get("/v2/health/ready")
        index = (await client.post("/v2/repository/index")).json()

        late = await asyncio.to_thread(gated.loader.load, NAME)  # served by hand, now
        for model in late.values():
            engine.run(model)
        engine.registry.put(NAME, late)
        with pytest.raises(Unavailable, match="draining"):  # its scheduler obeys the drain
            await engine.schedulers[NAME].infer([np.array([5, 9])], 1e12)
        assert engine.schedulers[NAME].admitted == 0

    assert dropped.status_code == 503, dropped.text
    assert "draining" in error_of(dropped)[1]
    for response in (refused, unload, infer):
        assert response.status_code == 503, response.text
        assert "draining" in error_of(response)[1]
    assert ready.status_code == 503
    assert index == [{"name": NAME, "version": "1", "state": "READY"}]  # nothing switched
    assert list(late) == [2]


async def test_loads_asked_for_at_once_build_once_whoever_leaves(models: Path) -> None:
    """Ten loads of one model at once, half of their callers gone (cancelled, as a client
    past its deadline is) while it builds: one build, its outcome for those who stayed, and
    the model switched once."""
    wired = wire(Settings(models=models, model_control="explicit"))
    engine = wired.engine
    gated = GatedLoader(wired.control.loader)  # type: ignore[arg-type]
    control = Control(engine, gated)
    async with serving(engine, control):
        write_version(models, 2)
        callers = [asyncio.create_task(control.load(NAME)) for _ in range(10)]
        await asyncio.to_thread(gated.built.wait, 30)
        for caller in callers[:5]:
            caller.cancel()
        gated.gate.set()
        outcomes = await asyncio.gather(*callers, return_exceptions=True)
        served = list(engine.registry.versions(NAME))
    assert gated.calls == 1
    assert [type(o).__name__ for o in outcomes] == ["CancelledError"] * 5 + ["NoneType"] * 5
    assert served == [2]


class ScriptedLoader:
    """A repository of one fake model whose files read as `script` says, poll after poll."""

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.read: list[str] = []  # each folder digest read, in order
        self.loads_after: list[int] = []  # how many reads there had been at each load

    def names(self) -> list[str]:
        return ["fake"]

    def folder_digest(self, name: str) -> Hashable:
        self.read.append(self.script[min(len(self.read), len(self.script) - 1)])
        return self.read[-1]

    def load(self, name: str, hold: Hold | None = None) -> dict[int, Model]:
        self.loads_after.append(len(self.read))
        return {1: fake_model()[0]}

    def released(self) -> None:
        pass


async def test_poll_loads_files_only_once_they_stop_changing() -> None:
    """Files read a, then b, c (being written), then c again: loaded once, at the first
    read that found them as they were a whole interval before; never while they changed."""
    loader = ScriptedLoader(["a", "b", "c", "c"])
    engine = Engine(Registry({"fake": fake_model()[0]}))
    control = Control(engine, loader, poll=True, interval_s=0.01)
    async with serving(engine, control):
        while len(loader.read) < 8:
            await asyncio.sleep(0.01)
    assert loader.read[:4] == ["a", "b", "c", "c"]
    assert loader.loads_after == [4]  # after the second "c", and never again


async def test_poll_stops_when_the_drain_begins(
    models: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file changed under `poll` during a drain is never loaded: the poller has stopped."""
    wired = wire(Settings(models=models, model_control="poll", poll_interval_s=0.05))
    engine = wired.engine
    with caplog.at_level(logging.INFO, logger="bucketserve.control"):
        async with serving(engine, wired.control) as client:
            assert await engine.drain()
            write_version(models, 2)
            await asyncio.sleep(0.5)  # ten poll intervals
            infer = await client.post(f"/v2/models/{NAME}/infer", json=infer_body(0))
            index = (await client.post("/v2/repository/index")).json()
    assert infer.status_code == 503
    assert index == [{"name": NAME, "version": "1", "state": "READY"}]
    assert any("no longer polled" in r.getMessage() for r in caplog.records)
    assert not any("loaded" in r.getMessage() for r in caplog.records)


# -- the full tier: a server process, tritonclient over HTTP and gRPC ------------------------


@pytest.mark.slow
def test_tritonclient_reloads_a_model_ten_times_under_16_clients(tmp_path: Path) -> None:
    """16 client threads send to `enc` all along, while tritonclient reloads it 10 times
    (a new version folder each, alternating HTTP and gRPC): nothing fails, and every answer
    is exact for a version loaded while it was in the server."""
    import threading

    grpcclient = pytest.importorskip("tritonclient.grpc")
    httpclient = pytest.importorskip("tritonclient.http")
    from loadtest.process import free_port
    from tests.helpers import server_process

    models = tmp_path / "models"
    write_version(models, 1)
    port = free_port()
    flags = ("--model-control", "explicit", "--grpc-port", str(port), "--instances", "2")
    with server_process(models, *flags) as (_, url, _log):
        address = url.removeprefix("http://")
        answers: list[Answered] = []
        failures: list[str] = []
        stop = threading.Event()

        def sender(offset: int) -> None:
            client = httpclient.InferenceServerClient(address)
            turn = offset
            while not stop.is_set():
                index = turn % len(SEQUENCES)
                ids = httpclient.InferInput("input_ids", [1, len(SEQUENCES[index])], "INT64")
                ids.set_data_from_numpy(np.asarray([SEQUENCES[index]], np.int64))
                sent = time.monotonic()
                try:
                    result = client.infer(NAME, [ids])
                except Exception as exc:  # (every one is a failure the test reports)
                    failures.append(repr(exc))
                    continue
                version = result.get_response()["model_version"]
                embedding = result.as_numpy("sentence_embedding")[0]
                answers.append(Answered(sent, time.monotonic(), index, version, embedding))
                turn += 1
            client.close()

        threads = [threading.Thread(target=sender, args=(i,)) for i in range(16)]
        for thread in threads:
            thread.start()
        loaded, replaced = {"1": 0.0}, {}
        http_control = httpclient.InferenceServerClient(address)
        grpc_control = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            time.sleep(0.3)
            for version in range(2, 12):
                write_version(models, version)
                loaded[str(version)] = time.monotonic()
                (http_control if version % 2 else grpc_control).load_model(NAME)
                replaced[str(version - 1)] = time.monotonic()
                time.sleep(0.3)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        assert failures == []
        assert grpc_control.is_model_ready(NAME)
        index = grpc_control.get_model_repository_index().models
        assert [(m.name, m.version, m.state) for m in index] == [(NAME, "11", "READY")]
        http_control.unload_model(NAME)  # and unloaded, and loaded again, over HTTP
        assert not http_control.is_model_ready(NAME)
        listed = http_control.get_model_repository_index()
        assert listed == [{"name": NAME, "state": "UNAVAILABLE", "reason": "unloaded"}]
        http_control.load_model(NAME)
        assert http_control.is_model_ready(NAME)
        http_control.close()
        grpc_control.close()
    references = {str(v): expected(models, v) for v in range(1, 12)}
    assert len({a.version for a in answers}) >= 8  # (most versions answered some requests)
    for answer in answers:
        assert loaded[answer.version] <= answer.received
        assert replaced.get(answer.version, float("inf")) >= answer.sent
        np.testing.assert_allclose(
            answer.embedding, references[answer.version][answer.index], atol=1e-5
        )


@pytest.mark.slow
def test_pss_after_unloading_returns_to_before_loading(tmp_path: Path) -> None:
    """A model of ~20 MB of weights: the server's Pss with it unloaded, loaded and unloaded
    again (each read after a few requests, the heap trimmed by the release): the last within
    8 MiB of the first, while loading it added most of its weights."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from loadtest.process import free_port
    from loadtest.pss import pss
    from tests.helpers import copy_bundled, server_process

    models = tmp_path / "models"
    graph = encoder(vocab=20000, dim=256, heads=4, layers=1, ffn=256, seed=3)
    save_model(graph, models / "big" / "1" / "model.onnx")
    (models / "big" / "config.toml").write_text(
        CONFIG.replace("vocab_size = 300", "vocab_size = 20000").format(policy="")
    )
    copy_bundled(models, "tiny-encoder")  # so that something stays served
    port = free_port()
    flags = ("--model-control", "explicit", "--grpc-port", str(port))
    with server_process(models, *flags) as (process, url, _log):
        control = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")

        def settled_pss() -> int:
            for _ in range(3):  # a few requests to the model that stays, then read
                httpx.post(f"{url}/predict", json={"model": "tiny-encoder", "sequences": [[5, 6]]})
            time.sleep(0.5)
            return pss(process.pid)

        control.unload_model("big")
        before = settled_pss()
        control.load_model("big")
        for seq in SEQUENCES:
            answer = httpx.post(f"{url}/predict", json={"model": "big", "sequences": [seq]})
            assert answer.status_code == 200
        loaded = settled_pss()
        control.unload_model("big")
        after = settled_pss()
        control.close()
    mib = 2**20
    shown = ", ".join(f"{n} {v / mib:.1f}" for n, v in (("unloaded", before), ("loaded", loaded)))
    print(f"Pss: {shown}, unloaded again {after / mib:.1f} MiB")
    # (its weights, 21 MB, are mapped from the server's copy: only the pages it touched and
    # what ONNX Runtime copied count, 16-18 MiB here; more than half of them, at least)
    assert loaded - before > 10 * mib
    assert abs(after - before) < 8 * mib

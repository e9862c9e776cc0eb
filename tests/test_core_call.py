"""The core call is the only way an edge reaches the engine: /predict, KServe v2 over HTTP and
KServe v2 over gRPC, sent the same sequences (with a priority and a tenant, each protocol's
way), hand the core the same call; a task head is
applied inside that call; and the import contracts keep any edge from reaching past it
(tests/test_layering.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from bucketserve.core.calls import Answer, Call, Sequences
from bucketserve.core.engine import Engine
from bucketserve.core.registry import Registry
from bucketserve.core.task import Task
from bucketserve.core.tasks.embedding import EMBEDDING, Embed, Embedding, Pooling
from bucketserve.errors import InferenceFailed, InvalidInput, TaskNotServed
from bucketserve.metrics import Metrics
from bucketserve.settings import Settings
from loadtest.process import free_port
from tests.engines import serving
from tests.fakes import fake_model
from tests.helpers import padded

grpc = pytest.importorskip("grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")

SEQUENCES = [[5, 9, 2], [7, 1]]
TIMEOUT_MS = 5000


class RecordingEngine(Engine):
    """The real engine, which writes down every call an edge makes before answering it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[Any, ...]] = []

    async def infer(self, call: Call) -> Answer:
        model = self.model(call.model, call.version)
        sequences = [s.tolist() for s in call.inputs.sequences(model)]
        self.calls.append(
            (
                call.model,
                call.version,
                call.outputs,
                call.timeout_ms,
                sequences,
                call.priority,
                call.tenant,
            )
        )
        return await super().infer(call)


def v2_inputs() -> list[dict[str, Any]]:
    ids, mask = padded(SEQUENCES)
    return [
        {"name": name, "shape": list(a.shape), "datatype": "INT64", "data": a.ravel().tolist()}
        for name, a in (("ids", ids), ("mask", mask))
    ]


def grpc_request(priority: bool = True) -> bytes:
    ids, mask = padded(SEQUENCES)
    message = service_pb2.ModelInferRequest(model_name="fake")
    for name, array in (("ids", ids), ("mask", mask)):
        message.inputs.add(name=name, datatype="INT64", shape=list(array.shape))
        message.raw_input_contents.append(array.tobytes())
    message.outputs.add(name="total")
    message.parameters["timeout"].int64_param = TIMEOUT_MS * 1000  # microseconds
    if priority:
        message.parameters["priority"].uint64_param = 1  # as tritonclient sends it
    return bytes(message.SerializeToString())


async def test_every_edge_makes_the_same_call_for_the_same_sequences() -> None:
    from bucketserve.control import Control
    from bucketserve.edges.auth import ApiKeys
    from bucketserve.edges.grpc import GrpcListener
    from bucketserve.process.wiring import grpc_options

    model, _ = fake_model()
    port = free_port()
    settings = Settings(grpc_port=port, tenant_header="X-Tenant")
    engine = RecordingEngine(Registry({model.name: model}, model.name), settings)
    keys = ApiKeys((), tenant_header="X-Tenant")
    async with serving(engine) as client:
        options = grpc_options(settings, engine.tracing)
        grpc_server = GrpcListener(engine, Control(engine, None), Metrics(), keys, options)
        await grpc_server.start()
        try:
            predicted = await client.post(
                "/predict",
                json={"model": "fake", "sequences": SEQUENCES, "outputs": ["total"]},
                headers={
                    "X-Request-Timeout-Ms": str(TIMEOUT_MS),
                    "X-Priority": "1",
                    "X-Tenant": "search",
                },
            )
            inferred = await client.post(
                "/v2/models/fake/infer",
                json={
                    "inputs": v2_inputs(),
                    "outputs": [{"name": "total"}],
                    "parameters": {"timeout": TIMEOUT_MS * 1000, "priority": 1},
                },
                headers={"X-Tenant": "search"},
            )
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                method = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
                # Triton's parameter before the metadata; the metadata where it is alone
                metadata = (("x-tenant", "search"), ("x-priority", "3"))
                sent = await method(grpc_request(), metadata=metadata)
                answer = service_pb2.ModelInferResponse.FromString(sent)
                metadata = (("x-tenant", "search"), ("x-priority", "1"))
                await method(grpc_request(priority=False), metadata=metadata)
        finally:
            await grpc_server.stop()

    expected = ("fake", None, ("total",), TIMEOUT_MS, SEQUENCES, 1, "search")
    assert engine.calls == [expected] * 4
    totals = [sum(s) for s in SEQUENCES]
    assert [o["total"] for o in predicted.json()["outputs"]] == totals
    assert inferred.json()["outputs"][0]["data"] == totals
    assert np.frombuffer(answer.raw_output_contents[0], np.int64).tolist() == totals


async def test_a_task_head_answers_inside_the_one_call() -> None:
    """The engine reads only what the head asks for and answers with the head's results; a
    model that cannot do the task is refused before anything is admitted."""
    rule = Embedding("doubled", Pooling.MEAN, normalize=False, width=None, dimensions="any")
    embedder, _ = fake_model("embedder", embedding=rule)
    plain, plain_runs = fake_model("plain")
    engine = Engine(Registry({"embedder": embedder, "plain": plain}))
    async with engine.running(Metrics()):
        answer = await engine.infer(Call(Sequences([[1, 2, 3], [4]]), "embedder", head=Embed()))
        with pytest.raises(InvalidInput, match="does not embed") as refused:
            await engine.infer(Call(Sequences([[1]]), "plain", head=Embed()))
    assert [sorted(out) for out in answer.outputs] == [[EMBEDDING], [EMBEDDING]]
    assert [float(out[EMBEDDING]) for out in answer.outputs] == [4.0, 8.0]  # mean of ids x 2
    assert answer.lengths == [3, 1]
    assert refused.value.param == "model"
    assert plain_runs.batches == []


async def test_a_head_answers_in_the_worker_as_its_batch_finishes() -> None:
    """A head turns each sequence's outputs into its answer in the thread that ran the batch,
    so a request's future holds the answer; a head that fails fails its own sequence only."""

    class Recorded(Embed):
        threads: list[str] = []  # noqa: RUF012 (one list the test reads)

        def answer(self, model: Any, outputs: Any, sequence: np.ndarray) -> Any:
            Recorded.threads.append(threading.current_thread().name)
            if len(sequence) == 2:
                raise ValueError("a head's fault")
            return super().answer(model, outputs, sequence)

    rule = Embedding("doubled", Pooling.MEAN, normalize=False, width=None, dimensions="any")
    embedder, runs = fake_model("embedder", embedding=rule, max_queue_delay_ms=50)
    engine = Engine(Registry({"embedder": embedder}))
    async with engine.running(Metrics()):
        good, bad = await asyncio.gather(
            engine.infer(Call(Sequences([[1, 2, 3]]), "embedder", head=Recorded())),
            engine.infer(Call(Sequences([[4, 5]]), "embedder", head=Recorded())),
            return_exceptions=True,
        )
    assert isinstance(good, Answer)
    assert float(good.outputs[0][EMBEDDING]) == 4.0
    assert isinstance(bad, InferenceFailed)
    assert len(runs.batches) == 1  # (one batch, two requests: the failure stayed the second's)
    assert Recorded.threads
    assert all(name.startswith("run-embedder") for name in Recorded.threads)


def test_a_call_without_a_model_goes_to_one_that_serves_its_task() -> None:
    """The default when it serves the task; else the one model that does; else a 400 naming
    those that do, or saying none does. A call of a model's own outputs goes to the default."""
    rule = Embedding("doubled", Pooling.MEAN, normalize=False, width=None, dimensions="any")
    plain, _ = fake_model("plain")
    one, _ = fake_model("one", embedding=rule)
    two, _ = fake_model("two", embedding=rule)
    single = Registry({"plain": plain, "one": one}, "plain")
    assert single.for_task(Task.EMBED) == "one"
    assert single.for_task(Task.PREDICT) == "plain"
    both = Registry({"plain": plain, "one": one, "two": two}, "plain")
    with pytest.raises(TaskNotServed, match="2 serve embed: name one of one, two") as named:
        both.for_task(Task.EMBED)
    assert named.value.status == 400
    assert named.value.param == "model"
    with pytest.raises(TaskNotServed, match="none of this server's models serves rerank"):
        both.for_task(Task.RERANK)
    assert Registry({"one": one, "two": two}, "two").for_task(Task.EMBED) == "two"

"""Traces, captured with the OpenTelemetry SDK's in-memory exporter: a request's span (a
`traceparent` continued), its admission and its wait in the queue, and the batch it shared,
linked both ways, with the batch's model, version, bucket edge, rows, padded tokens and
instance; the same over gRPC; and off, nothing at all."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bucketserve.loading import load_engine
from bucketserve.settings import Settings
from bucketserve.tracing import OpenTelemetryTracing, Tracing, configured
from tests.engines import serving

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
export = pytest.importorskip("opentelemetry.sdk.trace.export")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def exporter() -> Iterator[Any]:
    exporter = in_memory.InMemorySpanExporter()
    yield exporter
    exporter.clear()


def tracing_into(exporter: Any) -> OpenTelemetryTracing:
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    return OpenTelemetryTracing(provider)


@pytest.fixture
def models(repository: Callable[..., Path]) -> Path:
    return repository("tiny-encoder")


def by_name(spans: list[Any], name: str) -> list[Any]:
    return [s for s in spans if s.name == name]


async def test_a_request_its_queue_wait_and_the_batch_it_shared(
    models: Path, exporter: Any
) -> None:
    engine = load_engine(Settings(models=models, max_queue_delay_ms=50))
    engine.tracing = tracing_into(exporter)
    async with serving(engine) as client:
        traced = client.post(
            "/predict", json={"sequences": [[5, 6, 7]]}, headers={"traceparent": PARENT}
        )
        other = client.post("/predict", json={"sequences": [[8, 9]]})  # the same bucket
        answers = await asyncio.gather(traced, other)
    assert [a.status_code for a in answers] == [200, 200]
    spans = exporter.get_finished_spans()
    requests = by_name(spans, "POST /predict")
    assert len(requests) == 2
    request = next(s for s in requests if format(s.context.trace_id, "032x") == TRACE_ID)
    assert format(request.parent.span_id, "016x") == "00f067aa0ba902b7"  # continued
    assert request.attributes["http.response.status_code"] == 200
    ours = [s for s in spans if s.context.trace_id == request.context.trace_id]
    (admission,) = by_name(ours, "bucketserve.admission")
    (wait,) = by_name(ours, "bucketserve.queue")
    assert admission.parent.span_id == wait.parent.span_id == request.context.span_id
    assert admission.attributes["bucketserve.model"] == "tiny-encoder"
    (batch,) = by_name(spans, "bucketserve.batch")  # both requests, one batch
    assert batch.context.trace_id != request.context.trace_id  # a trace of its own
    waits = by_name(spans, "bucketserve.queue")
    assert {link.context.span_id for link in batch.links} == {w.context.span_id for w in waits}
    for each in waits:  # and each wait links its batch: a request's trace shows what it shared
        assert [link.context.span_id for link in each.links] == [batch.context.span_id]
        assert each.end_time == batch.start_time  # the wait ends as the batch starts
    assert batch.attributes["bucketserve.model"] == "tiny-encoder"
    assert batch.attributes["bucketserve.model_version"] == "1"
    assert batch.attributes["bucketserve.bucket"] == 8
    assert batch.attributes["bucketserve.sequences"] == 2
    rows, length = batch.attributes["bucketserve.rows"], batch.attributes["bucketserve.length"]
    assert batch.attributes["bucketserve.padded_tokens"] == rows * length - 5
    assert batch.attributes["bucketserve.instance"] in range(engine.instances)


async def test_a_refused_request_has_its_span_and_no_batch(models: Path, exporter: Any) -> None:
    engine = load_engine(Settings(models=models))
    engine.tracing = tracing_into(exporter)
    async with serving(engine) as client:
        refused = await client.post("/predict", json={"sequences": [[99999]]})
    assert refused.status_code == 422
    spans = exporter.get_finished_spans()
    (request,) = by_name(spans, "POST /predict")
    assert request.attributes["http.response.status_code"] == 422
    (admission,) = by_name(spans, "bucketserve.admission")
    assert not admission.status.is_ok  # the error recorded where it was raised
    assert not by_name(spans, "bucketserve.batch")


@pytest.mark.slow
def test_grpc_continues_a_traceparent(models: Path, exporter: Any, tmp_path: Path) -> None:
    """Over gRPC, in process: the server's own listener on a free port, tritonclient's
    metadata carrying the parent."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from bucketserve.control import Control
    from bucketserve.edges.auth import ApiKeys
    from bucketserve.edges.grpc.listener import GrpcListener
    from bucketserve.metrics import Metrics
    from bucketserve.process.wiring import grpc_options
    from loadtest.process import free_port

    port = free_port()
    settings = Settings(models=models, grpc_port=port)
    engine = load_engine(settings)
    engine.tracing = tracing_into(exporter)

    async def serve_and_ask() -> None:
        metrics = Metrics()
        async with engine.running(metrics):
            options = grpc_options(settings, engine.tracing)
            server = GrpcListener(engine, Control(engine, None), metrics, ApiKeys(()), options)
            await server.start()
            try:
                client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
                ids = grpcclient.InferInput("input_ids", [1, 3], "INT64")
                import numpy as np

                ids.set_data_from_numpy(np.array([[5, 6, 7]], np.int64))
                await asyncio.to_thread(
                    client.infer, "tiny-encoder", [ids], headers={"traceparent": PARENT}
                )
                client.close()
            finally:
                await server.stop()

    asyncio.run(serve_and_ask())
    spans = exporter.get_finished_spans()
    (request,) = by_name(spans, "/inference.GRPCInferenceService/ModelInfer")
    assert format(request.context.trace_id, "032x") == TRACE_ID
    assert request.attributes["bucketserve.status"] == 200
    assert by_name(spans, "bucketserve.batch")


def test_off_unless_configured() -> None:
    assert type(configured(None, {})) is Tracing
    assert (
        type(
            configured(
                None,
                {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"},
            )
        )
        is Tracing
    )
    assert configured("http://127.0.0.1:4318", {}).enabled
    assert configured(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}).enabled


async def test_off_opens_nothing(models: Path) -> None:
    engine = load_engine(Settings(models=models))
    assert not engine.tracing.enabled
    async with serving(engine) as client:
        answer = await client.post("/predict", json={"sequences": [[5, 6, 7]]})
    assert answer.status_code == 200
    waits = [engine.tracing.queued() for _ in range(3)]
    assert waits == [None, None, None]  # no span object made per sequence


def test_off_the_process_loads_no_sdk(models: Path) -> None:
    """Tracing off, a served request loads nothing of OpenTelemetry's SDK or exporters (FastAPI
    imports its API on its own, which traces nothing without a provider)."""
    import subprocess
    import sys

    script = (
        "import asyncio, sys, httpx\n"
        "from bucketserve.loading import load_engine\n"
        "from bucketserve.edges.http.app import create_app\n"
        "from bucketserve.metrics import Metrics\n"
        f"engine = load_engine({str(models)!r})\n"
        "async def ask():\n"
        "    app = create_app(engine)\n"
        "    async with engine.running(Metrics()):\n"
        "        transport = httpx.ASGITransport(app=app)\n"
        "        async with httpx.AsyncClient(transport=transport, base_url='http://t') as c:\n"
        "            r = await c.post('/predict', json={'sequences': [[5, 6]]})\n"
        "            assert r.status_code == 200\n"
        "asyncio.run(ask())\n"
        "loaded = ('opentelemetry.sdk', 'opentelemetry.exporter')\n"
        "print(sorted(m for m in sys.modules if m.startswith(loaded)))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env
    )
    assert result.stdout.strip() == "[]"

"""In-process HTTP: batches form by length under concurrent load, and answers stay exact."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bucketserve.core.bucketing import BucketKey
from bucketserve.core.engine import Engine
from bucketserve.core.registry import Registry
from bucketserve.loading import ModelSpec, build_model
from bucketserve.loading.check import random_sequences
from bucketserve.settings import Settings
from tests.engines import Reference, make_engine, serving, spec_of
from tests.helpers import lengths_over_buckets


async def test_concurrent_mixed_lengths_batch_by_length_and_stay_exact(tmp_models: Path) -> None:
    engine = make_engine(tmp_models, "tiny-encoder", max_queue_delay_ms=30)
    model = engine.model("tiny-encoder")
    batches: list[tuple[BucketKey, list[int]]] = []  # what the scheduler asked the model to run
    run_batch = model.run_batch

    def recorded(key: BucketKey, sequences: Sequence[np.ndarray], alone: bool = False) -> Any:
        batches.append((key, [len(s) for s in sequences]))
        return run_batch(key, sequences, alone)

    model.run_batch = recorded  # type: ignore[method-assign]
    spec = spec_of(tmp_models, "tiny-encoder")
    edges = spec.config.batching.edges
    lengths = lengths_over_buckets(edges[:6], 90, seed=3)
    sequences = random_sequences(model.info.rules, lengths, seed=4)
    requests = [sequences[i : i + 3] for i in range(0, len(sequences), 3)]  # 30 requests of 3

    async with serving(engine) as client:
        responses = await asyncio.gather(
            *(
                client.post("/predict", json={"sequences": [s.tolist() for s in r]})
                for r in requests
            )
        )

    assert [r.status_code for r in responses] == [200] * len(requests)
    reference = Reference(spec)
    for request, response in zip(requests, responses, strict=True):
        body = response.json()
        assert body["model"] == "tiny-encoder"
        assert len(body["outputs"]) == len(request)
        for seq, out in zip(request, body["outputs"], strict=True):
            expected = reference(seq)
            for name, value in expected.items():
                np.testing.assert_allclose(np.asarray(out[name], np.float32), value, atol=1e-5)
    # The executor's log: every sequence computed once, each batch inside one bucket, and
    # batches really formed (fewer batches than sequences, several rows in some).
    assert sum(len(lengths) for _, lengths in batches) == len(sequences)
    lower = dict(zip(edges, [0, *edges[:-1]], strict=False))
    for key, batch_lengths in batches:
        assert all(lower[key.length] < n <= key.length for n in batch_lengths), (key, batch_lengths)
        assert len(batch_lengths) <= key.rows
    assert len(batches) < len(sequences) / 3
    assert max(len(b) for _, b in batches) >= 4
    assert len({key for key, _ in batches}) == 6


async def test_features_model_and_request_id(tmp_models: Path) -> None:
    engine = make_engine(tmp_models, "tiny-encoder", "tiny-lstm", default_model="tiny-encoder")
    model = engine.model("tiny-lstm")
    sequences = random_sequences(model.info.rules, [5, 40], seed=1)
    async with serving(engine) as client:
        response = await client.post(
            "/predict",
            headers={"X-Request-Id": "abc-123"},
            json={"model": "tiny-lstm", "sequences": [s.tolist() for s in sequences]},
        )
        generated = await client.post("/predict", json={"sequences": [[1, 2]]})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "abc-123"
    assert len(generated.headers["x-request-id"]) == 32
    reference = Reference(spec_of(tmp_models, "tiny-lstm"))
    for seq, out in zip(sequences, response.json()["outputs"], strict=True):
        assert np.asarray(out["tags"]).shape == (len(seq), 5)
        np.testing.assert_allclose(out["tags"], reference(seq)["tags"], atol=1e-5)
        np.testing.assert_allclose(out["final_state"], reference(seq)["final_state"], atol=1e-5)


async def test_metrics_report_batches_padding_and_keys(tmp_models: Path) -> None:
    engine = make_engine(tmp_models, "tiny-encoder")
    async with serving(engine) as client:
        await client.post("/predict", json={"sequences": [[1] * 10, [2] * 12, [3] * 3]})
        text = (await client.get("/metrics")).text
    assert 'bucketserve_requests_total{route="/predict",status="200"} 1.0' in text
    # 10 and 12 in bucket 16, run at their own longest: 2 rows x 12 = 24 computed, 22 real
    assert 'bucketserve_computed_tokens_total{bucket="16",model="tiny-encoder"} 24.0' in text
    assert 'bucketserve_padded_tokens_total{bucket="16",model="tiny-encoder"} 2.0' in text
    assert 'bucketserve_padding_ratio{bucket="8",model="tiny-encoder"} 0.0' in text
    assert 'bucketserve_bound_keys{model="tiny-encoder"} 3.0' in text  # default, 8, 16
    assert 'bucketserve_batch_size_count{bucket="16",model="tiny-encoder"} 1.0' in text
    assert "bucketserve_queue_seconds_bucket" in text
    assert "bucketserve_compute_seconds_bucket" in text


async def test_text_requests_use_the_tokenizer(minilm_spec: ModelSpec, tmp_path: Path) -> None:
    engine = Engine(Registry({"minilm": build_model(minilm_spec)}, "minilm"), Settings())
    model = engine.model()
    async with serving(engine) as client:
        response = await client.post(
            "/predict", json={"text": ["hello world", "a longer text here"]}
        )
    assert response.status_code == 200
    outputs = response.json()["outputs"]
    expected = model.predict(model.encode(["hello world", "a longer text here"]))
    for out, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(out["sentence_embedding"], want["sentence_embedding"], atol=1e-5)
        assert len(out["last_hidden_state"]) == len(want["last_hidden_state"])


async def test_only_the_requested_outputs_and_the_config_as_served(tmp_models: Path) -> None:
    engine = make_engine(tmp_models, "tiny-encoder", "tiny-lstm", default_model="tiny-encoder")
    sequence = np.array([5, 9, 2, 7])
    async with serving(engine) as client:
        pooled = await client.post(
            "/predict", json={"sequences": [sequence.tolist()], "outputs": ["sentence_embedding"]}
        )
        server = await client.get("/v2")
        config = await client.get("/v2/models/tiny-lstm/config")
    assert pooled.status_code == 200
    (out,) = pooled.json()["outputs"]
    assert list(out) == ["sentence_embedding"]
    expected = Reference(spec_of(tmp_models, "tiny-encoder"))(sequence)["sentence_embedding"]
    np.testing.assert_allclose(out["sentence_embedding"], expected, atol=1e-5)
    assert server.json()["default_model"] == "tiny-encoder"
    served = config.json()
    lstm = engine.model("tiny-lstm")
    assert served["name"] == "tiny-lstm"
    assert served["batching"]["buckets"] == list(lstm.plan.edges)
    assert served["inputs"]["features"]["role"] == "features"
    assert served["strategy"] == lstm.executor.binding

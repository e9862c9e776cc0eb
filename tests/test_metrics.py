"""Metrics stay bounded: whatever lengths arrive and whatever the policy, the `bucket` label
takes only a model's configured edges."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bucketserve.core.bucketing import Policy
from bucketserve.loading.check import random_sequences
from tests.engines import make_engine, serving
from tests.zoo import add_to


async def test_an_exact_length_model_adds_no_series_per_length(tmp_models: Path) -> None:
    add_to(tmp_models, "ctc-fbank")
    engine = make_engine(tmp_models)
    model = engine.model("ctc-fbank")
    assert model.plan.policy is Policy.EXACT_LENGTH
    lengths = list(range(1, 65))  # 64 distinct lengths: 64 keys, 5 configured edges
    sequences = random_sequences(model.info.rules, lengths, seed=0)

    async with serving(engine) as client:
        for start in range(0, len(sequences), 8):
            body = {"sequences": [s.tolist() for s in sequences[start : start + 8]]}
            assert (await client.post("/predict", json=body)).status_code == 200
        text = (await client.get("/metrics")).text

    assert len(model.executor.bound_keys) > 20  # exact lengths really were separate keys
    series: dict[str, set[tuple[tuple[str, str], ...]]] = {}  # sample name -> its label sets
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "bucket" in sample.labels:
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
                series.setdefault(sample.name, set()).add(labels)
    edges = {str(e) for e in model.plan.edges}
    assert {dict(labels)["bucket"] for found in series.values() for labels in found} == edges
    for name, found in series.items():
        assert len(found) <= len(edges), name  # one series per edge, not per length


async def test_the_router_gauges_are_served_per_model_and_settle_at_zero(tmp_models: Path) -> None:
    """What routers and autoscalers read (the Gateway API Inference Extension's queued and
    running requests): a gauge a model, back at 0 once everything is answered."""
    engine = make_engine(tmp_models, "tiny-encoder")
    async with serving(engine) as client:
        body = {"sequences": [[5, 6, 7], [8] * 40]}
        assert (await client.post("/predict", json=body)).status_code == 200
        text = (await client.get("/metrics")).text
    values = {
        (sample.name, sample.labels.get("model")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    for name in ("requests_waiting", "requests_running", "tokens_waiting"):
        assert values[(f"bucketserve_{name}", "tiny-encoder")] == 0.0

"""Every export in the zoo, under every strategy, over HTTP: concurrent requests of mixed
lengths, and every answer equal (within the tolerance) to the model run on that sequence
alone, unpadded. Models that batching moves are served one sequence per run and exact."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from serve.core.bucketing import Policy
from serve.loading.check import random_sequences
from tests.helpers import Reference, make_engine, serving, spec_of
from tests.zoo import ZOO, add_to

STRATEGIES = ["shared-session", "session-per-key", "mutable"]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", list(ZOO))
async def test_every_answer_equals_the_model_alone(
    tmp_models: Path, name: str, strategy: str
) -> None:
    add_to(tmp_models, name)
    engine = make_engine(tmp_models, strategy=strategy, max_queue_delay_ms=5)
    model = engine.model(name)
    policy = Policy(ZOO[name].policy)
    assert model.plan.policy is policy
    assert model.strategy == (strategy if policy is Policy.BUCKETS else "mutable")
    rng = np.random.default_rng(len(name))
    lengths = [int(n) for n in rng.integers(1, model.plan.max_length + 1, 48)]
    sequences = random_sequences(model.info.rules, lengths, seed=3)
    requests = [sequences[i : i + 3] for i in range(0, len(sequences), 3)]

    async with serving(engine) as client:
        responses = await asyncio.gather(
            *(
                client.post("/predict", json={"model": name, "sequences": [s.tolist() for s in r]})
                for r in requests
            )
        )

    reference = Reference(spec_of(tmp_models, name))
    tolerance = model.info.invariance.tolerance if policy is Policy.BUCKETS else 1e-6
    for request, response in zip(requests, responses, strict=True):
        assert response.status_code == 200, response.text
        for seq, answer in zip(request, response.json()["outputs"], strict=True):
            for output, alone in reference(seq).items():
                got = np.asarray(answer[output], alone.dtype)
                assert got.shape == alone.shape, (output, len(seq))
                np.testing.assert_allclose(got, alone, rtol=tolerance, atol=tolerance)

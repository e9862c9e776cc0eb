"""Every bundled model, every binding: batched answers equal each sequence run alone."""

from __future__ import annotations

import numpy as np
import pytest

from bucketserve.core.bucketing import Policy
from bucketserve.loading import ModelSpec, build_model
from bucketserve.loading.check import random_sequences
from bucketserve.loading.layouts import sequence_rules
from tests.engines import Reference
from tests.helpers import lengths_over_buckets

BINDINGS = ["shared-session", "session-per-key", "mutable"]
TOLERANCE = 1e-5


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("model_name", ["tiny-encoder", "tiny-lstm", "minilm"])
def test_batched_equals_alone(
    bundled_specs: dict[str, ModelSpec], model_name: str, binding: str
) -> None:
    spec = bundled_specs[model_name]
    edges = spec.config.batching.edges
    sequences = random_sequences(
        sequence_rules(spec), lengths_over_buckets(edges, 200, seed=7), seed=11
    )
    model = build_model(spec, binding)
    assert model.binding == binding
    assert model.plan.policy is Policy.BUCKETS

    answers = model.predict(sequences)

    # every bucket was used, so every key was bound and ran real batches
    assert {k.length for k in model.executor.bound_keys} == set(edges)
    reference = Reference(spec)
    assert len(answers) == len(sequences)
    for seq, answer in zip(sequences, answers, strict=True):
        expected = reference(seq)
        assert answer.keys() == expected.keys()
        for name, value in expected.items():
            assert answer[name].shape == value.shape
            np.testing.assert_allclose(
                answer[name],
                value,
                rtol=TOLERANCE,
                atol=TOLERANCE,
                err_msg=f"{name} at length {len(seq)}",
            )

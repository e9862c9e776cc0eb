"""The pad-safety self-check: pad-sensitive models are detected and still answered exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelgen import graphs
from serve.bucketing import BucketKey
from serve.loading import build_model, load_model_spec
from serve.loading.check import random_sequences
from serve.model import Model
from tests.helpers import MODELS, Reference, spec_of, write_model

UNMASKED_CONFIG = """
binding = "session-per-key"
[inputs.input_ids]
role = "tokens"
vocab_size = 2000
[inputs.token_type_ids]
role = "token_types"
[outputs.last_hidden_state]
per_step = true
[outputs.sentence_embedding]
[batching]
buckets = [8, 16, 32]
max_batch_size = 8
"""


def unmasked_model(tmp_models: Path) -> Model:
    write_model(tmp_models, "unmasked", graphs.encoder(masked=False), UNMASKED_CONFIG)
    spec = load_model_spec(tmp_models / "unmasked")
    assert spec is not None
    return build_model(spec)


def test_unmasked_model_is_detected_and_grouped_by_exact_length(tmp_models: Path) -> None:
    model = unmasked_model(tmp_models)
    assert model.pad_sensitive
    assert model.strategy == "mutable"  # runs each batch at its one exact length
    assert model.plan.key_for(11) == BucketKey(8, 11)


def test_pad_sensitive_model_answers_exactly(tmp_models: Path) -> None:
    model = unmasked_model(tmp_models)
    sequences = random_sequences(model.info.rules, [3, 11, 11, 32, 5, 3, 17, 1], seed=5)

    answers = model.predict(sequences)

    reference = Reference(spec_of(tmp_models, "unmasked"))
    for seq, answer in zip(sequences, answers, strict=True):
        for name, value in reference(seq).items():
            np.testing.assert_allclose(answer[name], value, rtol=1e-5, atol=1e-5)


def test_masked_models_are_pad_safe() -> None:
    for name in ("tiny-encoder", "tiny-lstm"):
        spec = load_model_spec(MODELS / name)
        assert spec is not None
        assert not build_model(spec).pad_sensitive


def test_config_can_declare_pad_sensitivity(tmp_models: Path) -> None:
    config = UNMASKED_CONFIG.replace('binding = "session-per-key"', "pad_sensitive = true")
    write_model(
        tmp_models,
        "declared",
        graphs.encoder(),
        config.replace(
            "[inputs.token_type_ids]",
            '[inputs.attention_mask]\nrole = "mask"\n[inputs.token_type_ids]',
        ),
    )
    spec = load_model_spec(tmp_models / "declared")
    assert spec is not None
    assert build_model(spec).pad_sensitive

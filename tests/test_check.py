"""The invariance check: what padding and batching do to each model, measured at load; the
serving policy it allows; the config's override and tolerance; the verdict in the log, on the
config route and in the metrics."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bucketserve.core.bucketing import Policy
from bucketserve.core.layout import SAME_STEPS
from bucketserve.core.model import SequenceRules
from bucketserve.errors import ConfigError
from bucketserve.loading import build_model, load_model_spec, pad_safe
from bucketserve.loading.check import difference, random_sequences
from bucketserve.loading.speed import LOSS
from modelgen.save import save_model
from tests.engines import Reference, make_engine, serving, spec_of
from tests.zoo import ZOO, add_to


@pytest.mark.parametrize("name", list(ZOO))
def test_the_check_finds_each_exports_policy(
    tmp_models: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    spec = spec_of(add_to(tmp_models, name).parent, name)
    with caplog.at_level(logging.INFO, logger="bucketserve.loading"):
        model = build_model(spec)

    expected = Policy(ZOO[name].policy)
    assert model.plan.policy is expected
    checked = model.info.invariance
    speed = model.info.served_config["check"].get("speed")
    if name == "pairwise-cost":  # exact in any batch, but batching measured to lose
        assert checked.policy is Policy.BUCKETS
        assert speed["ratio"] < LOSS
        assert speed["batched_per_s"] < speed["single_per_s"]
        assert "batching loses, served one sequence per run" in caplog.text
        return
    if checked.policy is not Policy.SINGLE and speed is not None:  # measured, and it paid
        assert speed["ratio"] >= LOSS
    assert checked.policy is expected
    tolerance = checked.tolerance
    if expected is Policy.BUCKETS:  # masked: padding and batching leave the answers alone
        assert checked.padding <= tolerance
        assert checked.batching <= tolerance
    elif expected is Policy.EXACT_LENGTH:  # padding moves them, batching does not
        assert checked.padding > 100 * tolerance
        assert checked.batching <= tolerance
    else:  # rows move each other (int8: the activations' scale is the whole batch's)
        assert checked.batching > 10 * tolerance
    if expected is not Policy.BUCKETS:
        assert model.binding == "mutable"  # unpadded batches run at their own shape
    served = model.info.served_config
    assert served["batching"]["policy"] == expected.value
    freed = served["check"].get("batch_freed")  # a batch declared 1: a freed copy checked
    assert (freed is not None) == (name in ("declared-one-encoder", "dynamo-batch-one"))
    if freed is not None:
        batched = name == "declared-one-encoder"  # row by row; the dynamo export flattens rows
        assert freed["served"] == ("freed" if batched else "original")
    why = served["check"].get("single")
    if why is not None:  # the graph takes one sequence a run: there is no batch to measure
        assert why == (
            "it has no batch axis" if name == "unbatched-frames" else "its batch is fixed at 1"
        )
        assert any(why in r.message for r in caplog.records if r.levelno == logging.WARNING)
        return
    # The figures are in the log line, and the config route says the same
    verdict = next(r for r in caplog.records if f"model {name}: padding moves" in r.message)
    assert f"{checked.padding:.2g}" in verdict.message
    assert f"{checked.batching:.2g}" in verdict.message
    assert verdict.levelno == (logging.INFO if expected is Policy.BUCKETS else logging.WARNING)
    unbound = name == "declared-batch-one"  # its batches fail in the buffers serving binds
    figures = {
        "padding": "failed" if unbound else checked.padding,
        "batching": "failed" if unbound else checked.batching,
        "tolerance": tolerance,
        "policy": expected.value,
    }
    assert {key: served["check"][key] for key in figures} == figures
    assert bool(served["check"]["failures"]) is unbound
    rewritten = served["check"].get("pad_safe")
    assert (rewritten is not None) == (
        name
        in (
            "unmasked-bilstm",
            "unmasked-bigru",
            "padding-mask-bigru",
            "strided-bilstm",
            "crnn-line",
            "mask-pooled-bigru",
        )
    )
    own_steps = {"strided-bilstm": "floor((T + 1) / 2)", "crnn-line": "floor(T / 4)"}
    if name in own_steps:  # its LSTM runs over fewer steps than the input's: lengths in its own
        assert rewritten["rewritten"] == [f"LSTM lstm_12 ({own_steps[name]} steps)"]
    if rewritten is not None:  # padding moved the original; the rewritten copy is served
        assert rewritten["padding_before"] > 100 * tolerance
        assert rewritten["padding_after"] == checked.padding <= tolerance
        assert rewritten["served"] == "rewritten"


def test_a_rewritten_copy_that_fails_its_check_leaves_the_model_as_it_is(
    tmp_models: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The strided BiLSTM given each row's length in input steps (as if its own steps were
    the input's): ONNX Runtime refuses the copy's batches; logged, the original served
    exact-length, never a crashed load."""
    monkeypatch.setattr(pad_safe, "_rule", lambda size, spec, rules: SAME_STEPS)
    spec = spec_of(add_to(tmp_models, "strided-bilstm").parent, "strided-bilstm")
    with caplog.at_level(logging.WARNING, logger="bucketserve.loading"):
        model = build_model(spec)
    assert model.plan.policy is Policy.EXACT_LENGTH
    assert model.info.served_config["check"]["pad_safe"] == {
        "rewritten": ["LSTM lstm_12"],
        "served": "original",
        "check": "failed (logged)",
    }
    assert "given each row's length fails the check" in caplog.text


@pytest.mark.parametrize("name", ["int8-bilstm", "ctc-fbank", "frames"])
def test_models_that_batching_moves_still_answer_exactly(tmp_models: Path, name: str) -> None:
    spec = spec_of(add_to(tmp_models, name).parent, name)
    model = build_model(spec)
    lengths = [3, 11, 11, 32, 5, 3, 17, 1, 11, 64, 40, 40]
    sequences = random_sequences(model.info.rules, lengths, seed=5)

    answers = model.predict(sequences)

    reference = Reference(spec)
    for seq, answer in zip(sequences, answers, strict=True):
        for output, value in reference(seq).items():
            np.testing.assert_allclose(answer[output], value, rtol=1e-6, atol=1e-6)


def test_a_config_that_knows_better_is_obeyed_and_warned(
    tmp_models: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = add_to(tmp_models, "int8-bilstm")
    (folder / "config.toml").write_text(ZOO["int8-bilstm"].config + 'policy = "buckets"\n')
    with caplog.at_level(logging.WARNING, logger="bucketserve.loading"):
        model = build_model(spec_of(tmp_models, "int8-bilstm"))
    assert model.plan.policy is Policy.BUCKETS
    assert model.info.served_config["check"]["policy"] == "single"  # what was measured
    assert any(
        "batching.policy = 'buckets' is set" in r.message and "may differ" in r.message
        for r in caplog.records
    )


def test_the_tolerance_is_the_configs(tmp_models: Path) -> None:
    folder = add_to(tmp_models, "ctc-fbank")
    (folder / "config.toml").write_text(ZOO["ctc-fbank"].config + "tolerance = 10.0\n")
    model = build_model(spec_of(tmp_models, "ctc-fbank"))
    assert model.info.invariance.padding > 1e-4
    assert model.plan.policy is Policy.BUCKETS  # every difference is within 10


def batch_of_one_export() -> onnx.ModelProto:
    """An export with its batch baked in: a Reshape to [1, -1, 8] that runs on any batch but
    merges its rows (what a traced batch of 1 leaves behind)."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((50, 8)).astype(np.float32), "emb"),
        numpy_helper.from_array(np.array([1, -1, 8], np.int64), "one_row"),
    ]
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["x"]),
        helper.make_node("Reshape", ["x", "one_row"], ["merged"]),
        helper.make_node("CumSum", ["merged", "axis"], ["steps"]),
    ]
    weights.append(numpy_helper.from_array(np.array(1, np.int64), "axis"))
    graph = helper.make_graph(
        nodes,
        "batch_of_one",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("steps", TensorProto.FLOAT, ["batch", "seq", 8])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_a_batch_the_model_cannot_run_means_one_sequence_per_run(tmp_models: Path) -> None:
    save_model(batch_of_one_export(), tmp_models / "traced" / "1" / "model.onnx")
    (tmp_models / "traced" / "config.toml").write_text(
        '[inputs.ids]\nrole = "tokens"\nvocab_size = 50\n[outputs.steps]\n'
        "[batching]\nbuckets = [8, 16]\n"
    )
    spec = spec_of(tmp_models, "traced")
    model = build_model(spec)
    assert model.plan.policy is Policy.SINGLE
    failures = model.info.served_config["check"]["failures"]
    assert failures
    assert model.info.served_config["check"]["batching"] == "failed"
    sequences = [np.array([3, 1, 4, 1, 5]), np.array([9, 2, 6])]
    reference = Reference(spec)
    for seq, answer in zip(sequences, model.predict(sequences), strict=True):
        np.testing.assert_allclose(answer["steps"], reference(seq)["steps"], atol=1e-6)


def test_the_old_pad_sensitive_field_says_what_replaced_it(tmp_models: Path) -> None:
    folder = add_to(tmp_models, "unmasked-bilstm")
    (folder / "config.toml").write_text("pad_sensitive = true\n" + ZOO["unmasked-bilstm"].config)
    with pytest.raises(ConfigError, match=r"batching\.policy = 'exact-length'"):
        load_model_spec(folder)


def test_difference_is_relative_above_one_and_nan_aware() -> None:
    alone = np.array([0.0, 100.0, np.nan])
    assert difference(alone.copy(), alone) == 0.0  # NaN agrees with NaN
    assert difference(np.array([1e-5, 100.0, np.nan]), alone) == pytest.approx(1e-5)
    assert difference(np.array([0.0, 101.0, np.nan]), alone) == pytest.approx(1 / 101)
    assert difference(np.array([0.0, 100.0, 1.0]), alone) == float("inf")
    assert difference(np.zeros(2), np.zeros(3)) == float("inf")  # shapes differ


async def test_the_verdict_is_exported_as_metrics(tmp_models: Path) -> None:
    for name in ("int8-bilstm", "tiny-lstm"):
        add_to(tmp_models, name)
    engine = make_engine(tmp_models, default_model="tiny-lstm")
    async with serving(engine) as client:
        text = (await client.get("/metrics")).text
        config = (await client.get("/v2/models/int8-bilstm/config")).json()
    assert (
        'bucketserve_model_info{model="int8-bilstm",policy="single",strategy="mutable",'
        'version="1"} 1.0' in text
    )
    assert 'bucketserve_model_info{model="tiny-lstm",policy="buckets"' in text
    batching = engine.model("int8-bilstm").info.invariance.batching
    assert (
        f'bucketserve_batching_difference{{check="batching",model="int8-bilstm"}} {batching}'
        in text
    )
    assert 'bucketserve_batching_tolerance{model="int8-bilstm"} 0.0001' in text
    # the config route: effective values, never nulls
    assert config["strategy"] == "mutable"
    assert config["batching"]["policy"] == "single"
    assert config["outputs"]["tags"] == {"per_step": True, "batch_axis": 0, "time_axis": 1}

    def nulls(value: object) -> bool:
        if isinstance(value, dict):
            return any(nulls(v) for v in value.values())
        if isinstance(value, list):
            return any(nulls(v) for v in value)
        return value is None

    assert not nulls(config)


def test_reserved_ids_default_to_the_pad_id_of_a_model_without_a_mask(tmp_models: Path) -> None:
    keras = build_model(spec_of(add_to(tmp_models, "keras-bilstm").parent, "keras-bilstm"))
    assert keras.info.rules.reserved_ids == (0,)  # its pad id is its mask
    assert keras.info.served_config["inputs"]["input_1"]["reserved_ids"] == [0]
    encoder = build_model(spec_of(add_to(tmp_models, "encoder-inline").parent, "encoder-inline"))
    assert encoder.info.rules.reserved_ids == ()  # it has a mask input

    folder = tmp_models / "keras-bilstm"
    config = ZOO["keras-bilstm"].config.replace("vocab_size = 800", "vocab_size = 800\n{}")
    (folder / "config.toml").write_text(config.format("reserved_ids = []"))
    assert build_model(spec_of(tmp_models, "keras-bilstm")).info.rules.reserved_ids == ()
    (folder / "config.toml").write_text(config.format("reserved_ids = [800]"))
    with pytest.raises(ConfigError, match=r"inputs\.input_1: .*ids in \[0, 800\)"):
        load_model_spec(folder)


def test_the_checks_sequences_never_hold_a_reserved_id() -> None:
    rules = SequenceRules(np.dtype(np.int64), max_length=64, vocab_size=3, reserved_ids=(0,))
    drawn = np.concatenate(random_sequences(rules, [64] * 20, seed=1))
    assert set(drawn.tolist()) == {1, 2}


def test_an_output_of_one_value_a_row_is_checked_and_served(tmp_path: Path) -> None:
    """An export whose output is [batch] (a score per sequence, no other axis): each row's
    answer is a 0-d array, which the check compares as any other (it raised TypeError, and
    the model did not load)."""
    from modelgen.graphs import encoder
    from tests.helpers import ENCODER_CONFIG

    graph = encoder(vocab=300, dim=32, heads=4, seed=5)
    axes = numpy_helper.from_array(np.array([1], np.int64), "score_axes")
    graph.graph.initializer.append(axes)
    graph.graph.node.append(
        helper.make_node("ReduceMean", ["sentence_embedding", "score_axes"], ["score"], keepdims=0)
    )
    graph.graph.output.append(helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch"]))
    folder = tmp_path / "scored"
    save_model(graph, folder / "1" / "model.onnx")
    config = ENCODER_CONFIG.format(
        binding="shared-session",
        mode="bucketing",
        vocab=300,
        buckets=[16, 64],
        max_batch_size=8,
        max_batch_tokens=512,
    )
    (folder / "config.toml").write_text(config + "[outputs.score]\n")
    spec = load_model_spec(folder)
    assert spec is not None
    model = build_model(spec, cache_dir=tmp_path / "cache")
    assert model.plan.policy is Policy.BUCKETS
    sequences = random_sequences(model.info.rules, [5, 30, 12], seed=2)
    together = model.predict(sequences)
    for sequence, answer in zip(sequences, together, strict=True):
        (alone,) = model.predict([sequence])
        assert answer["score"].shape == ()
        assert difference(answer["score"], alone["score"]) <= 1e-6


def test_integer_features_are_drawn_at_the_levels_real_ones_have() -> None:
    """16-bit audio samples for the check: a tenth of the range, not a standard normal's
    near silence (+-3); scaled rows quiet, plain and loud (clipped), never wrapped around."""
    rules = SequenceRules(np.dtype(np.int16), 16000)
    (plain,) = random_sequences(rules, [16000], seed=1)
    assert 2000 < np.abs(plain.astype(np.float64)).mean() < 4000
    ordinary, quiet, loud, _ = random_sequences(rules, [16000] * 4, seed=1, scaled=True)
    assert np.abs(quiet).max() < 30
    assert loud.min() == -32768
    assert loud.max() == 32767
    assert np.abs(ordinary.astype(np.float64)).mean() > 2000

"""Batch and time axes without renaming anything: by dim name where names match, by role for
inputs, by running the model for outputs whose names say nothing, or as the config names them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from bucketserve.core.layout import Tensor
from bucketserve.errors import ConfigError
from bucketserve.loading import build_model, load_model_spec
from bucketserve.loading.axes import Axes
from bucketserve.loading.check import random_sequences
from bucketserve.loading.probe import fit_steps
from modelgen import graphs, zoo
from modelgen.save import save_model
from tests.engines import Reference, spec_of, write_model
from tests.helpers import MODELS
from tests.zoo import ZOO, add_to


def test_names_settle_the_bundled_models_without_running_them() -> None:
    spec = load_model_spec(MODELS / "tiny-lstm")
    assert spec is not None
    axes = spec.axes
    assert axes.inputs == {
        "features": Axes(0, 1),
        "lengths": Axes(0),
        "h0": Axes(1),  # [1, batch, hidden]: found by the name it shares with features
        "c0": Axes(1),
    }
    assert axes.outputs == {"tags": Axes(0, 1), "final_state": Axes(0)}
    assert axes.unresolved == []
    assert (axes.batch_names, axes.time_names) == (("batch",), ("seq",))


def test_generated_names_are_found_by_running_the_model(tmp_models: Path) -> None:
    """tf2onnx names the input [unk__1915, unk__1916] and the output [unk__1917, unk__1918, 9]."""
    spec = spec_of(add_to(tmp_models, "keras-bilstm").parent, "keras-bilstm")
    assert spec.axes.inputs == {"input_1": Axes(0, 1)}
    assert spec.axes.unresolved == ["dense"]

    model = build_model(spec)

    assert model.info.layout.output("dense") == Tensor(
        "dense", np.dtype(np.float32), (None, None, 9), batch_axis=0, time_axis=1
    )
    sequences = [np.arange(1, n + 1, dtype=np.int32) * 7 % 799 + 1 for n in (3, 9, 17, 40)]
    reference = Reference(spec)
    for seq, answer in zip(sequences, model.predict(sequences), strict=True):
        assert answer["dense"].shape == (len(seq), 9)
        np.testing.assert_allclose(answer["dense"], reference(seq)["dense"], atol=1e-5)


def test_time_major_anonymous_dims_named_by_the_config(tmp_models: Path) -> None:
    """Every dim anonymous; the config says the input is [time, batch, features]; the outputs'
    axes come from running the model: frame logits time-major, the utterance vector not."""
    spec = spec_of(add_to(tmp_models, "frames").parent, "frames")
    assert spec.axes.inputs == {"frames": Axes(batch=1, time=0)}

    model = build_model(spec)

    layout = model.info.layout
    assert layout.output("frame_logits").batch_axis == 1
    assert layout.output("frame_logits").time_axis == 0
    assert layout.output("utterance") == Tensor(
        "utterance", np.dtype(np.float32), (None, 4), batch_axis=0
    )
    sequences = random_sequences(model.info.rules, [2, 7, 7, 30], seed=1)
    reference = Reference(spec)
    for seq, answer in zip(sequences, model.predict(sequences), strict=True):
        assert answer["frame_logits"].shape == (len(seq), 4)
        for name, value in reference(seq).items():
            np.testing.assert_allclose(answer[name], value, atol=1e-5)


@pytest.mark.parametrize(
    ("rule", "shortest"),
    [
        (lambda t: t, 1),  # the input's own time axis
        (lambda t: -(-t // 4), 1),  # two stride-2 convolutions: ceil(T / 4)
        (lambda t: (t - 3) // 2 + 1, 3),  # a conv of kernel 3, stride 2, no padding
        (lambda t: (t - 400) // 160 + 1, 400),  # STFT frames: 25 ms windows, 10 ms hop
        (lambda t: (t - 400) // 320 + 1, 400),  # wav2vec2's front end, about
        (lambda t: t + 1, 1),  # a [CLS] step added
        (lambda t: 5, 1),  # fixed at every length served
    ],
)
def test_a_step_rule_is_found_from_where_the_output_grows(
    rule: Callable[[int], int], shortest: int
) -> None:
    longest = 2048
    seen: list[int] = []

    def size(length: int) -> int:
        seen.append(length)
        return rule(length)

    steps = fit_steps(size, shortest, longest)
    assert steps is not None
    assert [steps.of(n) for n in range(shortest, longest + 1)] == [
        rule(n) for n in range(shortest, longest + 1)
    ]
    assert len(set(seen)) < 60  # a search, not one run per length


def test_an_output_that_grows_two_steps_at_once_follows_no_rule() -> None:
    assert fit_steps(lambda t: 2 * t, 1, 64) is None


def test_per_step_must_agree_with_the_axes_found(tmp_models: Path) -> None:
    folder = add_to(tmp_models, "keras-bilstm")
    config = (folder / "config.toml").read_text()
    (folder / "config.toml").write_text(
        config.replace("[outputs.dense]", "[outputs.dense]\nper_step = false")
    )
    with pytest.raises(ConfigError, match=r"outputs\.dense: per_step = false, but dim 1"):
        build_model(spec_of(tmp_models, "keras-bilstm"))


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            ("time_axis = 0\n", "time_axis = 2\n"),
            r"inputs\.frames: dim 2 of \[\?, \?, 12\] is the time axis but fixed at 12: the model "
            r"was exported at one length \(12 steps\)",
        ),
        (("batch_axis = 1\n", "batch_axis = 5\n"), r"inputs\.frames: axes \(5, 0\) do not fit"),
        (
            ("[outputs.utterance]\n", "[outputs.utterance]\nbatch_axis = 0\ntime_axis = 1\n"),
            r"outputs\.utterance: dim 1 of \[\?, 4\] is the time axis but fixed at 4",
        ),
    ],
)
def test_axes_named_wrongly_in_the_config(
    tmp_models: Path, change: tuple[str, str], says: str
) -> None:
    folder = add_to(tmp_models, "frames")
    config = ZOO["frames"].config
    assert change[0] in config
    (folder / "config.toml").write_text(config.replace(*change, 1))
    with pytest.raises(ConfigError, match=says):
        load_model_spec(folder)


def test_a_state_batch_is_its_one_free_dim_or_named_in_the_config(tmp_models: Path) -> None:
    config = (MODELS / "tiny-lstm" / "config.toml").read_text().replace('build = "tiny-lstm"', "")

    def lstm(unnamed: int) -> onnx.ModelProto:
        """The tiny LSTM with the first `unnamed` dims of its h0 [1, batch, 32] made free."""
        model = graphs.lstm_tagger()
        h0 = next(v for v in model.graph.input if v.name == "h0").type.tensor_type.shape.dim
        for dim in h0[2 - unnamed : 2]:
            dim.Clear()
        return model

    spec = load_model_spec(write_model(tmp_models, "one-free", lstm(1), config))  # [1, ?, 32]
    assert spec is not None
    assert spec.axes.inputs["h0"] == Axes(1)
    folder = write_model(tmp_models, "two-free", lstm(2), config)  # [?, ?, 32]: which is it?
    with pytest.raises(ConfigError, match=r"inputs\.h0: which dim of \[\?, \?, 32\] is the batch"):
        load_model_spec(folder)


def test_a_fixed_batch_or_time_dim_is_served_or_refused_by_name(tmp_models: Path) -> None:
    """A batch fixed at 1 is served one sequence a run; at 2, or a time axis fixed at one
    length (an export traced at one length), refused with the fix or the length named."""
    for name, (axis, size), says in [
        (
            "batch-2",
            (0, 2),
            "fixed at 2, but it is the batch axis: export the model with a dynamic",
        ),
        ("time-32", (1, 32), r"the model was exported at one length \(32 steps\)"),
    ]:
        model = zoo.bilstm_tagger()
        model.graph.input[0].type.tensor_type.shape.dim[axis].dim_value = size
        folder = tmp_models / name
        save_model(model, folder / "1" / "model.onnx")
        (folder / "config.toml").write_text(ZOO["unmasked-bilstm"].config)
        with pytest.raises(ConfigError, match=says):
            load_model_spec(folder)

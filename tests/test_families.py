"""The families beyond token sequences, and the ways they used to fail: an output length that
two short probes mistook for fixed, a model READY at load that answered 500 to every batch, a
bad sequence that failed every sequence beside it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bucketserve.errors import ConfigError
from bucketserve.loading import build_model
from bucketserve.loading.check import random_sequences
from modelgen.graphs import IR_VERSION, OPSET
from modelgen.save import save_model
from tests.engines import make_engine, serving, spec_of
from tests.helpers import error_of
from tests.zoo import BATCHING, ZOO, add_to


def test_a_strided_output_is_not_mistaken_for_a_fixed_one(tmp_models: Path) -> None:
    """ceil(T / 4) is 2 at both 5 and 7, the two lengths the old probe ran: it called the axis
    fixed, and every longer input failed. Now the rule is found, and holds at every length."""
    model = build_model(spec_of(add_to(tmp_models, "ctc-fbank").parent, "ctc-fbank"))
    log_probs = model.info.layout.output("log_probs")
    assert (log_probs.batch_axis, log_probs.time_axis) == (0, 1)
    assert [log_probs.steps.of(t) for t in range(1, 65)] == [-(-t // 4) for t in range(1, 65)]
    assert model.info.served_config["outputs"]["log_probs"]["steps"] == "floor((T + 3) / 4)"


async def test_naming_a_strided_outputs_axes_serves_it(tmp_models: Path) -> None:
    """Naming the axes in the config (as the README says for what the probe cannot find) used
    to assume the output kept the input's length: 500 on every input. The steps are measured
    whatever names the axes."""
    folder = add_to(tmp_models, "ctc-fbank")
    config = ZOO["ctc-fbank"].config.replace(
        "[outputs.log_probs]\n", "[outputs.log_probs]\nbatch_axis = 0\ntime_axis = 1\n"
    )
    (folder / "config.toml").write_text(config)
    engine = make_engine(tmp_models)
    sequences = random_sequences(engine.model("ctc-fbank").info.rules, [3, 40, 64], seed=1)
    async with serving(engine) as client:
        body = {"model": "ctc-fbank", "sequences": [s.tolist() for s in sequences]}
        response = await client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    steps = [len(out["log_probs"]) for out in response.json()["outputs"]]
    assert steps == [1, 10, 16]


async def test_outputs_declared_for_a_batch_of_one_are_served_one_at_a_time(
    tmp_models: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its outputs say [1, ?, 1]: ONNX Runtime refuses them bound for a batch of 2. The check
    runs batches into the buffers serving binds, so load finds that out (not the first batch
    of two): the model is served one sequence a run, and every request is answered. The
    runtime's words go to the log, the config route names the batch in the server's."""
    add_to(tmp_models, "declared-batch-one")
    engine = make_engine(tmp_models, max_queue_delay_ms=5)
    model = engine.model("declared-batch-one")
    check = model.info.served_config["check"]
    assert (check["policy"], check["batching"]) == ("single", "failed")
    assert check["failures"][0].endswith("failed in the runtime")
    assert "ONNXRuntimeError" not in str(check)
    assert "invalid dimensions for output" in caplog.text
    sequences = random_sequences(model.info.rules, [256, 300, 700, 1024, 512, 999], seed=2)
    async with serving(engine) as client:
        responses = await asyncio.gather(
            *(
                client.post(
                    "/predict",
                    json={"model": "declared-batch-one", "sequences": [s.tolist() for s in pair]},
                )
                for pair in (sequences[:2], sequences[2:4], sequences[4:])
            )
        )
    assert [r.status_code for r in responses] == [200, 200, 200]
    frames = [len(o["speech"]) for r in responses for o in r.json()["outputs"]]
    assert frames == [(n - 256) // 128 + 1 for n in [256, 300, 700, 1024, 512, 999]]


async def test_a_sequence_shorter_than_the_model_takes_is_refused_by_name(
    tmp_models: Path,
) -> None:
    add_to(tmp_models, "raw-audio")
    engine = make_engine(tmp_models)
    clips = random_sequences(engine.model("raw-audio").info.rules, [800, 300, 1600], seed=3)
    async with serving(engine) as client:
        body = {"model": "raw-audio", "sequences": [c.tolist() for c in clips]}
        response = await client.post("/predict", json=body)
    assert response.status_code == 422
    assert error_of(response)[1] == (
        "sequence 1: length 300 is shorter than the model takes (at least 720 steps)"
    )


def fails_on_seven() -> onnx.ModelProto:
    """Features [B, T, 1] -> [B, T, 2], a row of a table plus the step; a step of exactly 7.0
    looks up row 100 of 4, and ONNX Runtime fails the whole run (a data-dependent failure that
    the check's random values never meet)."""
    consts = [
        helper.make_tensor("table", TensorProto.FLOAT, [4, 2], [0, 1, 2, 3, 4, 5, 6, 7]),
        helper.make_tensor("seven", TensorProto.FLOAT, [], [7.0]),
        helper.make_tensor("far", TensorProto.INT64, [], [100]),
        helper.make_tensor("axis", TensorProto.INT64, [1], [2]),
    ]
    nodes = [
        helper.make_node("Equal", ["x", "seven"], ["is_seven"]),
        helper.make_node("Cast", ["is_seven"], ["one"], to=TensorProto.INT64),
        helper.make_node("Mul", ["one", "far"], ["ids"]),
        helper.make_node("Gather", ["table", "ids"], ["looked"]),
        helper.make_node("Squeeze", ["looked", "axis"], ["row"]),
        helper.make_node("Add", ["row", "x"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "fails_on_seven",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "time", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "time", 2])],
        consts,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


async def test_a_sequence_that_fails_in_the_runtime_fails_alone(tmp_models: Path) -> None:
    """One request's sequences share a batch; one of them makes the run fail. The batch runs
    again a sequence at a time: the request is answered 500 naming that sequence, and a request
    beside it in the same bucket gets its answer."""
    folder = tmp_models / "lookup"
    save_model(fails_on_seven(), folder / "1" / "model.onnx")
    config = '[inputs.x]\nrole = "features"\n[outputs.y]\n' + BATCHING
    (folder / "config.toml").write_text(
        config.replace("max_queue_delay_ms = 2", "max_queue_delay_ms = 20")
    )
    engine = make_engine(tmp_models)
    good = [[[1.0], [2.0], [3.0]], [[0.0], [3.0]]]
    bad = [[1.0], [7.0], [2.0]]
    async with serving(engine) as client:
        failed, answered = await asyncio.gather(
            client.post("/predict", json={"model": "lookup", "sequences": [good[0], bad]}),
            client.post("/predict", json={"model": "lookup", "sequences": [good[1]]}),
        )
    assert failed.status_code == 500
    code, message = error_of(failed)
    assert code == "inference_failed"
    assert message.startswith("sequence 1 of 2: inference failed on the server")
    assert answered.status_code == 200
    assert answered.json()["outputs"][0]["y"] == [[0.0, 1.0], [3.0, 4.0]]


async def test_a_strided_model_over_kserve_v2_binary(tmp_models: Path) -> None:
    """Frames as a binary v2 tensor (the fast way for large inputs), each row's length from
    `sequence_lengths`: log-probabilities [n, ceil(T / 4), 29], zeros past each row's own."""
    add_to(tmp_models, "ctc-fbank")
    engine = make_engine(tmp_models)
    sequences = random_sequences(engine.model("ctc-fbank").info.rules, [13, 30], seed=4)
    frames = np.zeros((2, 30, 80), np.float32)
    for row, seq in enumerate(sequences):
        frames[row, : len(seq)] = seq
    raw = frames.tobytes()
    header = (
        '{"inputs": [{"name": "features", "shape": [2, 30, 80], "datatype": "FP32", '
        f'"parameters": {{"binary_data_size": {len(raw)}}}}}, '
        '{"name": "sequence_lengths", "shape": [2], "datatype": "INT32", "data": [13, 30]}], '
        '"outputs": [{"name": "log_probs"}]}'
    ).encode()
    async with serving(engine) as client:
        response = await client.post(
            "/v2/models/ctc-fbank/infer",
            content=header + raw,
            headers={
                "content-type": "application/octet-stream",
                "inference-header-content-length": str(len(header)),
            },
        )
        alone = await client.post(
            "/predict",
            json={"model": "ctc-fbank", "sequences": [s.tolist() for s in sequences]},
        )
    assert response.status_code == 200, response.text
    (out,) = response.json()["outputs"]
    assert out["shape"] == [2, 8, 29]
    log_probs = np.asarray(out["data"], np.float32).reshape(2, 8, 29)
    for row, want in enumerate(alone.json()["outputs"]):
        steps = -(-len(sequences[row]) // 4)
        np.testing.assert_allclose(log_probs[row, :steps], want["log_probs"], atol=1e-5)
        assert not log_probs[row, steps:].any()


async def test_a_scalar_input_is_a_constant_the_config_gives(tmp_models: Path) -> None:
    """A sample rate beside the samples: `role = "constant"` with its `value`, fed on every run;
    not in the metadata, refused when a client sends it, shown on the config route."""
    add_to(tmp_models, "sample-rate")
    engine = make_engine(tmp_models)
    audio = np.linspace(-1, 1, 12, dtype=np.float32)
    async with serving(engine) as client:
        metadata = (await client.get("/v2/models/sample-rate")).json()
        config = (await client.get("/v2/models/sample-rate/config")).json()
        sent = await client.post(
            "/v2/models/sample-rate/infer",
            json={
                "inputs": [
                    {"name": "audio", "shape": [1, 12], "datatype": "FP32", "data": audio.tolist()},
                    {"name": "sr", "shape": [], "datatype": "INT64", "data": [8000]},
                ]
            },
        )
    assert [i["name"] for i in metadata["inputs"]] == ["audio"]
    assert config["inputs"]["sr"] == {"role": "constant", "value": 16000.0, "pad_value": 0.0,
                                      "fill": 0.0}  # fmt: skip
    assert sent.status_code == 422
    assert "input sr is a constant the server fills; do not send it" in error_of(sent)[1]


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        ('role = "constant"\n', "a constant input needs its value"),
        ('role = "state"\nvalue = 3\n', "only a constant takes one"),
    ],
)
def test_a_constant_needs_its_value_and_nothing_else_takes_one(
    tmp_models: Path, lines: str, says: str
) -> None:
    folder = add_to(tmp_models, "sample-rate")
    config = (folder / "config.toml").read_text()
    (folder / "config.toml").write_text(config.replace('role = "constant"\nvalue = 16000\n', lines))
    with pytest.raises(ConfigError, match=says):
        make_engine(tmp_models)


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        (
            "",
            r"\[N, 3, H, W\] has 3 free dims \(0, 2, 3\): which is time\? set time_axis, and "
            r"give every other free dim but the batch its size with shape \(e.g. shape = "
            r"\[-1, 3, 32, -1\]\)",
        ),
        ("time_axis = 3\n", r"dim 2 of \[N, 3, H, W\] is free but neither the batch nor the"),
        ("time_axis = 3\nshape = [-1, 4, 32, -1]\n", r"dim 1 is fixed at 3 in the graph, not 4"),
        ("time_axis = 3\nshape = [-1, 32, -1]\n", r"\[-1, 32, -1\] has 3 dims, the graph's"),
        ("time_axis = 3\nshape = [-1, 3, 0, -1]\n", r"each dim is a size, or -1"),
    ],
    ids=["three-free", "height-free", "not-the-graphs", "rank", "zero"],
)
def test_three_free_dims_ask_which_is_time_and_a_size_for_the_others(
    tmp_models: Path, lines: str, says: str
) -> None:
    """NCHW declared with height and width free: channels are never taken for time; the
    error names what to write, and `shape` fixes a free dim (checked against the graph)."""
    folder = add_to(tmp_models, "ocr-line-free-height")
    config = (folder / "config.toml").read_text()
    (folder / "config.toml").write_text(
        config.replace("time_axis = 3\nshape = [-1, 3, 32, -1]\n", lines)
    )
    with pytest.raises(ConfigError, match=says):
        make_engine(tmp_models)


async def test_a_model_that_runs_at_multiples_of_32_is_padded_up_and_cut_back(
    tmp_models: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A detector whose sum broadcasts only at widths that are multiples of 32: learnt at load
    (said in the log and on the config route, the edges at multiples), any width from 1 served,
    its map cut back to the width sent; a fixed height that is no multiple fails naming it."""
    folder = add_to(tmp_models, "text-detector")
    with caplog.at_level(logging.INFO, logger="bucketserve.loading"):
        engine = make_engine(tmp_models)
    assert "runs only at lengths that are multiples of 32 (from 32)" in caplog.text
    served = engine.model("text-detector").info.served_config
    assert served["inputs"]["image"]["multiple"] == 32
    assert served["batching"]["buckets"] == [64, 128, 256]
    images = [np.ones((3, 64, width)).tolist() for width in (1, 33, 256)]
    async with serving(engine) as client:
        answer = await client.post("/predict", json={"sequences": images})
        too_wide = await client.post(
            "/predict", json={"sequences": [np.ones((3, 64, 257)).tolist()]}
        )
    assert answer.status_code == 200, answer.text
    shapes = [np.asarray(o["maps"]).shape for o in answer.json()["outputs"]]
    assert shapes == [(1, 64, 1), (1, 64, 33), (1, 64, 256)]
    assert too_wide.status_code == 422
    config = (folder / "config.toml").read_text()
    (folder / "config.toml").write_text(config.replace("[-1, 3, 64, -1]", "[-1, 3, 48, -1]"))
    with pytest.raises(ConfigError, match="runs on no length up to the longest bucket"):
        make_engine(tmp_models)


async def test_an_output_rule_from_some_length_on_makes_that_length_the_shortest(
    tmp_models: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A head over max(1, floor((T + 3) / 8)) steps follows floor((T + 3) / 8) from 5 steps:
    served from there, a shorter sequence refused naming the length, the log saying why."""
    add_to(tmp_models, "clamped-head")
    with caplog.at_level(logging.INFO, logger="bucketserve.loading"):
        engine = make_engine(tmp_models)
    assert engine.model("clamped-head").info.rules.min_length == 5
    assert "output head follows floor((T + 3) / 8) from 5 steps" in caplog.text
    async with serving(engine) as client:
        short = await client.post("/predict", json={"sequences": [[7, 8, 9, 10, 11], [1, 2, 3]]})
    assert short.status_code == 422
    assert (
        "sequence 1: length 3 is shorter than the model takes (at least 5 steps)"
        in (error_of(short)[1])
    )


async def test_an_input_without_a_batch_axis_is_served_one_sequence_a_run(
    tmp_models: Path,
) -> None:
    """Frames [T, 40] with no batch axis at all: found (the one free dim is time), served one
    sequence a run, said on the config route."""
    add_to(tmp_models, "unbatched-frames")
    engine = make_engine(tmp_models)
    check = engine.model("unbatched-frames").info.served_config
    assert check["inputs"]["frames"]["time_axis"] == 0
    assert check["check"]["single"] == "it has no batch axis"
    sequences = [np.ones((3, 40)).tolist(), np.zeros((7, 40)).tolist()]
    async with serving(engine) as client:
        answer = await client.post("/predict", json={"sequences": sequences})
    assert answer.status_code == 200
    assert [len(o["score"]) for o in answer.json()["outputs"]] == [3, 7]

"""A model the server would feed wrong never answers 200: the load-time check knows when the
input is misread. A mask set at the padding (the package passes `ids == pad_id`) is found and
turned round when the config is silent, refused with the fix when the config says otherwise,
taken as said when it is right; a mask whose way nothing at load tells is refused naming
`pad_value` unless the config says it; over /predict and KServe v2 (token ids alone, or the model's
own mask) every answer equals the package's run on that sequence alone, unpadded. A model whose
answers do not depend on its input never loads READY."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bucketserve.errors import ConfigError
from bucketserve.loading.check import random_sequences
from bucketserve.runtime.sessions import GraphFile, side_session
from modelgen import families
from modelgen.graphs import _Graph
from modelgen.save import save_model
from tests.engines import make_engine, serving, spec_of
from tests.zoo import BATCHING, add_to

NAME = "padding-mask-bigru"


class Package:
    """The exhibit as its package runs it: one sequence, unpadded, its mask `ids == pad_id`
    (all False: no padding), no help from the server's layout."""

    def __init__(self, root: Path) -> None:
        spec = spec_of(root, NAME)
        self.session = side_session(GraphFile(spec.onnx_path, ("CPUExecutionProvider",)))

    def __call__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        feeds = {"input_ids": ids[None], "padding_mask": np.zeros((1, len(ids)), bool)}
        states, pooled = self.session.run(["states", "pooled"], feeds)
        return {"states": states[0], "pooled": pooled[0]}


def with_config(root: Path, mask_lines: str) -> None:
    add_to(root, NAME)
    (root / NAME / "config.toml").write_text(
        '[inputs.input_ids]\nrole = "tokens"\nvocab_size = 400\n[inputs.padding_mask]\n'
        f'role = "mask"\n{mask_lines}[outputs.states]\n[outputs.pooled]\n' + BATCHING
    )


async def test_a_mask_set_at_the_padding_is_found_said_and_served_exactly(
    tmp_models: Path, caplog: pytest.LogCaptureFixture
) -> None:
    add_to(tmp_models, NAME)
    with caplog.at_level(logging.WARNING):
        engine = make_engine(tmp_models)
    model = engine.model(NAME)
    served = model.info.served_config
    assert served["inputs"]["padding_mask"]["pad_value"] == 1
    assert served["check"]["mask"] == {
        "input": "padding_mask",
        "pad_value": 1,
        "because": "reads its input",
    }
    assert served["check"]["spread"] > 1e-3
    assert "write pad_value = 1 in its config" in caplog.text
    assert served["batching"]["policy"] == "buckets"  # and then the BiGRU given each length

    package = Package(tmp_models)
    lengths = [3, 9, 17, 30, 5, 12]
    sequences = random_sequences(model.info.rules, lengths, seed=8)
    async with serving(engine) as client:
        answer = await client.post(
            "/predict", json={"model": NAME, "sequences": [s.tolist() for s in sequences]}
        )
        ids = np.zeros((len(lengths), max(lengths)), np.int64)
        at_padding = np.ones_like(ids, bool)  # the model's own mask: True at the padding
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = seq
            at_padding[row, : len(seq)] = False
        ids_only = {"name": "input_ids", "shape": [1, lengths[3]], "datatype": "INT64",
                    "data": sequences[3].tolist()}  # fmt: skip
        tensors = [{"name": "input_ids", "shape": list(ids.shape), "datatype": "INT64",
                    "data": ids.ravel().tolist()}]  # fmt: skip
        mask = {"name": "padding_mask", "shape": list(ids.shape), "datatype": "BOOL"}
        alone = await client.post(f"/v2/models/{NAME}/infer", json={"inputs": [ids_only]})
        masked = await client.post(
            f"/v2/models/{NAME}/infer",
            json={"inputs": [*tensors, mask | {"data": at_padding.ravel().tolist()}]},
        )
        inverted = await client.post(
            f"/v2/models/{NAME}/infer",
            json={"inputs": [*tensors, mask | {"data": (~at_padding).ravel().tolist()}]},
        )
    assert answer.status_code == 200, answer.text
    assert inverted.status_code == 422
    assert "each row must be real steps (0) followed by padding (1)" in inverted.json()["error"]
    for seq, got in zip(sequences, answer.json()["outputs"], strict=True):
        want = package(seq)
        np.testing.assert_allclose(got["pooled"], want["pooled"], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got["states"], want["states"], rtol=1e-4, atol=1e-4)
    for response, rows in ((alone, [3]), (masked, range(len(lengths)))):
        assert response.status_code == 200, response.text
        outputs = {o["name"]: o for o in response.json()["outputs"]}
        pooled, states = (
            np.asarray(outputs[n]["data"], np.float32).reshape(outputs[n]["shape"])
            for n in ("pooled", "states")
        )
        for at, row in enumerate(rows):
            want, steps = package(sequences[row]), lengths[row]
            np.testing.assert_allclose(pooled[at], want["pooled"], rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(states[at, :steps], want["states"], rtol=1e-4, atol=1e-4)
            assert not states[at, steps:].any()  # zeros past each row's own length


def test_a_mask_configured_the_wrong_way_is_refused_with_the_fix(tmp_models: Path) -> None:
    with_config(tmp_models, "pad_value = 0\n")
    with pytest.raises(ConfigError, match=r"input padding_mask points the other way: .*"
                       r"set pad_value = 1"):  # fmt: skip
        make_engine(tmp_models)


def test_a_mask_configured_the_right_way_is_taken_as_said(
    tmp_models: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with_config(tmp_models, "pad_value = 1\n")
    with caplog.at_level(logging.WARNING):
        engine = make_engine(tmp_models)
    served = engine.model(NAME).info.served_config
    assert served["inputs"]["padding_mask"]["pad_value"] == 1
    assert "mask" not in served["check"]
    assert "pad_value" not in caplog.text


def test_a_mask_pad_value_is_zero_or_one(tmp_models: Path) -> None:
    with_config(tmp_models, "pad_value = 2\n")
    with pytest.raises(ConfigError, match=r"a mask's pad_value is 0 .* or 1"):
        make_engine(tmp_models)


def test_a_model_whose_answers_ignore_its_input_never_loads_ready(tmp_models: Path) -> None:
    folder = tmp_models / "reads-nothing"
    save_model(families.reads_nothing(), folder / "1" / "model.onnx")
    (folder / "config.toml").write_text(
        '[inputs.ids]\nrole = "tokens"\nvocab_size = 300\n[outputs.out]\n' + BATCHING
    )
    with pytest.raises(ConfigError, match=r"answers the same whatever the sequence .*: it does "
                       r"not read its input as the server feeds it"):  # fmt: skip
        make_engine(tmp_models)
    partial = make_engine(tmp_models, "tiny-encoder", allow_partial=True)
    assert "reads-nothing" in partial.registry.failed
    assert "reads-nothing" not in partial.registry.models


def both_ways_model() -> onnx.ModelProto:
    """Ids and an INT64 mask -> twice the mean of the embeddings the mask marks plus the mean
    of those it does not: the model reads its input with the mask either way round, padding
    moves it either way, and the two ways answer apart."""
    g = _Graph(71)
    x = g.op("Gather", g.weight("embeddings", 300, 8, scale=0.5), "ids")
    marked = g.op(
        "Unsqueeze", g.op("Cast", "mask", to=TensorProto.FLOAT), g.const("a", np.array([2]))
    )
    unmarked = g.op("Sub", g.const("one", np.ones(1, np.float32)), marked)
    g.masked_mean(g.op("Mul", x, marked), marked, "on_marked")
    g.masked_mean(g.op("Mul", x, unmarked), unmarked, "on_unmarked")
    doubled = g.op("Mul", "on_marked", g.const("two", np.full(1, 2, np.float32)))
    g.nodes.append(helper.make_node("Add", [doubled, "on_unmarked"], ["out"]))
    return g.model(
        "both_ways",
        [
            helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "time"])
            for n in ("ids", "mask")
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 8])],
    )


@pytest.mark.parametrize("said", ["", "pad_value = 0\n", "pad_value = 1\n"])
def test_a_mask_nothing_tells_the_way_of_is_refused_unless_the_config_says(
    tmp_models: Path, said: str
) -> None:
    folder = tmp_models / "both-ways"
    save_model(both_ways_model(), folder / "1" / "model.onnx")
    (folder / "config.toml").write_text(
        '[inputs.ids]\nrole = "tokens"\nvocab_size = 300\n[inputs.mask]\nrole = "mask"\n'
        f"{said}[outputs.out]\n" + BATCHING
    )
    if not said:
        with pytest.raises(ConfigError, match=r"with the mask either way round .* say which "
                           r"in its config, pad_value = 0 .* or pad_value = 1"):  # fmt: skip
            make_engine(tmp_models)
        return
    model = make_engine(tmp_models).model("both-ways")
    assert model.info.served_config["inputs"]["mask"]["pad_value"] == int(said[-2])
    assert "mask" not in model.info.served_config["check"]

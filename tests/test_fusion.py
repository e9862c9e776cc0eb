"""Attention fused to MultiHeadAttention's flash path (`bucketserve.loading.fusion`): the copy
of a masked encoder answers as the original on padded batches, its attention no longer made of
a product and a softmax; a mask that depends on the query is left to the original."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from bucketserve.loading.fusion import TOLERANCE, fuse_attention
from modelgen.graphs import encoder
from modelgen.save import save_model

VOCAB = 300


def answers(path: Path, ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    outputs = [o.name for o in session.get_outputs()]
    got = session.run(outputs, {k: v for k, v in feeds.items() if k in names})
    return dict(zip(outputs, got, strict=True))


def padded(lengths: list[int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random ids, right-padded to the longest of `lengths` (as the server pads a bucket)."""
    rng = np.random.default_rng(seed)
    longest = max(lengths)
    ids = rng.integers(1, VOCAB, (len(lengths), longest))
    mask = (np.arange(longest)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    return ids * mask, mask


def ops(path: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}


@pytest.mark.parametrize("masked", [True, False])
def test_the_fused_copy_answers_as_the_original(tmp_path: Path, masked: bool) -> None:
    source, target = tmp_path / "model.onnx", tmp_path / "fused" / "model.onnx"
    save_model(encoder(vocab=VOCAB, dim=32, heads=4, layers=2, masked=masked), source)
    report = fuse_attention(source, target)
    assert report is not None
    assert (report.fused, report.left) == (2, ())
    assert report.largest_difference <= TOLERANCE
    assert {"MultiHeadAttention", "Softmax"} & ops(target) == {"MultiHeadAttention"}
    assert (target.parent / "model.onnx.data").exists()  # (weights beside the copy)
    for lengths in ([300, 211, 1], [5], [64, 64]):
        ids, mask = padded(lengths, seed=len(lengths))
        want, got = answers(source, ids, mask), answers(target, ids, mask)
        for name, value in want.items():
            apart = np.abs(got[name] - value) / (1 + np.abs(value))
            assert apart.max() <= TOLERANCE, (name, lengths, apart.max())


def test_each_row_is_answered_as_alone(tmp_path: Path) -> None:
    """The mask folded into the keys still masks: a short row among long ones is answered as
    the same ids alone."""
    source, target = tmp_path / "model.onnx", tmp_path / "fused.onnx"
    save_model(encoder(vocab=VOCAB, dim=32, heads=4, layers=2, pooled=False), source)
    assert fuse_attention(source, target) is not None
    ids, mask = padded([400, 37], seed=3)
    together = answers(target, ids, mask)["last_hidden_state"][1, :37]
    alone = answers(target, ids[1:, :37], mask[1:, :37])["last_hidden_state"][0]
    assert np.abs(together - alone).max() <= TOLERANCE


def test_a_mask_that_depends_on_the_query_is_left_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A causal term added to the padding mask: no core fuses, and no copy is written."""
    model = encoder(vocab=VOCAB, dim=32, heads=4, layers=1, pooled=False)
    graph = model.graph
    add = next(n for n in graph.node if n.op_type == "Add" and "unsqueeze" in n.input[1])
    causal = [  # (-1e9 above the diagonal of a [T, T] square)
        helper.make_node("Shape", ["input_ids"], ["causal_bt"]),
        helper.make_node("Slice", ["causal_bt", "causal_one", "causal_two"], ["causal_t"]),
        helper.make_node("Concat", ["causal_t", "causal_t"], ["causal_tt"], axis=0),
        helper.make_node("ConstantOfShape", ["causal_tt"], ["causal_full"],
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [-1e9])),
        helper.make_node("Trilu", ["causal_full", "causal_k"], ["causal_upper"], upper=1),
        helper.make_node("Add", [add.input[1], "causal_upper"], ["causal_mask"]),
    ]  # fmt: skip
    for name, value in (("causal_one", [1]), ("causal_two", [2]), ("causal_k", 1)):
        graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), name))
    at = list(graph.node).index(add)
    for offset, node in enumerate(causal):
        graph.node.insert(at + offset, node)
    add.input[1] = "causal_mask"
    source, target = tmp_path / "model.onnx", tmp_path / "fused.onnx"
    save_model(model, source)
    with caplog.at_level(logging.INFO, logger="bucketserve.loading.fusion"):
        assert fuse_attention(source, target) is None
    assert "not the same for every query" in caplog.text
    assert not target.exists()
    assert not (tmp_path / "fused.onnx.data").exists()

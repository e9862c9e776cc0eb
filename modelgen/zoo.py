"""Small models shaped like the exports users bring, for the test suite.

Nobody here would write them this way; exporters do: tf2onnx's generated dim names (a different
one on every tensor) and int32 ids with the pad id as the mask, weights inline, an RNN without
`sequence_lens` (padding leaks in), int8 dynamic quantisation (each run's scale comes from the
whole batch tensor: rows change each other), a time-major features model whose dims are all
anonymous. Deterministic: weights come from seeded generators.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from modelgen.graphs import _Graph

INT32, INT64, FLOAT = TensorProto.INT32, TensorProto.INT64, TensorProto.FLOAT


def keras_bilstm(
    *, vocab: int = 800, embed: int = 24, hidden: int = 32, tags: int = 9, seed: int = 3
) -> onnx.ModelProto:
    """A Keras BiLSTM tagger as tf2onnx writes it: int32 ids, Embedding(mask_zero=True) (the pad
    id 0 is the mask, turned into the LSTM's sequence lengths inside the graph), softmax tags
    per step, and generated dim names that differ between the input and the output."""
    g = _Graph(seed)
    ids = "input_1"
    mask = g.op("Not", g.op("Equal", ids, g.const("pad_id", np.array(0, np.int32))))
    lengths = g.op(
        "ReduceSum",
        g.op("Cast", mask, to=INT32),
        g.const("time_axis", np.array([1], np.int64)),
        keepdims=0,
    )
    x = g.op("Gather", g.weight("embeddings", vocab, embed, scale=0.5), ids)
    steps = g.bilstm(x, embed, hidden, lengths)
    logits = g.op(
        "Add", g.op("MatMul", steps, g.weight("kernel", 2 * hidden, tags)), g.weight("bias", tags)
    )
    g.nodes.append(helper.make_node("Softmax", [logits], ["dense"], axis=-1))
    return g.model(
        "keras_bilstm",
        [helper.make_tensor_value_info(ids, INT32, ["unk__1915", "unk__1916"])],
        [helper.make_tensor_value_info("dense", FLOAT, ["unk__1917", "unk__1918", tags])],
    )


def bilstm_tagger(
    *, vocab: int = 600, embed: int = 24, hidden: int = 32, tags: int = 7, seed: int = 4
) -> onnx.ModelProto:
    """A BiLSTM tagger with no mask and no sequence lengths: its backward direction starts on
    the padding, so padded batches change its answers (pad-sensitive, batch-invariant)."""
    g = _Graph(seed)
    x = g.op("Gather", g.weight("embeddings", vocab, embed, scale=0.5), "ids")
    steps = g.bilstm(x, embed, hidden)
    logits = g.op(
        "Add", g.op("MatMul", steps, g.weight("kernel", 2 * hidden, tags)), g.weight("bias", tags)
    )
    g.nodes.append(helper.make_node("Identity", [logits], ["tags"]))
    return g.model(
        "bilstm_tagger",
        [helper.make_tensor_value_info("ids", INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("tags", FLOAT, ["batch", "sequence", tags])],
    )


def quantized(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with int8 weights by ONNX Runtime's dynamic quantisation (as users make it):
    activations are quantised per run, with a scale taken from the whole batch tensor."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as folder:
        source, target = Path(folder) / "float.onnx", Path(folder) / "int8.onnx"
        onnx.save(model, source)
        quantize_dynamic(source, target, weight_type=QuantType.QInt8)
        return onnx.load(target)


def time_major_frames(
    *, features: int = 12, hidden: int = 20, classes: int = 4, seed: int = 5
) -> onnx.ModelProto:
    """Speech-like frames, time-major [T, B, F], every dim anonymous: a per-frame MLP gives
    frame logits [T, B, C], and their mean over time (padding included) an utterance vector
    [B, C]."""
    g = _Graph(seed)
    h = g.op(
        "Relu",
        g.op(
            "Add",
            g.op("MatMul", "frames", g.weight("w1", features, hidden)),
            g.weight("b1", hidden),
        ),
    )
    logits = g.op(
        "Add", g.op("MatMul", h, g.weight("w2", hidden, classes)), g.weight("b2", classes)
    )
    g.nodes.append(helper.make_node("Identity", [logits], ["frame_logits"]))
    g.nodes.append(
        helper.make_node(
            "ReduceMean",
            [logits, g.const("over_time", np.array([0], np.int64))],
            ["utterance"],
            keepdims=0,
        )
    )
    io = helper.make_tensor_value_info
    return g.model(
        "time_major_frames",
        [io("frames", FLOAT, [None, None, features])],
        [io("frame_logits", FLOAT, [None, None, classes]), io("utterance", FLOAT, [None, classes])],
    )


def save_inline(model: onnx.ModelProto, onnx_path: Path) -> None:
    """Write `model.onnx` with every weight inside it (what most exporters write)."""
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(onnx_path))


def transposed_kernels(
    *, vocab: int = 4000, dim: int = 512, ffn: int = 2048, layers: int = 3, seed: int = 6
) -> onnx.ModelProto:
    """Dense layers whose kernels are stored [out, in] and transposed in the graph, as Keras
    exports often are: graph optimisation folds each Transpose into a new weight, which every
    session would otherwise fold into a copy of its own."""
    g = _Graph(seed)
    x = g.op("Gather", g.weight("embeddings", vocab, dim, scale=0.5), "ids")
    for _ in range(layers):
        up = g.op("Transpose", g.weight("kernel_up", ffn, dim), perm=[1, 0])
        down = g.op("Transpose", g.weight("kernel_down", dim, ffn), perm=[1, 0])
        x = g.op("MatMul", g.op("Relu", g.op("MatMul", x, up)), down)
    g.nodes.append(helper.make_node("Identity", [x], ["states"]))
    return g.model(
        "transposed_kernels",
        [helper.make_tensor_value_info("ids", INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("states", FLOAT, ["batch", "seq", dim])],
    )

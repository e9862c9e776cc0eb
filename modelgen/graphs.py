"""Small deterministic graphs: a masked transformer encoder and an LSTM tagger.

Weights come from a seeded generator, so a rebuild gives the same bytes. Dims are named
`batch` and `seq`, the names the signature reader takes the batch and time axes from.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18
IR_VERSION = 10  # the newest that ONNX Runtime 1.20+ reads


class _Graph:
    """Collects nodes and initializers with unique names while a graph is written."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def const(self, prefix: str, value: np.ndarray) -> str:
        name = self.name(prefix)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, prefix: str, *shape: int, scale: float | None = None) -> str:
        scale = scale if scale is not None else 1.0 / math.sqrt(shape[0])
        return self.const(prefix, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def ops(self, op_type: str, inputs: list[str], n_out: int, **attrs: Any) -> list[str]:
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, **attrs))
        return outs

    def linear(self, x: str, d_in: int, d_out: int) -> str:
        return self.op(
            "Add",
            self.op("MatMul", x, self.weight("w", d_in, d_out)),
            self.const("b", np.zeros(d_out, np.float32)),
        )

    def bilstm(self, x: str, width: int, hidden: int, lengths: str | None = None) -> str:
        """A bidirectional LSTM over batch-major `x` [B, T, width] -> [B, T, 2 * hidden]."""
        w = self.weight("W", 2, 4 * hidden, width, scale=1 / np.sqrt(width))
        r = self.weight("R", 2, 4 * hidden, hidden, scale=1 / np.sqrt(hidden))
        b = self.weight("B", 2, 8 * hidden, scale=0.1)
        time_major = self.op("Transpose", x, perm=[1, 0, 2])
        inputs = [time_major, w, r, b] + ([lengths] if lengths is not None else [])
        y, _ = self.ops("LSTM", inputs, 2, hidden_size=hidden, direction="bidirectional")
        steps = self.op("Transpose", y, perm=[2, 0, 1, 3])  # [T, 2, B, H] -> [B, T, 2, H]
        return self.op(
            "Reshape", steps, self.const("merge", np.array([0, 0, 2 * hidden], np.int64))
        )

    def masked_mean(self, states: str, keep: str, out: str) -> None:
        """`out`: the mean of `states` [B, T, D] over the steps `keep` [B, T, 1] marks (1)."""
        time = self.const("time", np.array([1], np.int64))
        total = self.op("ReduceSum", states, time, keepdims=0)
        count = self.op(
            "Max",
            self.op("ReduceSum", keep, time, keepdims=0),
            self.const("one", np.ones(1, np.float32)),
        )
        self.nodes.append(helper.make_node("Div", [total, count], [out]))

    def layer_norm(self, x: str, dim: int) -> str:
        return self.op(
            "LayerNormalization",
            x,
            self.const("ln_g", np.ones(dim, np.float32)),
            self.const("ln_b", np.zeros(dim, np.float32)),
            axis=-1,
            epsilon=1e-5,
        )

    def model(
        self, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="bucketserve"
        )
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        return model


def encoder(
    *,
    vocab: int = 2000,
    dim: int = 64,
    heads: int = 4,
    layers: int = 2,
    ffn: int = 128,
    max_positions: int = 512,
    masked: bool = True,
    pooled: bool = True,
    axes: tuple[str, str] = ("batch", "seq"),
    seed: int = 0,
) -> onnx.ModelProto:
    """A BERT-like encoder: ids (+ mask, token types) -> per-token states and a pooled vector.

    With `masked=False` the graph has no mask input and pools over every position, padding
    included: a deliberately pad-sensitive model for the pad-safety check. With
    `pooled=False` it gives the per-token states only, named on `axes`, as optimum's
    feature-extraction export of a BERT does (`batch_size`, `sequence_length`).
    """
    g = _Graph(seed)
    ids = "input_ids"
    positions = g.op(
        "Range",
        g.const("zero", np.array(0, np.int64)),
        g.op("Gather", g.op("Shape", ids), g.const("one", np.array(1, np.int64)), axis=0),
        g.const("step", np.array(1, np.int64)),
    )
    x = g.op(
        "Add",
        g.op("Gather", g.weight("word_emb", vocab, dim, scale=0.5), ids),
        g.op("Gather", g.weight("pos_emb", max_positions, dim, scale=0.1), positions),
    )
    x = g.op("Add", x, g.op("Gather", g.weight("type_emb", 2, dim, scale=0.1), "token_type_ids"))
    x = g.layer_norm(x, dim)

    head_dim = dim // heads
    bias = None
    if masked:
        mask_f = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
        # (1 - mask) * -1e9: padded keys get exactly zero attention weight after softmax.
        neg = g.op(
            "Mul",
            g.op("Sub", g.const("one_f", np.array(1.0, np.float32)), mask_f),
            g.const("neg", np.array(-1e9, np.float32)),
        )
        bias = g.op("Unsqueeze", neg, g.const("axes", np.array([1, 2], np.int64)))
    split_heads = g.const("split_shape", np.array([0, 0, heads, head_dim], np.int64))
    merge_heads = g.const("merge_shape", np.array([0, 0, dim], np.int64))
    for _ in range(layers):
        q, k, v = (
            g.op(
                "Transpose", g.op("Reshape", g.linear(x, dim, dim), split_heads), perm=[0, 2, 1, 3]
            )
            for _ in range(3)
        )
        scores = g.op(
            "Div",
            g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])),
            g.const("scale", np.array(math.sqrt(head_dim), np.float32)),
        )
        if bias is not None:
            scores = g.op("Add", scores, bias)
        ctx = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
        ctx = g.op("Reshape", g.op("Transpose", ctx, perm=[0, 2, 1, 3]), merge_heads)
        x = g.layer_norm(g.op("Add", x, g.linear(ctx, dim, dim)), dim)
        hidden = g.op("Relu", g.linear(x, dim, ffn))
        x = g.layer_norm(g.op("Add", x, g.linear(hidden, ffn, dim)), dim)
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))

    def io(name: str, elem: int, dims: list[int | str]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, dims)

    batch, seq = axes
    inputs = [io("input_ids", TensorProto.INT64, [batch, seq])]
    if masked:
        inputs.append(io("attention_mask", TensorProto.INT64, [batch, seq]))
    inputs.append(io("token_type_ids", TensorProto.INT64, [batch, seq]))
    outputs = [io("last_hidden_state", TensorProto.FLOAT, [batch, seq, dim])]
    if not pooled:
        return g.model("tiny_encoder", inputs, outputs)
    if masked:
        weights = g.op("Unsqueeze", mask_f, g.const("axis", np.array([2], np.int64)))
        summed = g.op(
            "ReduceSum",
            g.op("Mul", x, weights),
            g.const("axis1", np.array([1], np.int64)),
            keepdims=0,
        )
        count = g.op("ReduceSum", mask_f, g.const("axis1b", np.array([1], np.int64)), keepdims=1)
        mean = g.op("Div", summed, count)
    else:
        mean = g.op("ReduceMean", x, g.const("axis1", np.array([1], np.int64)), keepdims=0)
    norm = g.op("ReduceL2", mean, g.const("axis_last", np.array([1], np.int64)), keepdims=1)
    g.nodes.append(helper.make_node("Div", [mean, norm], ["sentence_embedding"]))
    outputs.append(io("sentence_embedding", TensorProto.FLOAT, [batch, dim]))
    return g.model("tiny_encoder", inputs, outputs)


def lstm_tagger(
    *, features: int = 16, hidden: int = 32, tags: int = 5, seed: int = 1
) -> onnx.ModelProto:
    """Per-frame tagger: features [batch, seq, F] + lengths + initial state -> tag logits per step
    and the final hidden state. `sequence_lens` makes the LSTM ignore padded steps."""
    g = _Graph(seed)
    x = g.op("Transpose", "features", perm=[1, 0, 2])  # ONNX LSTM is time-major
    w = g.weight("W", 1, 4 * hidden, features, scale=1 / math.sqrt(features))
    r = g.weight("R", 1, 4 * hidden, hidden, scale=1 / math.sqrt(hidden))
    b = g.weight("B", 1, 8 * hidden, scale=0.1)
    y, y_h = g.ops("LSTM", [x, w, r, b, "lengths", "h0", "c0"], 2, hidden_size=hidden)
    steps = g.op(
        "Transpose",
        g.op("Squeeze", y, g.const("dir_axis", np.array([1], np.int64))),
        perm=[1, 0, 2],
    )
    g.nodes.append(helper.make_node("Identity", [g.linear(steps, hidden, tags)], ["tags"]))
    g.nodes.append(
        helper.make_node(
            "Squeeze", [y_h, g.const("dir_axis0", np.array([0], np.int64))], ["final_state"]
        )
    )
    io = helper.make_tensor_value_info
    inputs = [
        io("features", TensorProto.FLOAT, ["batch", "seq", features]),
        io("lengths", TensorProto.INT32, ["batch"]),
        io("h0", TensorProto.FLOAT, [1, "batch", hidden]),
        io("c0", TensorProto.FLOAT, [1, "batch", hidden]),
    ]
    outputs = [
        io("tags", TensorProto.FLOAT, ["batch", "seq", tags]),
        io("final_state", TensorProto.FLOAT, ["batch", hidden]),
    ]
    return g.model("tiny_lstm", inputs, outputs)

"""Small models of the families beyond token sequences, shaped like their exports.

Speech frames and CTC heads whose output is shorter than the input, OCR lines as images by
width, raw audio with a strided front end and a shortest input, a feature model that
normalises over the whole batch, a detector whose outputs declare a batch of 1, a dynamo-style
export with its batch fixed at 1 and an output flattened over batch and time, and an unmasked
BiGRU. Their output dims carry generated names (or none), as exporters write them, so the
server has to find how each follows the input. Deterministic: seeded weights.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from modelgen.graphs import _Graph

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
io = helper.make_tensor_value_info


def _conv(g: _Graph, x: str, c_in: int, c_out: int, kernel: list[int], **attrs: object) -> str:
    """A convolution with a bias (what a folded BatchNorm leaves)."""
    fan_in = c_in * int(np.prod(kernel))
    w = g.weight("conv_w", c_out, c_in, *kernel, scale=1 / np.sqrt(fan_in))
    return g.op("Conv", x, w, g.weight("conv_b", c_out, scale=0.1), **attrs)


def ctc_fbank(
    *, mels: int = 80, width: int = 32, vocab: int = 29, seed: int = 11
) -> onnx.ModelProto:
    """A CTC acoustic model over fbank frames [B, T, 80]: two convolutions of stride 2 (kernel
    3, padding 1) subsample time to ceil(T / 4), then log-probabilities over a 29-letter
    vocabulary [B, ceil(T / 4), 29], as a torch export names them."""
    g = _Graph(seed)
    x = g.op("Transpose", "features", perm=[0, 2, 1])  # [B, 80, T]
    for c_in in (mels, width):
        x = g.op("Relu", _conv(g, x, c_in, width, [3], strides=[2], pads=[1, 1]))
    x = g.op("Transpose", x, perm=[0, 2, 1])  # [B, T/4, 32]
    g.nodes.append(
        helper.make_node("LogSoftmax", [g.linear(x, width, vocab)], ["log_probs"], axis=-1)
    )
    return g.model(
        "ctc_fbank",
        [io("features", FLOAT, ["batch", "frames", mels])],
        [io("log_probs", FLOAT, ["batch", "floor(frames/4)", vocab])],
    )


def line_recogniser(
    *, height: int = 32, width: int = 24, vocab: int = 40, seed: int = 12, free_height: bool = False
) -> onnx.ModelProto:
    """An OCR line recogniser over an NCHW image [B, 3, 32, W], width as time: a convolution
    of stride 8 makes a column every 8 pixels ([B, 24, 1, W/8]), global attention over all the
    columns (padding included: pad-sensitive) mixes in the whole line, and each column gives
    letter logits [B, floor(W / 8), 40]. `free_height`: declared [B, 3, H, W], as exporters
    write it, though it runs at 32 only."""
    g = _Graph(seed)
    x = g.op("Relu", _conv(g, "image", 3, width, [height, 8], strides=[height, 8]))
    cols = g.op(
        "Transpose", g.op("Squeeze", x, g.const("h", np.array([2], np.int64))), perm=[0, 2, 1]
    )
    scores = g.op("MatMul", cols, g.weight("query", width, 1))  # [B, W/8, 1]
    weights = g.op("Softmax", scores, axis=1)
    context = g.op(
        "ReduceSum",
        g.op("Mul", cols, weights),
        g.const("over", np.array([1], np.int64)),
        keepdims=1,
    )
    mixed = g.op("Add", cols, context)
    g.nodes.append(helper.make_node("Identity", [g.linear(mixed, width, vocab)], ["logits"]))
    return g.model(
        "line_recogniser",
        [io("image", FLOAT, ["N", 3, "H" if free_height else height, "W"])],
        [io("logits", FLOAT, ["N", "W_out", vocab])],
    )


def raw_audio(*, channels: int = 24, dim: int = 16, seed: int = 13) -> onnx.ModelProto:
    """A speech encoder over raw samples [B, samples]: a 25 ms window every 10 ms at 16 kHz
    (a convolution of kernel 400, stride 160, no padding), then one of kernel 3, stride 2:
    [B, frames, 16]. Every frame reads only real samples, and it needs 720 of them (three
    windows) to give one."""
    g = _Graph(seed)
    x = g.op("Unsqueeze", "audio", g.const("channel", np.array([1], np.int64)))  # [B, 1, S]
    x = g.op("Relu", _conv(g, x, 1, channels, [400], strides=[160]))
    x = g.op("Relu", _conv(g, x, channels, dim, [3], strides=[2]))
    g.nodes.append(helper.make_node("Transpose", [x], ["frames"], perm=[0, 2, 1]))
    return g.model(
        "raw_audio",
        [io("audio", FLOAT, ["batch_size", "sequence_length"])],
        [io("frames", FLOAT, ["batch_size", None, dim])],
    )


def batch_db(*, mels: int = 40, seed: int = 14) -> onnx.ModelProto:
    """A melspectrogram-style front end that takes its dB floor from the loudest value in the
    whole batch (top_db = 80 over the batch tensor, as a batched `AmplitudeToDB` does): a quiet
    clip beside a loud one is moved. Rows of one loudness do not show it."""
    g = _Graph(seed)
    power = g.op("Add", g.op("Mul", "mel", "mel"), g.const("eps", np.array(1e-10, np.float32)))
    db = g.op("Mul", g.op("Log", power), g.const("to_db", np.array(10 / np.log(10), np.float32)))
    floor = g.op(
        "Sub", g.op("ReduceMax", db, keepdims=0), g.const("top_db", np.array(80, np.float32))
    )
    g.nodes.append(helper.make_node("Max", [db, floor], ["db"]))
    return g.model(
        "batch_db",
        [io("mel", FLOAT, ["batch", "time", mels])],
        [io("db", FLOAT, ["batch", "time", mels])],
    )


def declared_batch_one(*, window: int = 256, hop: int = 128, seed: int = 15) -> onnx.ModelProto:
    """A voice-activity detector over samples [B, S]: a speech probability every 128 samples
    [B, frames, 1], computed row by row, but its outputs declare a batch of 1 ([1, ?, 1], as an
    export traced at batch 1 with only its inputs made dynamic writes them)."""
    g = _Graph(seed)
    x = g.op("Unsqueeze", "audio", g.const("channel", np.array([1], np.int64)))
    x = g.op("Relu", _conv(g, x, 1, 8, [window], strides=[hop]))
    x = g.op("Transpose", x, perm=[0, 2, 1])  # [B, frames, 8]
    g.nodes.append(helper.make_node("Sigmoid", [g.linear(x, 8, 1)], ["speech"]))
    return g.model(
        "declared_batch_one",
        [io("audio", FLOAT, ["batch", "samples"])],
        [io("speech", FLOAT, [1, None, 1])],
    )


def dynamo_batch_one(
    *, vocab: int = 300, dim: int = 16, tags: int = 5, seed: int = 16
) -> onnx.ModelProto:
    """A tagger as torch.onnx.export(dynamo=True) writes it without dynamic shapes for the
    batch: ids [1, s0], logits [1, s0, 5], and the best tags flattened over batch and time
    [s0] (a `view(-1)` in the model)."""
    g = _Graph(seed)
    x = g.op("Gather", g.weight("embed", vocab, dim, scale=0.5), "input_ids")
    x = g.op("Tanh", g.linear(x, dim, dim))
    logits = g.linear(x, dim, tags)
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"]))
    best = g.op("ArgMax", logits, axis=-1, keepdims=0)
    g.nodes.append(
        helper.make_node("Reshape", [best, g.const("flat", np.array([-1], np.int64))], ["tags"])
    )
    return g.model(
        "dynamo_batch_one",
        [io("input_ids", INT64, [1, "s0"])],
        [io("logits", FLOAT, [1, "s0", tags]), io("tags", INT64, ["s0"])],
    )


def unmasked_bigru(
    *, vocab: int = 500, embed: int = 24, hidden: int = 32, tags: int = 6, seed: int = 17
) -> onnx.ModelProto:
    """A BiGRU tagger as Paddle or Keras exports write it without a mask: no sequence_lens, so
    the backward direction starts on the padding (pad-sensitive, batch-invariant)."""
    g = _Graph(seed)
    x = g.op("Gather", g.weight("embeddings", vocab, embed, scale=0.5), "ids")
    w = g.weight("W", 2, 3 * hidden, embed, scale=1 / np.sqrt(embed))
    r = g.weight("R", 2, 3 * hidden, hidden, scale=1 / np.sqrt(hidden))
    b = g.weight("B", 2, 6 * hidden, scale=0.1)
    y, _ = g.ops(
        "GRU",
        [g.op("Transpose", x, perm=[1, 0, 2]), w, r, b],
        2,
        hidden_size=hidden,
        direction="bidirectional",
        linear_before_reset=1,
    )
    steps = g.op("Transpose", y, perm=[2, 0, 1, 3])  # [T, 2, B, H] -> [B, T, 2, H]
    merged = g.op("Reshape", steps, g.const("merge", np.array([0, 0, 2 * hidden], np.int64)))
    g.nodes.append(helper.make_node("Identity", [g.linear(merged, 2 * hidden, tags)], ["tags"]))
    return g.model(
        "unmasked_bigru",
        [io("ids", INT64, ["batch", "time"])],
        [io("tags", FLOAT, ["batch", "time", tags])],
    )


def padding_mask_bigru(
    *, vocab: int = 400, embed: int = 16, hidden: int = 24, seed: int = 29
) -> onnx.ModelProto:
    """A seq2seq encoder as its package runs it: a BOOL mask True at the *padding* (`ids ==
    pad_id`), its padded steps zeroed before a BiGRU without sequence_lens; per-step states and
    their mean over the real steps. Fed a mask of ones on the tokens, every real step is hidden
    and every answer is the same whatever the input."""
    g = _Graph(seed)
    x = g.op("Gather", g.weight("embeddings", vocab, embed, scale=0.5), "input_ids")
    keep = g.op(
        "Unsqueeze",
        g.op("Cast", g.op("Not", "padding_mask"), to=FLOAT),
        g.const("last", np.array([2], np.int64)),
    )
    w = g.weight("W", 2, 3 * hidden, embed, scale=1 / np.sqrt(embed))
    r = g.weight("R", 2, 3 * hidden, hidden, scale=1 / np.sqrt(hidden))
    b = g.weight("B", 2, 6 * hidden, scale=0.1)
    y, _ = g.ops(
        "GRU",
        [g.op("Transpose", g.op("Mul", x, keep), perm=[1, 0, 2]), w, r, b],
        2,
        hidden_size=hidden,
        direction="bidirectional",
        linear_before_reset=1,
    )
    steps = g.op("Transpose", y, perm=[2, 0, 1, 3])  # [T, 2, B, H] -> [B, T, 2, H]
    merged = g.op("Reshape", steps, g.const("merge", np.array([0, 0, 2 * hidden], np.int64)))
    g.nodes.append(helper.make_node("Mul", [merged, keep], ["states"]))
    g.masked_mean("states", keep, "pooled")
    return g.model(
        "padding_mask_bigru",
        [
            io("input_ids", INT64, ["batch", "time"]),
            io("padding_mask", TensorProto.BOOL, ["batch", "time"]),
        ],
        [
            io("states", FLOAT, ["batch", "time", 2 * hidden]),
            io("pooled", FLOAT, ["batch", 2 * hidden]),
        ],
    )


def reads_nothing(*, width: int = 8, seed: int = 31) -> onnx.ModelProto:
    """A model whose answers do not depend on its input: per-step outputs from the input's
    shape alone (a position table), as a mis-wired export computes."""
    g = _Graph(seed)
    length = g.op("Shape", "ids", start=1, end=2)
    rows = g.op(
        "Range",
        g.const("zero", np.array(0, np.int64)),
        g.op("Squeeze", length),
        g.const("step", np.array(1, np.int64)),
    )
    table = g.op("Gather", g.weight("positions", 512, width), rows)
    shape = g.op(
        "Concat", g.op("Shape", "ids"), g.const("width", np.array([width], np.int64)), axis=0
    )
    g.nodes.append(helper.make_node("Expand", [table, shape], ["out"]))
    return g.model(
        "reads_nothing",
        [io("ids", INT64, ["batch", "time"])],
        [io("out", FLOAT, ["batch", "time", width])],
    )


def strided_bilstm(
    *, vocab: int = 300, embed: int = 16, hidden: int = 16, tags: int = 5, seed: int = 37
) -> onnx.ModelProto:
    """A BiLSTM that runs over every second step (a stride-2 front end, as a line recogniser's
    convolutions make), without sequence_lens: [B, T] ids -> [B, ceil(T / 2), tags]. Each row's
    length in input steps is not a length its LSTM can take."""
    g = _Graph(seed)
    x = g.op("Gather", g.weight("embeddings", vocab, embed, scale=0.5), "ids")
    every_second = g.op(
        "Slice",
        x,
        g.const("start", np.array([0], np.int64)),
        g.const("end", np.array([2**62], np.int64)),
        g.const("axis", np.array([1], np.int64)),
        g.const("stride", np.array([2], np.int64)),
    )
    merged = g.bilstm(every_second, embed, hidden)  # [B, T', 2 * hidden]
    g.nodes.append(helper.make_node("Identity", [g.linear(merged, 2 * hidden, tags)], ["tags"]))
    return g.model(
        "strided_bilstm",
        [io("ids", INT64, ["batch", "time"])],
        [io("tags", FLOAT, ["batch", "steps", tags])],
    )


def pairwise_cost(*, vocab: int = 300, embed: int = 64, seed: int = 41) -> onnx.ModelProto:
    """A per-step encoder whose graph also computes a product over every pair of rows and steps
    that it multiplies by zero: answers exact in any batch, cost growing with the square of the
    rows in it (what a detector whose page images fill a core alone does to batching)."""
    g = _Graph(seed)
    x = g.op("Gather", g.weight("embeddings", vocab, embed, scale=0.5), "ids")
    states = g.op("Tanh", g.op("MatMul", x, g.weight("W", embed, embed)))
    flat = g.op("Reshape", x, g.const("flat", np.array([-1, embed], np.int64)))
    gram = g.op("MatMul", flat, g.op("Transpose", flat, perm=[1, 0]))
    nothing = g.op(
        "Mul", g.op("ReduceSum", gram, keepdims=0), g.const("zero", np.array(0, np.float32))
    )
    g.nodes.append(helper.make_node("Add", [states, nothing], ["states"]))
    return g.model(
        "pairwise_cost",
        [io("ids", INT64, ["batch", "time"])],
        [io("states", FLOAT, ["batch", "time", embed])],
    )


def sample_rate_scaled(*, seed: int = 43) -> onnx.ModelProto:
    """Raw samples [B, S] and a scalar sample rate `sr` (as speech exports take one): each
    sample scaled by sr / 16000 through a small per-sample layer. `sr` is no sequence: the
    server feeds the configured value on every run."""
    g = _Graph(seed)
    rate = g.op("Div", g.op("Cast", "sr", to=FLOAT), g.const("base", np.array(16000, np.float32)))
    scaled = g.op("Unsqueeze", g.op("Mul", "audio", rate), g.const("last", np.array([2], np.int64)))
    g.nodes.append(helper.make_node("Tanh", [g.linear(scaled, 1, 4)], ["frames"]))
    return g.model(
        "sample_rate_scaled",
        [io("audio", FLOAT, ["batch", "samples"]), io("sr", INT64, [])],
        [io("frames", FLOAT, ["batch", "samples", 4])],
    )


def declared_one_encoder(*, vocab: int = 300, embed: int = 16, seed: int = 47) -> onnx.ModelProto:
    """A masked encoder as a trace at batch 1 declares it: ids, mask and both outputs fixed at
    a batch of 1, while every op works row by row (per-step states, their masked mean)."""
    g = _Graph(seed)
    x = g.op("Gather", g.weight("embeddings", vocab, embed, scale=0.5), "input_ids")
    keep = g.op(
        "Unsqueeze",
        g.op("Cast", "attention_mask", to=FLOAT),
        g.const("last", np.array([2], np.int64)),
    )
    g.nodes.append(
        helper.make_node("Mul", [g.op("Tanh", g.linear(x, embed, embed)), keep], ["states"])
    )
    g.masked_mean("states", keep, "pooled")
    return g.model(
        "declared_one_encoder",
        [io("input_ids", INT64, [1, "sequence"]), io("attention_mask", INT64, [1, "sequence"])],
        [io("states", FLOAT, [1, "sequence", embed]), io("pooled", FLOAT, [1, embed])],
    )


def clamped_head(*, vocab: int = 300, embed: int = 12, seed: int = 53) -> onnx.ModelProto:
    """Per-step states and a head over their first max(1, floor((T + 3) / 8)) steps (an
    adaptive pooling that keeps at least one): the rule floor((T + 3) / 8) holds from 5 steps
    on, below that the size is clamped at 1."""
    g = _Graph(seed)
    x = g.op("Gather", g.weight("embeddings", vocab, embed, scale=0.5), "ids")
    states = g.op("Tanh", g.linear(x, embed, embed))
    length = g.op("Shape", "ids", start=1, end=2)
    kept = g.op(
        "Max",
        g.op(
            "Div",
            g.op("Add", length, g.const("three", np.array([3], np.int64))),
            g.const("eight", np.array([8], np.int64)),
        ),
        g.const("one", np.array([1], np.int64)),
    )
    first = g.op(
        "Slice",
        states,
        g.const("start", np.array([0], np.int64)),
        kept,
        g.const("axis", np.array([1], np.int64)),
    )
    g.nodes.append(helper.make_node("Identity", [first], ["head"]))
    return g.model(
        "clamped_head",
        [io("ids", INT64, ["batch", "time"])],
        [io("head", FLOAT, ["batch", "kept", embed])],
    )


def unbatched_frames(*, width: int = 40, classes: int = 3, seed: int = 59) -> onnx.ModelProto:
    """Frames with no batch axis at all, as some exports take one utterance: [T, 40] -> per-
    frame scores [T] and class logits [T, 3]."""
    g = _Graph(seed)
    hidden = g.op("Tanh", g.linear("frames", width, 16))
    g.nodes.append(helper.make_node("Identity", [g.linear(hidden, 16, classes)], ["logits"]))
    g.nodes.append(
        helper.make_node(
            "ReduceMean", [hidden, g.const("last", np.array([1], np.int64))], ["score"], keepdims=0
        )
    )
    return g.model(
        "unbatched_frames",
        [io("frames", FLOAT, ["T", width])],
        [io("score", FLOAT, ["T"]), io("logits", FLOAT, ["T", classes])],
    )


def text_detector(*, channels: int = 8, grid: int = 32, seed: int = 61) -> onnx.ModelProto:
    """A text detector over page images [N, 3, H, W], H and W free, as DBNet-style exports
    are: full-resolution features plus a context path pooled over `grid` x `grid` cells and
    upsampled back, added together, then a probability map [N, 1, H, W]. The sum broadcasts
    only where H and W are multiples of 32: at any other width ONNX Runtime refuses to run."""
    g = _Graph(seed)
    near = g.op("Relu", _conv(g, "image", 3, channels, [3, 3], pads=[1, 1, 1, 1]))
    cells = g.op("Relu", _conv(g, near, channels, channels, [grid, grid], strides=[grid, grid]))
    scales = g.const("scales", np.array([1, 1, grid, grid], np.float32))
    context = g.op("Resize", cells, "", scales, mode="nearest")
    mixed = g.op("Relu", g.op("Add", near, context))
    logits = _conv(g, mixed, channels, 1, [3, 3], pads=[1, 1, 1, 1])
    g.nodes.append(helper.make_node("Sigmoid", [logits], ["maps"]))
    return g.model(
        "text_detector",
        [io("image", FLOAT, ["N", 3, "H", "W"])],
        [io("maps", FLOAT, ["N", 1, "H", "W"])],
    )


def crnn_line(
    *, height: int = 32, channels: int = 12, hidden: int = 8, vocab: int = 30, seed: int = 67
) -> onnx.ModelProto:
    """A CRNN line recogniser as exported: an NCHW line [N, 3, 32, W], a convolution of stride
    4 making a column every 4 pixels, a BiLSTM over the columns without sequence_lens, CTC
    log-probabilities [N, floor(W / 4), 30]. Its LSTM runs over a quarter of the input's steps."""
    g = _Graph(seed)
    x = g.op("Relu", _conv(g, "image", 3, channels, [height, 4], strides=[height, 4]))
    cols = g.op(
        "Transpose", g.op("Squeeze", x, g.const("h", np.array([2], np.int64))), perm=[0, 2, 1]
    )
    merged = g.bilstm(cols, channels, hidden)  # [N, W/4, 2 * hidden]
    logits = g.linear(merged, 2 * hidden, vocab)
    g.nodes.append(helper.make_node("LogSoftmax", [logits], ["log_probs"], axis=-1))
    return g.model(
        "crnn_line",
        [io("image", FLOAT, ["N", 3, height, "W"])],
        [io("log_probs", FLOAT, ["N", "W_out", vocab])],
    )


def masked_bigru(
    *,
    padding_true: bool,
    lengths_from_mask: bool,
    vocab: int = 400,
    embed: int = 16,
    hidden: int = 24,
    tags: int = 5,
    seed: int = 67,
) -> onnx.ModelProto:
    """A tagger as a seq2seq package exports its encoder, its mask `padding_true` (BOOL, True
    at the padding: `ids == pad_id`) or not (INT64 ones on the tokens), with three outputs:
    per-step tags from a BiGRU and from the embeddings beside it (a residual path that reads
    the tokens whichever way the mask is fed), the BiGRU's states, and their mean over the
    mask. `lengths_from_mask`: each row's length for the BiGRU is counted from the mask (fed
    the other way, the RNN runs over nothing); else the BiGRU has no lengths (the server's
    copy gives it each row's), and the mask is read by the mean alone."""
    g = _Graph(seed)
    x = g.op("Gather", g.weight("embeddings", vocab, embed, scale=0.5), "input_ids")
    mask = "padding_mask" if padding_true else "attention_mask"
    real = g.op("Not", mask) if padding_true else g.op("Cast", mask, to=TensorProto.BOOL)
    keep = g.op("Cast", real, to=FLOAT)  # [B, T]
    time = g.const("time", np.array([1], np.int64))
    lengths = g.op("Cast", g.op("ReduceSum", keep, time, keepdims=0), to=TensorProto.INT32)
    w = g.weight("W", 2, 3 * hidden, embed, scale=1 / np.sqrt(embed))
    r = g.weight("R", 2, 3 * hidden, hidden, scale=1 / np.sqrt(hidden))
    b = g.weight("B", 2, 6 * hidden, scale=0.1)
    y, _ = g.ops(
        "GRU",
        [g.op("Transpose", x, perm=[1, 0, 2]), w, r, b, *([lengths] if lengths_from_mask else [])],
        2,
        hidden_size=hidden,
        direction="bidirectional",
        linear_before_reset=1,
    )
    steps = g.op("Transpose", y, perm=[2, 0, 1, 3])  # [T, 2, B, H] -> [B, T, 2, H]
    merged = g.op("Reshape", steps, g.const("merge", np.array([0, 0, 2 * hidden], np.int64)))
    g.nodes.append(helper.make_node("Identity", [merged], ["states"]))
    tagged = [g.linear(merged, 2 * hidden, tags), g.linear(x, embed, tags)]
    g.nodes.append(helper.make_node("Add", tagged, ["tags"]))
    kept = g.op("Unsqueeze", keep, g.const("last", np.array([2], np.int64)))
    g.masked_mean(g.op("Mul", merged, kept), kept, "pooled")
    return g.model(
        "masked_bigru",
        [
            io("input_ids", INT64, ["batch", "time"]),
            io(mask, TensorProto.BOOL if padding_true else INT64, ["batch", "time"]),
        ],
        [
            io("tags", FLOAT, ["batch", "time", tags]),
            io("states", FLOAT, ["batch", "time", 2 * hidden]),
            io("pooled", FLOAT, ["batch", 2 * hidden]),
        ],
    )

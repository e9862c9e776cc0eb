"""Attention that never holds T x T per head: each attention core of an exported encoder run by
ONNX Runtime's `com.microsoft.MultiHeadAttention` on its CPU flash path.

A plain export computes softmax(c Q K' + M) V with MatMul, Add and Softmax nodes, each holding
rows x heads x T x T floats: 512 MiB a layer for two heads at 8,192 tokens, two of them at the
peak. ONNX Runtime 1.31's CPU `MultiHeadAttention` runs a tiled flash kernel (MLAS's
`MlasFlashAttention`: blocks sized to the L2 cache, one buffer a thread) only when it is given
no key padding mask and no attention bias, in float32, and where it reads an L2 cache size
(contrib_ops/cpu/bert/multihead_attention.cc); given either, it holds the whole
T x T, and the ONNX `Attention` op (opsets 23, 24) has no such path in 1.31 at all
(`loadtest.attention_bench` measured both). So the mask is not given as a mask. Where M is the
same for every query and head (a padding mask: [B, 1, 1, T] before any Expand), it is folded
into one more feature of each head's queries and keys, 1 on every query and M / c on each key:
c (q . k + M / c) = c q . k + M, with the kernel's scale c. M is clamped at -1e30 first: such
a key gets exactly zero weight, as at -inf, and no -inf reaches the kernel's running maximum.
A core whose mask depends on the query (a local window, a causal mask) is left as it is.
Which tensor is the same for every query is read from shapes, learned by running the graph once
on a small batch: a mask [B, 1, 1, T] is one by its shape. transformers' masks are built as a
[B, 1, T, T] grid of a padding term AND a term per query that is true everywhere (`q >= 0`);
such a term is dropped when it is computed from shapes alone and true at that run. Where the
flash kernel is not taken (no L2 size read, ORT_DISABLE_FLASH_ATTENTION) the copy still answers
the same: the mask is in the keys, whichever path runs them.

`fuse_attention` writes the rewritten copy and checks it against the source on random padded
batches; the copy is kept only when it answers within TOLERANCE of the source.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bucketserve.errors import brief
from bucketserve.loading.served_file import save_with_external_weights
from bucketserve.runtime.sessions import GraphFile, run_all, side_session

log = logging.getLogger(__name__)

# Relative to 1 + |answer|, over every output: the flash kernel sums in another order (measured
# below 2e-6 on tiny BERT exports up to 8,192 tokens); a dropped mask moves answers by > 0.1.
TOLERANCE = 1e-5
CHECKS = ((2, 200), (1, 77), (3, 9))  # (rows, length) of the random batches checked
PROBE = (2, 13)  # (rows, length) shapes are learned at: 13 tells the time axis apart
MASKED = -1e30  # an added score at or below it: zero weight, as -inf gives, but finite
# What a padding mask passes through between the tensor that is the same for every query and
# the scores (an Expand to [B, 1, T, T], the bool made additive): redone on the small tensor.
ELEMENTWISE = frozenset(
    {"Cast", "Not", "Neg", "Where", "And", "Or", "Add", "Sub", "Mul", "Div", "Max", "Min"}
)
PREFIX = "bucketserve_attention"
MS_DOMAIN = "com.microsoft"

Step = tuple[onnx.NodeProto, str]  # a node the mask went through, and the input redone on


@dataclass(frozen=True)
class FusionReport:
    """What `fuse_attention` did: how many attention cores now run on the flash path, the ones
    it left (each with why), and the largest difference of the copy from the source over the
    random batches checked, (rows, length)."""

    fused: int
    left: tuple[str, ...]
    largest_difference: float
    checked: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class _Core:
    """softmax(c (A @ Bt) + mask) @ V in the source graph; `context` names its result."""

    queries: str  # A: [B, N, S, H]
    keys: str  # Bt: [B, N, H, T]
    values: str  # V: [B, N, T, Hv]
    scale: float  # c
    mask: str | None  # what is added to the scores, if anything
    context: str
    cone: tuple[str, ...]  # the tensors the mask is made from, by Expand and elementwise ops


@dataclass(frozen=True)
class _Plan:
    """How one core is rewritten: its heads, the mask before it was broadcast over queries
    ([B, 1, 1, T]), and the elementwise nodes from there up to the mask, to redo on it."""

    core: _Core
    heads: int
    source: str | None
    redo: tuple[Step, ...]


class _Graph:
    """What the matching reads of the source graph: each tensor's producer, the scalar
    constants, and the inputs fed at run time."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.producer = {o: n for n in graph.node for o in n.output}
        self.users: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.users.setdefault(name, []).append(node)
        self.constants = _scalars(graph)
        weights = {t.name for t in graph.initializer}
        self.fed = {i.name for i in graph.input} - weights

    def tensors_of(self, node: onnx.NodeProto) -> list[str]:
        """`node`'s inputs that are not scalar constants."""
        return [i for i in node.input if i and i not in self.constants]

    def shape_only(self, name: str, depth: int = 0) -> bool:
        """Whether `name`'s value follows from the inputs' shapes alone (never their values):
        it reaches what is fed only through Shape nodes."""
        node = self.producer.get(name)
        if node is None:
            return name not in self.fed
        if node.op_type == "Shape":
            return True
        return depth < 64 and all(self.shape_only(i, depth + 1) for i in node.input if i)


def fuse_attention(
    source: Path, target: Path, *, checks: Sequence[tuple[int, int]] = CHECKS
) -> FusionReport | None:
    """`source` rewritten to `target` (weights in `target`'s .data file) with every attention
    core whose mask is a key padding mask run by MultiHeadAttention's flash path, and checked
    against `source` on random padded batches of `checks` (rows, length). None, and no
    `target`, when no core fuses, the copy fails, or it answers beyond TOLERANCE."""
    model = onnx.load(str(source))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    cores = _cores(model.graph, softmax_axis=-1 if opset >= 13 else 1)
    if not cores:
        return None
    try:
        shapes, values = _probe(source, cores)
    except Exception as exc:  # ONNX Runtime's own types, on a graph it cannot run so
        log.warning("%s: attention not fused, its shapes not probed (%s)", source, brief(str(exc)))
        return None
    plans: list[_Plan] = []
    left: list[str] = []
    g = _Graph(model.graph)
    for core in cores:
        plan = _plan(core, g, shapes, values)
        if isinstance(plan, str):
            left.append(f"{core.context}: {plan}")
        else:
            plans.append(plan)
    if not plans:
        log.info("%s: no attention fused: %s", source, "; ".join(left))
        return None
    for index, plan in enumerate(plans):
        _rewrite(model.graph, plan, index)
    _prune(model.graph)
    if all(o.domain != MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    save_with_external_weights(model, target)
    try:
        difference, checked = _difference(source, target, checks)
    except Exception as exc:  # (as above: the copy does not run where the source does)
        log.warning("%s: the fused copy does not run (%s): not kept", source, brief(str(exc)))
        difference, checked = float("inf"), ()
    if not checked or not difference <= TOLERANCE:
        if checked:
            log.warning("%s: the fused copy answers %.3g away: not kept", source, difference)
        _remove(target)
        return None
    return FusionReport(len(plans), tuple(left), difference, checked)


def _cores(graph: onnx.GraphProto, softmax_axis: int) -> list[_Core]:
    """Every softmax(c (A @ Bt) + mask) @ V over the last axis, as exporters write it: c a
    scalar Mul or Div after the product (or folded into A and Bt: c = 1), the mask added before
    the softmax, and the softmax's NaNs zeroed or not (PyTorch's SDPA export zeroes them).
    (`softmax_axis`: Softmax's default, 1 before opset 13.)"""
    g = _Graph(graph)
    found = []
    for softmax in graph.node:
        axis = _attribute(softmax, "axis", softmax_axis)
        if softmax.op_type != "Softmax" or axis not in (-1, 3):
            continue
        weights = _zeroed_nans(softmax.output[0], g)
        after = g.users.get(weights, [])
        if len(after) != 1 or after[0].op_type != "MatMul" or after[0].input[0] != weights:
            continue
        scores, mask = softmax.input[0], None
        added = g.producer.get(scores)
        if added is not None and added.op_type == "Add":
            for i in (0, 1):
                if _product(added.input[i], g) is not None:
                    scores, mask = added.input[i], added.input[1 - i]
                    break
        product = _product(scores, g)
        if product is None:
            continue
        matmul, scale = product
        cone = _cone(mask, g) if mask is not None else ()
        context = after[0].output[0]
        found.append(
            _Core(matmul.input[0], matmul.input[1], after[0].input[1], scale, mask, context, cone)
        )
    return found


def _zeroed_nans(weights: str, g: _Graph) -> str:
    """Where(IsNaN(w), 0, w)'s output when `weights` w goes only there (PyTorch's SDPA export:
    a row with every key masked gives zeros), else `weights`."""
    after = sorted(g.users.get(weights, []), key=lambda n: n.op_type)
    if [n.op_type for n in after] != ["IsNaN", "Where"]:
        return weights
    isnan, where = after
    if list(where.input) != [isnan.output[0], where.input[1], weights]:
        return weights
    return str(where.output[0]) if g.constants.get(where.input[1]) == 0.0 else weights


def _product(name: str, g: _Graph) -> tuple[onnx.NodeProto, float] | None:
    """The MatMul `name` is, or is scaled from by a scalar (Mul or Div), and the scale."""
    node = g.producer.get(name)
    if node is None:
        return None
    if node.op_type == "MatMul":
        return node, 1.0
    if node.op_type in ("Mul", "Div"):
        for i in (0, 1) if node.op_type == "Mul" else (0,):
            inner = g.producer.get(node.input[i])
            factor = g.constants.get(node.input[1 - i])
            if inner is not None and inner.op_type == "MatMul" and factor:
                return inner, factor if node.op_type == "Mul" else 1.0 / factor
    return None


def _cone(mask: str, g: _Graph) -> tuple[str, ...]:
    """The tensors `mask` is made from by Expand and elementwise ops, nearest first (at most
    64): the probe gives their values, and `_plan` finds among them the mask before it was
    broadcast over queries."""
    cone, queue = [mask], [mask]
    while queue and len(cone) < 64:
        node = g.producer.get(queue.pop(0))
        if node is None or node.op_type not in ELEMENTWISE | {"Expand"}:
            continue
        given = [node.input[0]] if node.op_type == "Expand" else g.tensors_of(node)
        for name in given:
            if name not in cone:
                cone.append(name)
                queue.append(name)
    return tuple(cone)


def _probe(source: Path, cores: list[_Core]) -> tuple[dict[str, list[int]], dict[str, np.ndarray]]:
    """The shape of every tensor the cores read, and the value of each in their masks' cones,
    from one run of a copy that also gives them (beside the source, so that it finds the same
    external weights; removed once loaded) on a random padded batch of PROBE."""
    proto = onnx.load(str(source), load_external_data=False)
    shaped = list(dict.fromkeys(n for c in cores for n in (c.queries, c.keys, c.values, c.context)))
    valued = list(dict.fromkeys(n for c in cores for n in c.cone))
    for index, name in enumerate(shaped):
        out = f"{PREFIX}_shape_{index}"
        proto.graph.node.append(helper.make_node("Shape", [name], [out]))
        proto.graph.output.append(helper.make_tensor_value_info(out, TensorProto.INT64, None))
    for index, name in enumerate(valued):
        out = f"{PREFIX}_value_{index}"
        proto.graph.node.append(helper.make_node("Cast", [name], [out], to=TensorProto.FLOAT))
        proto.graph.output.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, None))
    with tempfile.NamedTemporaryFile(dir=source.parent, suffix=".onnx") as copy:
        onnx.save_model(proto, copy.name)
        session = side_session(GraphFile(Path(copy.name), ("CPUExecutionProvider",)))
    got = run_all(session, _feeds(proto.graph, *PROBE, np.random.default_rng(0)))
    shapes = {n: [int(d) for d in got[f"{PREFIX}_shape_{i}"]] for i, n in enumerate(shaped)}
    return shapes, {n: got[f"{PREFIX}_value_{i}"] for i, n in enumerate(valued)}


def _plan(
    core: _Core, g: _Graph, shapes: dict[str, list[int]], values: dict[str, np.ndarray]
) -> _Plan | str:
    """How `core` is rewritten, or why it is left as it is."""
    rows, length = PROBE
    a, bt, v = shapes[core.queries], shapes[core.keys], shapes[core.values]
    if len(a) != 4 or len(bt) != 4 or len(v) != 4:
        return f"queries {a}, keys {bt}, values {v}: not [batch, heads, time, size]"
    batch, heads, queries, size = a
    if bt[:3] != [batch, heads, size] or v[:3] != [batch, heads, bt[3]]:
        return f"queries {a}, keys' transpose {bt} and values {v} are no attention's"
    if batch != rows or bt[3] != length or queries != length:
        return f"queries {a}: the batch and time axes are not where attention has them"
    if shapes[core.context] != [batch, heads, queries, v[3]]:
        return f"its result {shapes[core.context]} is not [batch, heads, time, size]"
    if core.mask is None:
        return _Plan(core, heads, None, ())

    def per_key(name: str) -> bool:  # [B or 1, 1, 1, T]: the same for every query and head
        shape = list(values[name].shape)
        return len(shape) == 4 and shape[0] in (1, rows) and shape[1:] == [1, 1, length]

    def always(name: str) -> bool:  # per query at most, true at the probe, from shapes alone
        shape = list(values[name].shape)
        return shape[-1:] in ([], [1]) and bool(values[name].all()) and g.shape_only(name)

    name, redo = core.mask, []
    while name in values and not per_key(name):
        node = g.producer.get(name)
        if node is None:
            break
        given = [node.input[0]] if node.op_type == "Expand" else g.tensors_of(node)
        if any(i not in values for i in given):
            break
        if node.op_type == "Expand":  # (left out: the fold broadcasts by itself)
            name = given[0]
        elif len(given) == 1:
            redo.append((node, given[0]))
            name = given[0]
        elif node.op_type == "And" and len(given) == 2 and any(always(i) for i in given):
            # (`q >= 0` and the like, which transformers' mask functions AND in)
            name = next(i for i in given if not always(i))
        else:
            break
    if name in values and per_key(name):
        return _Plan(core, heads, name, tuple(reversed(redo)))
    return "its mask is not the same for every query (a local window or a causal mask)"


def _rewrite(graph: onnx.GraphProto, plan: _Plan, index: int) -> None:
    """The core's product, softmax and MatMul replaced by MultiHeadAttention, put where the
    MatMul that gave its result was (so every node it reads comes before)."""
    core, heads, name = plan.core, plan.heads, f"{PREFIX}_{index}"
    nodes: list[onnx.NodeProto] = []
    weights: list[onnx.TensorProto] = []

    def const(part: str, value: np.ndarray) -> str:
        weights.append(numpy_helper.from_array(value, f"{name}_{part}"))
        return f"{name}_{part}"

    def op(kind: str, inputs: list[str], part: str, domain: str = "", **attrs: Any) -> str:
        nodes.append(helper.make_node(kind, inputs, [f"{name}_{part}"], domain=domain, **attrs))
        return f"{name}_{part}"

    flat = const("flat", np.array([0, 0, -1], np.int64))
    queries = op("Transpose", [core.queries], "q", perm=[0, 2, 1, 3])  # [B, S, N, H]
    keys = op("Transpose", [core.keys], "k", perm=[0, 3, 1, 2])  # [B, T, N, H]
    values = op("Transpose", [core.values], "v", perm=[0, 2, 1, 3])
    if plan.source is not None:
        mask = plan.source
        for step, (node, given) in enumerate(plan.redo):
            inputs = [mask if i == given else i for i in node.input]
            mask = op(node.op_type, inputs, f"mask_{step}", **_attributes(node))
        first = const("first", np.array([0], np.int64))
        third = const("third", np.array([3], np.int64))
        one = const("one", np.array([1], np.int64))

        def feature_shape(x: str, part: str) -> str:  # [B, S or T, N, 1]
            leading = op("Slice", [op("Shape", [x], f"{part}_shape"), first, third], f"{part}_bsn")
            return op("Concat", [leading, one], f"{part}_feature_shape", axis=0)

        ones = op(
            "ConstantOfShape",
            [feature_shape(queries, "q")],
            "ones",
            value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]),
        )
        as_float = op("Cast", [mask], "mask_float", to=TensorProto.FLOAT)
        clamped = op("Max", [as_float, const("masked", np.array(MASKED, np.float32))], "clamped")
        unscale = const("unscale", np.array(1 / core.scale, np.float32))
        per_key = op("Mul", [clamped, unscale], "per_key")  # [B, 1, 1, T]
        per_key = op("Transpose", [per_key], "per_key_t", perm=[0, 3, 1, 2])  # [B, T, 1, 1]
        per_key = op("Expand", [per_key, feature_shape(keys, "k")], "per_key_e")
        queries = op("Concat", [queries, ones], "q_feature", axis=3)
        keys = op("Concat", [keys, per_key], "k_feature", axis=3)
    flattened = [
        op("Reshape", [x, flat], f"{part}_flat")
        for x, part in ((queries, "q"), (keys, "k"), (values, "v"))
    ]
    attended = op(
        "MultiHeadAttention",
        flattened,
        "mha",
        domain=MS_DOMAIN,
        num_heads=heads,
        scale=float(core.scale),
    )
    split = const("split", np.array([0, 0, heads, -1], np.int64))
    by_head = op("Reshape", [attended, split], "by_head")
    nodes.append(helper.make_node("Transpose", [by_head], [core.context], perm=[0, 2, 1, 3]))
    at = next(i for i, n in enumerate(graph.node) if core.context in n.output)
    del graph.node[at]
    for offset, node in enumerate(nodes):
        graph.node.insert(at + offset, node)
    graph.initializer.extend(weights)


def _prune(graph: onnx.GraphProto) -> None:
    """Nodes whose outputs nothing reads removed (the scores, their softmax, the mask broadcast
    over queries), until none is left."""
    while True:
        read = {o.name for o in graph.output} | _read(graph)
        dead = [i for i, n in enumerate(graph.node) if not any(o in read for o in n.output)]
        if not dead:
            return
        for i in reversed(dead):
            del graph.node[i]


def _read(graph: onnx.GraphProto) -> set[str]:
    """Every name a node of `graph` reads, in its subgraphs too."""
    names: set[str] = set()
    for node in graph.node:
        names.update(node.input)
        for attribute in node.attribute:
            for sub in [attribute.g, *attribute.graphs]:
                names |= _read(sub)
    return names


def _feeds(
    graph: onnx.GraphProto, rows: int, length: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Random inputs of an encoder on [batch, time, ...] inputs: ids below its vocabulary, no
    segments, features from a normal, and a padding mask (right padding, as the server pads;
    the first row full)."""
    lengths = rng.integers(max(1, length // 2), length + 1, rows)
    lengths[0] = length
    mask = np.arange(length)[None, :] < lengths[:, None]
    vocabulary = _vocabulary(graph)
    weights = {t.name for t in graph.initializer}
    feeds = {}
    for value in graph.input:
        if value.name in weights:
            continue
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        shape = (rows, length, *(d.dim_value for d in value.type.tensor_type.shape.dim[2:]))
        if "mask" in value.name:
            feeds[value.name] = mask.astype(dtype)
        elif value.name == "token_type_ids":
            feeds[value.name] = np.zeros(shape, dtype)
        elif np.issubdtype(dtype, np.floating):
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[value.name] = rng.integers(0, vocabulary, shape).astype(dtype)
    return feeds


def _vocabulary(graph: onnx.GraphProto) -> int:
    """The rows of the table `input_ids` is gathered from (100 when none is found)."""
    rows = {t.name: t.dims[0] for t in graph.initializer if t.dims}
    for node in graph.node:
        if node.op_type == "Gather" and node.input[1] == "input_ids" and node.input[0] in rows:
            return int(rows[node.input[0]])
    return 100


def _difference(
    source: Path, target: Path, checks: Sequence[tuple[int, int]]
) -> tuple[float, tuple[tuple[int, int], ...]]:
    """The largest |copy - source| / (1 + |source|) over every float output of random padded
    batches of `checks`, and the checks run: one the source itself cannot run (past its
    positions) is left out."""
    graph = onnx.load(str(source), load_external_data=False).graph
    plain = side_session(GraphFile(source, ("CPUExecutionProvider",)))
    fused = side_session(GraphFile(target, ("CPUExecutionProvider",)))
    largest, checked = 0.0, []
    for rows, length in checks:
        feeds = _feeds(graph, rows, length, np.random.default_rng(rows * 7919 + length))
        try:
            want = run_all(plain, feeds)
        except Exception:  # (ONNX Runtime's own types: a length the source cannot take)
            continue
        got = run_all(fused, feeds)
        for output, value in want.items():
            if np.issubdtype(value.dtype, np.floating):
                apart = np.abs(got[output].astype(np.float64) - value) / (1 + np.abs(value))
                largest = max(largest, float(np.nan_to_num(apart, nan=np.inf).max(initial=0)))
        checked.append((rows, length))
    return largest, tuple(checked)


def _scalars(graph: onnx.GraphProto) -> dict[str, float]:
    """The graph's one-element constants (initializers and Constant nodes), by name."""
    tensors = [(t.name, t) for t in graph.initializer]
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            tensors.append((node.output[0], node.attribute[0].t))
    return {
        name: float(numpy_helper.to_array(tensor).reshape(-1)[0])
        for name, tensor in tensors
        if int(np.prod(tensor.dims)) == 1 and tensor.data_location != TensorProto.EXTERNAL
    }


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _remove(target: Path) -> None:
    for path in (target, target.with_name(target.name + ".data")):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

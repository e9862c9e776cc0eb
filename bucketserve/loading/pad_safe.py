"""RNNs made pad-safe: each row's length wired into the `LSTM`, `GRU` and `RNN` nodes that do
not have it.

An ONNX recurrent node without `sequence_lens` runs every row to the batch's full length: the
backward direction of a bidirectional one starts on the padding, so padding moves its answers
and the check serves it in batches of exactly equal length, which random lengths seldom fill.
Given each row's length, ONNX Runtime stops each row at its own end. So where the check finds
padding moves a model, and its graph has such nodes, the server writes a copy of it (into its
own cache, as session-per-key's copy; the repository is never written) with one more input,
each row's length, fed to every one of them, and checks the copy again: it is served in length
buckets if padding no longer moves it, and the original as before otherwise. The input is the
server's own (`row_lengths`): it fills it from each row's length, and a client sees the
model's contract as it was (its inputs, which ids are reserved, `sequence_lengths` over v2).

A node behind a strided front end (a line recogniser's convolutions, a slice of every second
frame) runs over fewer steps than the input has, so a row's length in input steps is not one
it can take. Each node is given the length in its own steps: the rule floor((T + a) / s) its
input's time axis follows, learned at load by running a copy of the graph that also gives
that input's shape at the lengths the probe runs (`own_steps`). A node whose steps follow no
such rule leaves the model as it is.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from bucketserve.core.layout import SAME_STEPS, InputRole, Steps
from bucketserve.core.model import SequenceRules
from bucketserve.errors import ConfigError, brief
from bucketserve.loading.axes import resolve_axes
from bucketserve.loading.check import random_sequences
from bucketserve.loading.config import InputConfig
from bucketserve.loading.layouts import Served
from bucketserve.loading.probe import fit_steps, verification_lengths
from bucketserve.loading.repository import ModelSpec
from bucketserve.loading.served_file import cached, content_key, save_with_external_weights
from bucketserve.loading.signature import read_signature
from bucketserve.runtime.sessions import GraphFile, run_all, side_session

log = logging.getLogger(__name__)

RECURRENT = ("LSTM", "GRU", "RNN")
LENGTHS_INPUT = "bucketserve_lengths"
SEQUENCE_LENS = 4  # the input index of `sequence_lens` on all three
OwnSteps = dict[str, Steps]  # a recurrent node's input X -> how its steps follow the input's


def unmasked_recurrences(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The recurrent nodes that run every row to the full length."""
    return [
        node
        for node in model.graph.node
        if node.op_type in RECURRENT
        and (len(node.input) <= SEQUENCE_LENS or not node.input[SEQUENCE_LENS])
    ]


def pad_safe_spec(
    spec: ModelSpec, cache_dir: Path, graph: Path, served: Served
) -> tuple[ModelSpec, list[str]] | None:
    """The spec of the model's pad-safe copy and the nodes it rewrote, or None when no
    recurrent node lacks the lengths or one's steps follow no rule of the input's (`graph`:
    the file served, run with `served`'s layout and rules to learn them)."""
    if spec.axes.unbatched:  # (one sequence a run: no padding to be safe from)
        return None
    proto = onnx.load(str(spec.onnx_path), load_external_data=False)
    nodes = unmasked_recurrences(proto)
    if not nodes:
        return None
    steps = own_steps(spec, graph, served)
    if steps is None:
        return None
    told = [n for n, i in spec.config.inputs.items() if i.role is InputRole.LENGTHS]
    lengths = told[0] if told else LENGTHS_INPUT
    strided = "".join(f"-{s.stride}.{s.offset}" for s in steps.values() if s != SAME_STEPS)
    key = f"{content_key(spec)}-pad-safe{strided}"
    path = cached(spec, cache_dir, key, _write_pad_safe(lengths, steps))
    config = spec.config
    if not told:  # (the server's own input: the model's contract stays its original's)
        inputs = {**config.inputs, lengths: InputConfig(role=InputRole.ROW_LENGTHS)}
        config = config.model_copy(update={"inputs": inputs})
    signature = read_signature(path, config)
    axes = resolve_axes(signature, config, functools.partial(ConfigError.at, path))
    safe = dataclasses.replace(spec, config=config, onnx_path=path, signature=signature, axes=axes)
    return safe, [
        f"{n.op_type} {n.name or n.output[0]}"
        + ("" if steps[n.input[0]] == SAME_STEPS else f" ({steps[n.input[0]]} steps)")
        for n in nodes
    ]


def own_steps(spec: ModelSpec, graph: Path, served: Served) -> OwnSteps | None:
    """How each unmasked recurrent node's steps follow the input's, found by running a copy of
    `graph` that also gives the shape of each node's input X (beside it, so that it finds the
    same external weights; removed once loaded) alone at the lengths the probe checks a rule
    at. None, and a line in the log, when one follows no rule (or the copy fails)."""
    proto = onnx.load(str(graph), load_external_data=False)
    shapes: dict[str, tuple[str, int]] = {}  # X -> (its shape's output, X's time dim)
    for node in unmasked_recurrences(proto):
        x, out = node.input[0], f"bucketserve_steps_{len(shapes)}"
        if x not in shapes:
            time = next((a.i for a in node.attribute if a.name == "layout"), 0)  # 1: batch first
            proto.graph.node.append(helper.make_node("Shape", [x], [out]))
            proto.graph.output.append(helper.make_tensor_value_info(out, TensorProto.INT64, [3]))
            shapes[x] = (out, time)
    rules = served.rules
    try:
        with tempfile.NamedTemporaryFile(dir=graph.parent, suffix=".onnx") as copy:
            onnx.save_model(proto, copy.name)
            session = side_session(GraphFile(Path(copy.name), ("CPUExecutionProvider",)))

        @functools.cache
        def shapes_at(length: int) -> dict[str, np.ndarray]:  # (one random sequence alone)
            run = rules.run_length(length)
            sequences = random_sequences(rules, [run], seed=length)
            return run_all(session, served.layout.collate(sequences, 1, run))

        def steps_of(out: str, time: int, length: int) -> int:
            return int(shapes_at(length)[out][time])

        found = {
            x: _rule(functools.partial(steps_of, out, time), spec, rules)
            for x, (out, time) in shapes.items()
        }
    except Exception as exc:  # ONNX Runtime's own types, on a graph it cannot run so
        log.warning(
            "model %s: its recurrent nodes' steps could not be measured (%s): served as it is",
            spec.name,
            brief(str(exc)),
        )
        return None
    lost = [x for x, steps in found.items() if steps is None]
    if lost:
        log.warning(
            "model %s: the steps of the recurrent node over %s follow no rule floor((T + a) / s) "
            "of the input's: it cannot be given each row's length, served as it is",
            spec.name,
            lost[0],
        )
        return None
    return {x: steps for x, steps in found.items() if steps is not None}


def _rule(size: Callable[[int], int], spec: ModelSpec, rules: SequenceRules) -> Steps | None:
    """The rule floor((T + a) / s) that `size` (a node's steps for T input steps) follows from
    the shortest length to the longest, checked as the probe checks an output's."""
    shortest, longest = rules.min_length, rules.max_length
    steps = fit_steps(size, shortest, longest)
    checked = verification_lengths(shortest, longest, spec.config.batching.edges)
    if steps is None or any(steps.of(n) != size(n) for n in checked):
        return None
    return steps


def _write_pad_safe(lengths: str, steps: OwnSteps) -> Callable[[ModelSpec, Path], None]:
    """A writer of the copy: `lengths` (added as an input [batch] when the model has no
    lengths input) given to every recurrent node that lacks it, in the node's own steps:
    floor((lengths + a) / s), at least 1 (a pad row's), cast to int32."""

    def write(spec: ModelSpec, onnx_path: Path) -> None:
        model = onnx.load(str(spec.onnx_path))
        graph = model.graph
        if all(i.name != lengths for i in graph.input):
            seq = spec.signature.inputs[spec.config.sequence_input]
            batch = seq.dims[spec.axes.inputs[seq.name].batch or 0]
            graph.input.append(helper.make_tensor_value_info(lengths, TensorProto.INT64, [batch]))
        front: list[onnx.NodeProto] = []
        in_steps: dict[Steps, str] = {}
        for rule in sorted(set(steps.values()), key=str):
            name = f"{lengths}_{rule.stride}_{rule.offset}"
            shifted, divided, least = (f"{name}_{part}" for part in ("shifted", "over", "least"))
            for value, number in ((shifted, rule.offset), (divided, rule.stride), (least, 1)):
                front.append(_constant(value, number))
            front += [
                helper.make_node("Add", [lengths, shifted], [f"{name}_sum"]),
                helper.make_node("Div", [f"{name}_sum", divided], [f"{name}_floor"]),
                helper.make_node("Max", [f"{name}_floor", least], [f"{name}_int64"]),
                helper.make_node("Cast", [f"{name}_int64"], [name], to=TensorProto.INT32),
            ]
            in_steps[rule] = name
        for node in reversed(front):
            graph.node.insert(0, node)
        for node in unmasked_recurrences(model):
            inputs = list(node.input) + [""] * (SEQUENCE_LENS + 1 - len(node.input))
            inputs[SEQUENCE_LENS] = in_steps[steps[node.input[0]]]
            del node.input[:]
            node.input.extend(inputs)
        save_with_external_weights(model, onnx_path)

    return write


def _constant(name: str, value: int) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=onnx.numpy_helper.from_array(np.array(value, np.int64))
    )

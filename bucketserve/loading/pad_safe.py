"""RNNs made pad-safe: each row's length wired into the `LSTM`, `GRU` and `RNN` nodes that do
not have it.

An ONNX recurrent node without `sequence_lens` runs every row to the batch's full length: the
backward direction of a bidirectional one starts on the padding, so padding moves its answers
and the check serves it in batches of exactly equal length, which random lengths seldom fill.
Given each row's length, ONNX Runtime stops each row at its own end. So where the check finds
padding moves a model, and its graph has such nodes, the server writes a copy of it (into its
own cache, as session-per-key's copy; the repository is never written) with one more input,
each row's length, fed to every one of them, and checks the copy again: it is served in length
buckets if padding no longer moves it, and the original as before otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from bucketserve.core.layout import InputRole
from bucketserve.errors import ConfigError
from bucketserve.loading.axes import resolve_axes
from bucketserve.loading.config import InputConfig
from bucketserve.loading.repository import ModelSpec
from bucketserve.loading.served_file import cached, content_key, save_with_external_weights
from bucketserve.loading.signature import read_signature

RECURRENT = ("LSTM", "GRU", "RNN")
LENGTHS_INPUT = "bucketserve_lengths"
SEQUENCE_LENS = 4  # the input index of `sequence_lens` on all three


def unmasked_recurrences(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The recurrent nodes that run every row to the full length."""
    return [
        node
        for node in model.graph.node
        if node.op_type in RECURRENT
        and (len(node.input) <= SEQUENCE_LENS or not node.input[SEQUENCE_LENS])
    ]


def pad_safe_spec(spec: ModelSpec, cache_dir: Path) -> tuple[ModelSpec, list[str]] | None:
    """The spec of the model's pad-safe copy and the nodes it rewrote, or None when no
    recurrent node lacks the lengths."""
    if spec.axes.unbatched:  # (one sequence a run: no padding to be safe from)
        return None
    proto = onnx.load(str(spec.onnx_path), load_external_data=False)
    nodes = unmasked_recurrences(proto)
    if not nodes:
        return None
    told = [n for n, i in spec.config.inputs.items() if i.role is InputRole.LENGTHS]
    lengths = told[0] if told else LENGTHS_INPUT
    path = cached(spec, cache_dir, f"{content_key(spec)}-pad-safe", _write_pad_safe(lengths))
    config = spec.config
    if not told:
        inputs = {**config.inputs, lengths: InputConfig(role=InputRole.LENGTHS)}
        config = config.model_copy(update={"inputs": inputs})
    signature = read_signature(path, config)
    axes = resolve_axes(signature, config, functools.partial(ConfigError.at, path))
    safe = dataclasses.replace(spec, config=config, onnx_path=path, signature=signature, axes=axes)
    return safe, [f"{n.op_type} {n.name or n.output[0]}" for n in nodes]


def _write_pad_safe(lengths: str) -> Callable[[ModelSpec, Path], None]:
    """A writer of the copy: `lengths` (added as an input [batch] when the model has no
    lengths input) cast to int32 and given to every recurrent node that lacks it."""

    def write(spec: ModelSpec, onnx_path: Path) -> None:
        model = onnx.load(str(spec.onnx_path))
        graph = model.graph
        if all(i.name != lengths for i in graph.input):
            seq = spec.signature.inputs[spec.config.sequence_input]
            batch = seq.dims[spec.axes.inputs[seq.name].batch or 0]
            graph.input.append(helper.make_tensor_value_info(lengths, TensorProto.INT64, [batch]))
        as_int32 = f"{lengths}_int32"
        graph.node.insert(0, helper.make_node("Cast", [lengths], [as_int32], to=TensorProto.INT32))
        for node in unmasked_recurrences(model):
            inputs = list(node.input) + [""] * (SEQUENCE_LENS + 1 - len(node.input))
            inputs[SEQUENCE_LENS] = as_int32
            del node.input[:]
            node.input.extend(inputs)
        save_with_external_weights(model, onnx_path)

    return write

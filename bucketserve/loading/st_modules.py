"""sentence-transformers' module folders, read for `models import`: their JSON files
(`read_json`), and the Dense modules that follow a model's pooling (EmbeddingGemma's two,
LaBSE's one), folded into the exported graph with the pooling as ONNX nodes answering
`sentence_embedding` (`head_of`, then `fold`), so that the embedding is every module of
`modules.json`'s, as sentence-transformers computes it. A Dense module's weights are read
from its model.safetensors here (float32, float16, bfloat16), or from pytorch_model.bin
through torch.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bucketserve.errors import ConfigError
from bucketserve.loading.served_file import save_with_external_weights

POOLED_OUTPUT = "sentence_embedding"  # pooled in the graph (by the export, or the fold)
# A Dense module's activation (its class, as config.json names it) -> the ONNX operator folded
# after its layer ("" for none); sentence-transformers' default, when none is named, is Tanh.
DENSE_ACTIVATIONS = {"Identity": "", "Tanh": "Tanh", "Sigmoid": "Sigmoid", "ReLU": "Relu"}
HEAD = "bucketserve_head"  # the prefix of what the fold adds to the graph


@dataclass(frozen=True)
class Dense:
    """A sentence-transformers Dense module, read: activation(x W' + b)."""

    path: str  # its folder, as modules.json names it (2_Dense)
    weight: np.ndarray  # [out, in]
    bias: np.ndarray | None  # [out]
    activation: str  # DENSE_ACTIVATIONS' operator


@dataclass(frozen=True)
class Head:
    """What import folds into the graph as its `sentence_embedding`: the per-token `source`
    pooled as `pooling` says (POOLING_MODES' names), then each Dense module in order."""

    source: str
    pooling: str
    dense: tuple[Dense, ...]


def read_json(path: Path, kind: type[dict[str, Any]] | type[list[Any]] = dict) -> Any:
    """The file's JSON (an object, or a list), or an empty one when there is no such file."""
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return kind()
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(content, kind):
        raise ConfigError(f"{path}: expected a JSON {'object' if kind is dict else 'list'}")
    return content


def head_of(
    folder: Path,
    source: str,
    pooling: str,
    pooling_config: dict[str, Any],
    inputs: list[str],
    paths: list[str],
    notes: list[str],
) -> Head | None:
    """The head to fold (`source` pooled, then the Dense modules at `paths`), or None with a
    note saying why it cannot be folded."""
    why = None
    if "attention_mask" not in inputs:
        why = "the graph takes no attention_mask, which the pooling reads"
    elif pooling_config.get("include_prompt") is False:
        why = "the pooling leaves the prompt's tokens out (include_prompt false)"
    layers = []
    for path in [] if why else paths:
        layer = _dense(folder / path, path)
        if isinstance(layer, str):
            why = layer
            break
        layers.append(layer)
    if why is None:
        widths = [(d.weight.shape[1], d.weight.shape[0]) for d in layers]
        if any(a[1] != b[0] for a, b in itertools.pairwise(widths)):
            why = f"the Dense modules' widths do not chain ({widths})"
    if why is not None:
        notes.append(f"no embedding: Dense modules after the pooling, not folded: {why}")
        return None
    return Head(source, pooling, tuple(layers))


def described(layer: Dense) -> str:
    """A Dense layer as the config's heading says it: `2_Dense 768 -> 3072 Tanh`."""
    out, width = layer.weight.shape
    return f"{layer.path} {width} -> {out}{' ' + layer.activation if layer.activation else ''}"


def _dense(module: Path, path: str) -> Dense | str:
    """The Dense module in `module` (its config.json and weights), or why it cannot be folded."""
    config = read_json(module / "config.json")
    if not config:
        return f"{path}/config.json is missing"
    activation = str(config.get("activation_function") or "Tanh").rsplit(".", 1)[-1]
    if activation not in DENSE_ACTIVATIONS:
        return f"{path}'s activation {activation} (folded: {', '.join(DENSE_ACTIVATIONS)})"
    if config.get("use_residual"):
        return f"{path} adds its input back (use_residual)"
    if config.get("module_input_name", POOLED_OUTPUT) != POOLED_OUTPUT:
        return f"{path} reads {config['module_input_name']}, not the pooled {POOLED_OUTPUT}"
    weights = _module_weights(module)
    if isinstance(weights, str):
        return f"{path}: {weights}"
    weight, bias = weights.get("linear.weight"), weights.get("linear.bias")
    shape = (config.get("out_features"), config.get("in_features"))
    if weight is None or weight.shape != shape:
        return f"{path}: no linear.weight of {shape[0]} x {shape[1]} in its weights"
    if config.get("bias", True) and (bias is None or bias.shape != shape[:1]):
        return f"{path}: no linear.bias of {shape[0]} in its weights"
    used_bias = bias if config.get("bias", True) else None
    return Dense(path, weight, used_bias, DENSE_ACTIVATIONS[activation])


SAFETENSORS = {"F64": np.float64, "F32": np.float32, "F16": np.float16}


def _module_weights(module: Path) -> dict[str, np.ndarray] | str:
    """A module folder's tensors as float32, from model.safetensors (read here: a JSON header,
    then the bytes) or pytorch_model.bin (through torch, of the export extra), or why not."""
    path = module / "model.safetensors"
    if path.is_file():
        raw = path.read_bytes()
        size = int.from_bytes(raw[:8], "little")
        try:
            header = json.loads(raw[8 : 8 + size])
            tensors = {}
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                start, end = (8 + size + offset for offset in info["data_offsets"])
                if info["dtype"] == "BF16":  # (the high half of a float32)
                    half = np.frombuffer(raw[start:end], "<u2").astype(np.uint32) << 16
                    array = half.view(np.float32)
                else:
                    array = np.frombuffer(raw[start:end], np.dtype(SAFETENSORS[info["dtype"]]))
                tensors[name] = array.reshape(info["shape"]).astype(np.float32)
        except (ValueError, KeyError, TypeError) as exc:
            return f"model.safetensors cannot be read ({type(exc).__name__}: {exc})"
        return tensors
    path = module / "pytorch_model.bin"
    if not path.is_file():
        return "no weights (model.safetensors or pytorch_model.bin)"
    try:
        import torch
    except ModuleNotFoundError:
        return "pytorch_model.bin is read with torch: pip install 'bucketserve[export]'"
    state = torch.load(path, map_location="cpu", weights_only=True)
    return {str(k): v.float().numpy() for k, v in state.items()}


def fold(source: Path, head: Head, target: Path) -> None:
    """`source`'s graph with `head` added as ONNX nodes (the pooling as sentence-transformers'
    Pooling computes it, then each Dense layer), answering `sentence_embedding` [batch, width]
    beside its own outputs; written to `target` with its weights beside it."""
    model = onnx.load(str(source))  # (with its external weights)
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:
        raise ConfigError(
            f"{source}: opset {opset}: Dense modules are folded into graphs of opset 13 on; "
            "export the model again at a later opset"
        )
    count = iter(range(10**6))

    def const(value: np.ndarray) -> str:
        name = f"{HEAD}/c{next(count)}"
        graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    def op(kind: str, *inputs: str, **attributes: Any) -> str:
        name = f"{HEAD}/{kind}{next(count)}"
        graph.node.append(helper.make_node(kind, list(inputs), [name], name=name, **attributes))
        return name

    def reduce(kind: str, x: str) -> str:  # over the time axis, dropped
        if kind == "ReduceSum" or opset >= 18:  # (axes an input: ReduceSum from 13, all at 18)
            return op(kind, x, const(np.array([1], np.int64)), keepdims=0)
        return op(kind, x, axes=[1], keepdims=0)

    states, mask = head.source, op("Cast", "attention_mask", to=TensorProto.FLOAT)
    mask3 = op("Unsqueeze", mask, const(np.array([2], np.int64)))  # [B, T, 1]
    if head.pooling in ("mean", "mean_sqrt_len"):
        total = reduce("ReduceSum", op("Mul", states, mask3))
        count_of = op("Max", reduce("ReduceSum", mask3), const(np.array(1e-9, np.float32)))
        pooled = op("Div", total, count_of if head.pooling == "mean" else op("Sqrt", count_of))
    elif head.pooling == "max":
        padding = op("Equal", mask3, const(np.array(0, np.float32)))
        lowest = const(np.array(-np.inf, np.float32))
        pooled = reduce("ReduceMax", op("Where", padding, lowest, states))
    else:  # cls: the first real token; last: the last (either padding side)
        at = op("ArgMax", mask, axis=1, keepdims=1, select_last_index=int(head.pooling == "last"))
        read_from = op("Mul", states, mask3) if head.pooling == "last" else states
        pooled = op("GatherND", read_from, at, batch_dims=1)
    for layer in head.dense:
        pooled = op("MatMul", pooled, const(np.ascontiguousarray(layer.weight.T)))
        if layer.bias is not None:
            pooled = op("Add", pooled, const(layer.bias))
        if layer.activation:
            pooled = op(layer.activation, pooled)
    graph.node.append(helper.make_node("Identity", [pooled], [POOLED_OUTPUT], name=f"{HEAD}/out"))
    ids = next(i for i in graph.input if i.name == "input_ids").type.tensor_type.shape.dim[0]
    rows = ids.dim_param or (ids.dim_value if ids.HasField("dim_value") else None)
    width = head.dense[-1].weight.shape[0]
    graph.output.append(
        helper.make_tensor_value_info(POOLED_OUTPUT, TensorProto.FLOAT, [rows, width])
    )
    save_with_external_weights(model, target)

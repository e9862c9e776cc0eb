"""What an ONNX graph declares: its inputs and outputs as written, and where its weights live.

Read once at load from the graph alone (weights are not loaded), and checked against the
config's names. Which axis is the batch and which is time is `axes`'s question.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from bucketserve.errors import ConfigError
from bucketserve.loading.config import ModelConfig

Dim = int | str | None  # a fixed size, a free dim's name, or None: a free dim without a name
LARGE_TENSOR = 1024  # bytes: weights at least this large are worth sharing between sessions


@dataclass(frozen=True)
class GraphTensor:
    name: str
    dtype: np.dtype
    dims: tuple[Dim, ...]


@dataclass(frozen=True)
class Signature:
    """The graph's inputs and outputs as declared, and where its weights are kept."""

    inputs: dict[str, GraphTensor]
    outputs: dict[str, GraphTensor]
    external_files: tuple[Path, ...]


def _tensor(value: onnx.ValueInfoProto) -> GraphTensor:
    ttype = value.type.tensor_type
    dims: list[Dim] = []
    for d in ttype.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or None)
    return GraphTensor(
        value.name, np.dtype(helper.tensor_dtype_to_np_dtype(ttype.elem_type)), tuple(dims)
    )


def _shaped(
    tensor: GraphTensor, shape: list[int], fail: Callable[[str, str], ConfigError]
) -> GraphTensor:
    """`tensor` with the config's `shape` over its declared dims: each size given fixes a free
    dim (or repeats a fixed one); -1 keeps the graph's."""
    field = f"inputs.{tensor.name}.shape"
    if len(shape) != len(tensor.dims):
        raise fail(field, f"{shape} has {len(shape)} dims, the graph's input {len(tensor.dims)}")
    dims: list[Dim] = []
    for axis, (given, declared) in enumerate(zip(shape, tensor.dims, strict=True)):
        if given != -1 and isinstance(declared, int) and declared != given:
            raise fail(field, f"dim {axis} is fixed at {declared} in the graph, not {given}")
        dims.append(declared if given == -1 else given)
    return dataclasses.replace(tensor, dims=tuple(dims))


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """The size of a tensor's data, whichever field holds it."""
    itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def read_signature(onnx_path: Path, config: ModelConfig) -> Signature:
    """Read the graph's signature and check its names agree with `config`; errors name the
    file, the field and the fix."""
    try:
        proto = onnx.load(str(onnx_path), load_external_data=False)
    except FileNotFoundError:
        raise ConfigError(f"{onnx_path}: file not found") from None
    except Exception as exc:  # onnx raises several types for a corrupt file
        raise ConfigError(f"{onnx_path}: not a readable ONNX model: {exc}") from None
    graph = proto.graph
    initializers = {t.name for t in graph.initializer}
    inputs = {v.name: _tensor(v) for v in graph.input if v.name not in initializers}
    outputs = {v.name: _tensor(v) for v in graph.output}
    fail = functools.partial(ConfigError.at, onnx_path)

    for name, cfg in config.inputs.items():
        if name not in inputs:
            raise fail(
                f"inputs.{name}",
                f"the graph has no such input (it has {sorted(inputs)}): rename the section",
            )
        if cfg.shape is not None:
            inputs[name] = _shaped(inputs[name], cfg.shape, fail)
    for name in inputs:
        if name not in config.inputs:
            raise fail(
                "inputs", f"graph input '{name}' has no role in config.toml: add [inputs.{name}]"
            )
    for name in config.outputs:
        if name not in outputs:
            raise fail(
                f"outputs.{name}",
                f"the graph has no such output (it has {sorted(outputs)}): rename the section",
            )

    files = sorted(
        {
            onnx_path.parent / entry.value
            for t in _tensors(proto)
            if t.data_location == onnx.TensorProto.EXTERNAL
            for entry in t.external_data
            if entry.key == "location"
        }
    )
    for f in files:
        if not f.is_file():
            raise fail("external data", f"weights file {f.name} is missing: copy it beside it")
    return Signature(inputs, outputs, tuple(files))


def _tensors(proto: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor the model stores: initializers (sparse ones too) and the tensors held by
    nodes' attributes (a Constant's value), in every subgraph and function; any of them may
    keep its data in an external file, which ONNX Runtime then reads."""
    graphs = [proto.graph]
    nodes = [node for function in proto.functions for node in function.node]
    while graphs or nodes:
        if graphs:
            graph = graphs.pop()
            yield from graph.initializer
            for sparse in graph.sparse_initializer:
                yield from (sparse.values, sparse.indices)
            nodes.extend(graph.node)
            continue
        for attribute in nodes.pop().attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("sparse_tensor"):
                yield from (attribute.sparse_tensor.values, attribute.sparse_tensor.indices)
            for sparse in attribute.sparse_tensors:
                yield from (sparse.values, sparse.indices)
            if attribute.HasField("g"):
                graphs.append(attribute.g)
            graphs.extend(attribute.graphs)

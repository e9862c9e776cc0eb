"""What an ONNX graph declares about its inputs and outputs, checked against a model's config.

Read once at start from the graph alone (weights are not loaded). The bucketing and runtime
layers take their shapes from here: which axis is the batch, which is time, which dims are fixed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from serve.errors import ConfigError
from serve.layout import InputRole
from serve.loading.config import ModelConfig

Dim = int | str  # a fixed size, or the name of a free (symbolic) dimension


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype
    dims: tuple[Dim, ...]


@dataclass(frozen=True)
class Signature:
    """The graph's tensors plus the names of its batch and time dimensions."""

    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    batch_dim: str
    time_dim: str
    external_files: tuple[Path, ...]

    def shape(self, tensor: TensorSpec, rows: int, length: int) -> tuple[int, ...]:
        """The concrete shape of `tensor` for a batch of `rows` sequences padded to `length`."""
        sizes = {self.batch_dim: rows, self.time_dim: length}
        return tuple(d if isinstance(d, int) else sizes[d] for d in tensor.dims)


def _tensor(value: onnx.ValueInfoProto) -> TensorSpec:
    ttype = value.type.tensor_type
    dims: list[Dim] = []
    for i, d in enumerate(ttype.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(f"{value.name}:{i}")  # anonymous free dim; never the batch or time dim
    return TensorSpec(
        value.name, np.dtype(helper.tensor_dtype_to_np_dtype(ttype.elem_type)), tuple(dims)
    )


def read_signature(onnx_path: Path, config: ModelConfig) -> Signature:
    """Read the graph's signature and check it agrees with `config`; errors name file and field."""
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

    def fail(field: str, message: str) -> ConfigError:
        return ConfigError(f"{onnx_path}: {field}: {message}")

    for name in config.inputs:
        if name not in inputs:
            raise fail(f"inputs.{name}", f"the graph has no such input (it has {sorted(inputs)})")
    for name in inputs:
        if name not in config.inputs:
            raise fail("inputs", f"graph input '{name}' has no role in config.toml")
    for name in config.outputs:
        if name not in outputs:
            raise fail(
                f"outputs.{name}", f"the graph has no such output (it has {sorted(outputs)})"
            )

    seq_name = config.sequence_input
    seq = inputs[seq_name]
    role = config.inputs[seq_name].role
    rank = 2 if role is InputRole.TOKENS else 3
    if len(seq.dims) != rank or any(isinstance(d, int) for d in seq.dims[:2]):
        raise fail(
            f"inputs.{seq_name}",
            f"a {role.value} input must have shape [batch, time"
            + (", dim]" if rank == 3 else "]")
            + f" with free batch and time dims; got {list(seq.dims)}",
        )
    if role is InputRole.FEATURES and not isinstance(seq.dims[2], int):
        raise fail(f"inputs.{seq_name}", "the feature dimension must be fixed")
    batch_dim, time_dim = str(seq.dims[0]), str(seq.dims[1])

    expected = {
        InputRole.MASK: (batch_dim, time_dim),
        InputRole.TOKEN_TYPES: (batch_dim, time_dim),
        InputRole.LENGTHS: (batch_dim,),
    }
    for name, spec in config.inputs.items():
        dims = inputs[name].dims
        if spec.role in expected and dims != expected[spec.role]:
            raise fail(
                f"inputs.{name}",
                f"a {spec.role.value} input must have dims "
                f"{list(expected[spec.role])}; got {list(dims)}",
            )
        if spec.role is InputRole.STATE and (
            dims.count(batch_dim) != 1 or any(isinstance(d, str) and d != batch_dim for d in dims)
        ):
            raise fail(
                f"inputs.{name}",
                f"a state input must have one '{batch_dim}' dim and "
                f"fixed sizes otherwise; got {list(dims)}",
            )

    for name, out in config.outputs.items():
        dims = outputs[name].dims
        lead = (batch_dim, time_dim) if out.per_step else (batch_dim,)
        if dims[: len(lead)] != lead or any(not isinstance(d, int) for d in dims[len(lead) :]):
            raise fail(
                f"outputs.{name}",
                f"expected dims {list(lead)} followed by fixed sizes "
                f"(per_step = {str(out.per_step).lower()}); got {list(dims)}",
            )

    files = sorted(
        {
            onnx_path.parent / entry.value
            for t in graph.initializer
            if t.data_location == onnx.TensorProto.EXTERNAL
            for entry in t.external_data
            if entry.key == "location"
        }
    )
    for f in files:
        if not f.is_file():
            raise fail("external data", f"weights file {f.name} is missing")
    return Signature(inputs, outputs, batch_dim, time_dim, tuple(files))

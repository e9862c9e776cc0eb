"""Batch-1 declarations freed: a copy of a model whose graph says it takes one sequence a run.

Exporters often write a batch of 1 into the declared shapes (a trace at batch 1, a tool that
fixes every dim it saw) while the graph computes each row on its own. Served as declared, such
a model runs one sequence at a time. So where the sequence input's batch is fixed at 1, the
server writes a copy (into its own cache; the repository is never written) whose inputs' batch
dims, and the outputs' leading dims declared 1, are free, and checks the copy: batched if the
check finds its rows apart and exact, the original one at a time otherwise (a Reshape to a
batch of 1 inside the graph shows there as a batch that fails, or moves).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import onnx

from bucketserve.errors import ConfigError
from bucketserve.loading.axes import resolve_axes
from bucketserve.loading.repository import ModelSpec
from bucketserve.loading.served_file import cached, content_key, save_with_external_weights
from bucketserve.loading.signature import read_signature

BATCH = "batch"  # the freed dims' name


def freed_spec(spec: ModelSpec, cache_dir: Path) -> ModelSpec:
    """The spec of the model's copy with its batch-1 declarations freed."""
    path = cached(spec, cache_dir, f"{content_key(spec)}-batch-free", _write_freed)
    signature = read_signature(path, spec.config)
    axes = resolve_axes(signature, spec.config, functools.partial(ConfigError.at, path))
    return dataclasses.replace(spec, onnx_path=path, signature=signature, axes=axes)


def _write_freed(spec: ModelSpec, onnx_path: Path) -> None:
    model = onnx.load(str(spec.onnx_path))
    graph = model.graph
    inputs = {value.name: value for value in graph.input}
    for name, axes in spec.axes.inputs.items():
        dim = inputs[name].type.tensor_type.shape.dim[axes.batch]
        if dim.HasField("dim_value") and dim.dim_value == 1:
            dim.dim_param = BATCH  # (the oneof: the fixed value is gone)
    for value in graph.output:
        dims = value.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value") and dims[0].dim_value == 1:
            dims[0].dim_param = BATCH
    del graph.value_info[:]  # (shapes inferred inside the graph at a batch of 1)
    save_with_external_weights(model, onnx_path)

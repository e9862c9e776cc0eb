"""From a spec, what the request path will read: the layout of every tensor (roles, dtypes,
batch and time axes; outputs whose axes the dim names leave open found by running the model
at two shapes) and the rules one valid sequence follows (vocabulary, reserved ids, features).
"""

from __future__ import annotations

import functools

from serve.core.layout import Input, InputRole, Layout, Tensor
from serve.core.model import SequenceRules
from serve.errors import ConfigError
from serve.loading.axes import Axes, probe_outputs, probe_shapes
from serve.loading.check import Run, random_sequences
from serve.loading.repository import ModelSpec
from serve.loading.signature import GraphTensor


def _tensor(graph: GraphTensor, axes: Axes) -> Tensor:
    fixed = tuple(None if i in axes.free() else d for i, d in enumerate(graph.dims))
    return Tensor(graph.name, graph.dtype, fixed, axes.batch, axes.time)  # type: ignore[arg-type]


def layout_of(spec: ModelSpec, run: Run | None = None) -> Layout:
    """The request path's view of the graph's tensors: roles, dtypes, batch and time axes.
    Outputs whose axes the graph's names leave open are found by running the model (`run`)."""
    sig, axes, config = spec.signature, spec.axes, spec.config
    inputs = tuple(
        Input(
            _tensor(sig.inputs[name], axes.inputs[name]),
            cfg.role,
            cfg.fill if cfg.role is InputRole.STATE else cfg.pad_value,
        )
        for name, cfg in config.inputs.items()
    )
    outputs = {
        name: _tensor(sig.outputs[name], found)
        for name, found in axes.outputs.items()
        if found is not None
    }
    if axes.unresolved:
        outputs |= _probe(spec, Layout(inputs, ()), run)
    return Layout(inputs, tuple(outputs[name] for name in config.outputs))


def _probe(spec: ModelSpec, inputs: Layout, run: Run | None) -> dict[str, Tensor]:
    """The open outputs' axes, from the model run at two shapes."""
    names = spec.axes.unresolved
    fail = functools.partial(ConfigError.at, spec.onnx_path)
    if run is None:
        raise fail(f"outputs.{names[0]}", "its axes are found by running the model")
    points = probe_shapes(spec.config.batching.longest)
    shapes = []
    for seed, (rows, length) in enumerate(points):
        sequences = random_sequences(sequence_rules(spec), [length] * rows, seed)
        try:
            outputs = run(inputs.collate(sequences, rows, length))
        except Exception as exc:  # ONNX Runtime raises its own types for a failed run
            raise fail(
                f"outputs.{names[0]}",
                f"running the model on {rows} sequences of length {length}, to find the axes "
                f"of {names}, failed ({exc}): name them in config.toml (batch_axis, time_axis)",
            ) from None
        shapes.append({name: outputs[name].shape for name in names})
    found = probe_outputs(names, points, (shapes[0], shapes[1]), spec.config, fail)
    sig = spec.signature
    return {
        name: Tensor(name, sig.outputs[name].dtype, fixed, axes.batch, axes.time)
        for name, (axes, fixed) in found.items()
    }


def sequence_rules(spec: ModelSpec) -> SequenceRules:
    """What a valid sequence is for this model, checked at the edge."""
    config = spec.config
    name = config.sequence_input
    cfg, tensor = config.inputs[name], spec.signature.inputs[name]
    free = spec.axes.inputs[name].free()
    features = [d for i, d in enumerate(tensor.dims) if i not in free]
    if cfg.role is InputRole.FEATURES:
        (feature_dim,) = features  # fixed: `axes` refuses any other free dim
        assert isinstance(feature_dim, int)
        return SequenceRules(tensor.dtype, config.batching.longest, feature_dim=feature_dim)
    return SequenceRules(
        tensor.dtype,
        config.batching.longest,
        vocab_size=cfg.vocab_size,
        reserved_ids=tuple(reserved_ids(spec)),
    )


def reserved_ids(spec: ModelSpec) -> list[int]:
    """Token ids refused inside a sequence: the config's, or by default the pad id when no mask
    or lengths input tells the model where padding is (then the pad id is how it knows)."""
    cfg = spec.config.inputs[spec.config.sequence_input]
    if cfg.reserved_ids is not None:
        return sorted(set(cfg.reserved_ids))
    told = {InputRole.MASK, InputRole.LENGTHS} & {i.role for i in spec.config.inputs.values()}
    return [] if told else [int(cfg.pad_value)]

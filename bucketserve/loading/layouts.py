"""From a spec, what the request path will read: the layout of every tensor (roles, dtypes,
batch and time axes, each output's steps; what the dim names leave open found by running the
model, `probe`) and the rules one valid sequence follows (vocabulary, reserved ids, the shape
of a step, the shortest length). The tasks' rules are built over it in `rules`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

from bucketserve.core.layout import Input, InputRole, Layout, Tensor
from bucketserve.core.model import SequenceRules
from bucketserve.errors import ConfigError
from bucketserve.loading.axes import Axes
from bucketserve.loading.check import Run
from bucketserve.loading.probe import probe
from bucketserve.loading.repository import ModelSpec
from bucketserve.loading.signature import GraphTensor
from bucketserve.runtime.sessions import GraphFile, run_all, side_session


def _tensor(graph: GraphTensor, axes: Axes) -> Tensor:
    fixed = tuple(None if i in axes.free() else d for i, d in enumerate(graph.dims))
    return Tensor(graph.name, graph.dtype, fixed, axes.batch, axes.time)  # type: ignore[arg-type]


def _constant(graph: GraphTensor, value: float) -> Input:
    """A constant input: its whole shape fixed in the graph (a scalar, a [1]), no batch or
    time axis, `value` everywhere."""
    if not all(isinstance(d, int) for d in graph.dims):
        raise ConfigError(
            f"inputs.{graph.name}: a constant input's dims are fixed; got {list(graph.dims)}"
        )
    tensor = Tensor(graph.name, graph.dtype, tuple(graph.dims), batch_axis=None)  # type: ignore[arg-type]
    return Input(tensor, InputRole.CONSTANT, value)


@dataclass(frozen=True)
class Served:
    """What the request path reads of a model, from its graph and from running it."""

    layout: Layout
    rules: SequenceRules
    single: str | None  # why it must run one sequence at a time, if it must (`probe`)


def input_layout(spec: ModelSpec) -> Layout:
    """The inputs' layout from the graph and the config alone (no output yet): what collates
    a batch before anything is known of what the model answers."""
    sig, axes, config = spec.signature, spec.axes, spec.config
    inputs = tuple(
        _constant(sig.inputs[name], cfg.value)
        if cfg.value is not None
        else Input(
            _tensor(sig.inputs[name], axes.inputs[name]),
            cfg.role,
            cfg.fill if cfg.role is InputRole.STATE else cfg.pad_value,
        )
        for name, cfg in config.inputs.items()
    )
    return Layout(inputs, ())


def layout_of(
    spec: ModelSpec,
    run: Run,
    longest: int | None = None,
    rows_at: Callable[[int], int] | None = None,
) -> Served:
    """The request path's view of the graph's tensors (roles, dtypes, batch and time axes,
    each output's steps) and the rules a sequence follows, from the graph and from running the
    model (`run`, a plain run of every output) at lengths up to `longest` (default: the
    longest bucket; less where a longer batch of one would not fit the memory budget), each
    length with at most `rows_at(length)` rows."""
    inputs = input_layout(spec)
    rules = sequence_rules(spec, longest)
    found = probe(spec, run, inputs, rules, rows_at)
    layout = Layout(inputs.inputs, tuple(found.outputs[name] for name in spec.config.outputs))
    rules = dataclasses.replace(rules, min_length=found.min_length, multiple=found.multiple)
    return Served(layout, rules, found.single)


def layout_alone(spec: ModelSpec) -> Served:
    """`layout_of`, running the model on a session of its own (benchmarks, tests)."""
    session = side_session(GraphFile(spec.onnx_path, tuple(spec.config.providers)))
    return layout_of(spec, functools.partial(run_all, session))


def sequence_rules(spec: ModelSpec, longest: int | None = None) -> SequenceRules:
    """What a valid sequence is for this model, checked at the edge (`longest`: at most
    that many steps, where less than the longest bucket)."""
    config = spec.config
    longest = longest or config.batching.longest
    name = config.sequence_input
    cfg, tensor = config.inputs[name], spec.signature.inputs[name]
    axes = spec.axes.inputs[name]
    if cfg.role is InputRole.FEATURES:
        step = tuple(int(d) for i, d in enumerate(tensor.dims) if i not in axes.free())  # type: ignore[arg-type]
        row = _tensor(tensor, axes)
        return SequenceRules(tensor.dtype, longest, step_shape=step, time_axis=row.row_time_axis)
    return SequenceRules(
        tensor.dtype,
        longest,
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

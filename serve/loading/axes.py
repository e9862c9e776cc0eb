"""Which axis of every input and output is the batch, and which is time.

Exporters name dims as they please: `batch` and `seq`, tf2onnx's generated `unk__1915`, a
different name on every tensor, or none at all. So, in order:

1. the config, when it names a tensor's axes (`batch_axis`, `time_axis`);
2. the sequence input is [batch, time] (tokens) or [batch, time, features]; the other inputs
   follow from their role, found by the sequence input's dim names where they share them;
3. an output whose free dims all carry the sequence input's batch and time names;
4. otherwise by what the model does: `probe_outputs` runs it at two shapes and sees which of
   each output's dims follow the rows and which the length.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from serve.core.layout import InputRole
from serve.errors import ConfigError
from serve.loading.config import ModelConfig
from serve.loading.signature import Dim, GraphTensor, Signature

Fail = Callable[[str, str], ConfigError]


@dataclass(frozen=True)
class Axes:
    batch: int
    time: int | None = None

    def free(self) -> tuple[int, ...]:
        return (self.batch,) if self.time is None else (self.batch, self.time)


@dataclass(frozen=True)
class ModelAxes:
    inputs: dict[str, Axes]
    outputs: dict[str, Axes | None]  # None: found by running the model (`probe_outputs`)
    batch_names: tuple[str, ...]  # dim names on the inputs' batch axes (static sessions fix them)
    time_names: tuple[str, ...]

    @property
    def unresolved(self) -> list[str]:
        return [name for name, axes in self.outputs.items() if axes is None]


def _shown(dims: Sequence[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _check(tensor: GraphTensor, axes: Axes, field: str, fail: Fail) -> Axes:
    """The axes lie inside the tensor, differ, and sit on free dims; every other dim is fixed."""
    rank = len(tensor.dims)
    if any(a >= rank for a in axes.free()) or axes.batch == axes.time:
        raise fail(field, f"axes {axes.free()} do not fit dims {_shown(tensor.dims)}")
    for axis in axes.free():
        if isinstance(tensor.dims[axis], int):
            raise fail(
                field,
                f"dim {axis} of {_shown(tensor.dims)} is fixed at {tensor.dims[axis]}, but it is "
                "the batch or time axis: export the model with dynamic batch and time axes",
            )
    for i, d in enumerate(tensor.dims):
        if i not in axes.free() and not isinstance(d, int):
            raise fail(
                field,
                f"dim {i} of {_shown(tensor.dims)} is free but neither the batch nor the time "
                "axis: fix its size in the graph, or name the axes (batch_axis, time_axis)",
            )
    return axes


def _by_name(dims: Sequence[Dim], name: str | None, default: int) -> int:
    return dims.index(name) if name is not None and name in dims else default


def _name(dim: Dim) -> str | None:
    return dim if isinstance(dim, str) else None


def resolve_axes(signature: Signature, config: ModelConfig, fail: Fail) -> ModelAxes:
    """Every input's axes, and every output's that the graph's names settle."""
    seq_name = config.sequence_input
    seq_axes = _sequence_axes(signature.inputs[seq_name], config, fail)
    assert seq_axes.time is not None
    seq_dims = signature.inputs[seq_name].dims
    batch_name, time_name = _name(seq_dims[seq_axes.batch]), _name(seq_dims[seq_axes.time])
    inputs = {seq_name: seq_axes}
    for name, cfg in config.inputs.items():
        if name != seq_name:
            inputs[name] = _input_axes(
                signature.inputs[name],
                cfg.role,
                cfg.batch_axis,
                cfg.time_axis,
                (batch_name, time_name),
                fail,
            )
    outputs = {
        name: _output_axes(signature.outputs[name], config, (batch_name, time_name), fail)
        for name in config.outputs
    }

    def names(axis: Callable[[Axes], int | None]) -> tuple[str, ...]:
        found: list[str] = []
        for name, axes in inputs.items():
            i = axis(axes)
            d = None if i is None else _name(signature.inputs[name].dims[i])
            if d is not None and d not in found:
                found.append(d)
        return tuple(found)

    return ModelAxes(inputs, outputs, names(lambda a: a.batch), names(lambda a: a.time))


def _sequence_axes(seq: GraphTensor, config: ModelConfig, fail: Fail) -> Axes:
    """[batch, time] for tokens, [batch, time, features] for features, unless the config says."""
    cfg = config.inputs[seq.name]
    rank = 2 if cfg.role is InputRole.TOKENS else 3
    field = f"inputs.{seq.name}"
    if len(seq.dims) != rank:
        shape = "[batch, time]" if rank == 2 else "[batch, time, features]"
        raise fail(field, f"a {cfg.role.value} input has {shape}; got {_shown(seq.dims)}")
    batch = cfg.batch_axis if cfg.batch_axis is not None else 0
    time = cfg.time_axis if cfg.time_axis is not None else 1
    return _check(seq, Axes(batch, time), field, fail)


def _input_axes(
    tensor: GraphTensor,
    role: InputRole,
    batch_axis: int | None,
    time_axis: int | None,
    names: tuple[str | None, str | None],
    fail: Fail,
) -> Axes:
    """A mask, token types, lengths or state input: by the config, by the sequence input's
    dim names, or by the role's usual shape."""
    field, dims = f"inputs.{tensor.name}", tensor.dims
    batch_name, time_name = names
    if role is InputRole.STATE:
        free = [i for i, d in enumerate(dims) if not isinstance(d, int)]
        batch = batch_axis
        if batch is None:
            batch = _by_name(dims, batch_name, free[0] if len(free) == 1 else -1)
        if batch < 0:
            raise fail(field, f"which dim of {_shown(dims)} is the batch? set batch_axis")
        return _check(tensor, Axes(batch), field, fail)
    if role not in (InputRole.MASK, InputRole.TOKEN_TYPES, InputRole.LENGTHS):
        raise fail(field, f"role {role.value!r}: only one input carries the sequence")
    timed = role is not InputRole.LENGTHS
    if len(dims) != (2 if timed else 1):
        shape = "[batch, time]" if timed else "[batch]"
        raise fail(field, f"a {role.value} input has {shape}; got {_shown(dims)}")
    batch = _by_name(dims, batch_name, 0) if batch_axis is None else batch_axis
    time = _by_name(dims, time_name, 1) if time_axis is None else time_axis
    return _check(tensor, Axes(batch, time if timed else None), field, fail)


def _output_axes(
    tensor: GraphTensor, config: ModelConfig, names: tuple[str | None, str | None], fail: Fail
) -> Axes | None:
    """An output's axes from the config, or from dim names it shares with the sequence input;
    None when neither settles them (then the model is run to find them)."""
    cfg, field, dims = config.outputs[tensor.name], f"outputs.{tensor.name}", tensor.dims
    batch_name, time_name = names
    axes = None
    if cfg.batch_axis is not None:
        axes = _check(tensor, Axes(cfg.batch_axis, cfg.time_axis), field, fail)
    elif (
        batch_name is not None
        and dims.count(batch_name) == 1
        and all(isinstance(d, int) or (d is not None and d in names) for d in dims)
        and dims.count(time_name) <= 1
    ):
        time = dims.index(time_name) if time_name is not None and time_name in dims else None
        axes = Axes(dims.index(batch_name), time)
    if axes is not None:
        check_per_step(tensor.name, cfg.per_step, axes, dims, fail)
    return axes


def check_per_step(
    name: str, per_step: bool | None, axes: Axes, dims: Sequence[Dim | int], fail: Fail
) -> None:
    """A config's `per_step` must agree with the output's axes as found."""
    if per_step is None or per_step == (axes.time is not None):
        return
    if per_step:
        message = f"per_step = true, but {_shown(dims)} has no time axis: set per_step = false"
    else:
        message = (
            f"per_step = false, but dim {axes.time} of {_shown(dims)} follows the sequence "
            "length: set per_step = true (or leave it out)"
        )
    raise fail(f"outputs.{name}", message)


def probe_shapes(max_length: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Two (rows, length) points at which every size differs: rows from lengths, and each
    from itself between the two points (when the longest bucket allows)."""
    lengths = (5, 7) if max_length >= 7 else (max(1, max_length - 1), max_length)
    rows = (2, 3) if not {2, 3} & set(lengths) else (8, 9)
    return (rows[0], lengths[0]), (rows[1], lengths[1])


def probe_outputs(
    names: Sequence[str],
    points: tuple[tuple[int, int], tuple[int, int]],
    shapes: tuple[Mapping[str, tuple[int, ...]], Mapping[str, tuple[int, ...]]],
    config: ModelConfig,
    fail: Fail,
) -> dict[str, tuple[Axes, tuple[int | None, ...]]]:
    """Axes and fixed sizes of the outputs `names`, from their shapes at the two points."""
    found = {}
    (rows_a, len_a), (rows_b, len_b) = points
    for name in names:
        a, b = shapes[0][name], shapes[1][name]
        field = f"outputs.{name}"
        batch = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if (x, y) == (rows_a, rows_b)]
        time = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if (x, y) == (len_a, len_b)]
        other = [
            i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y and i not in batch + time
        ]
        if len(batch) != 1 or len(time) > 1 or other:
            raise fail(
                field,
                f"its shape is {list(a)} for {rows_a} sequences of length {len_a} and {list(b)} "
                f"for {rows_b} of length {len_b}: bucketserve serves outputs with one batch "
                "axis, at most one time axis, and fixed sizes otherwise",
            )
        axes = Axes(batch[0], time[0] if time else None)
        check_per_step(name, config.outputs[name].per_step, axes, a, fail)
        found[name] = (axes, tuple(None if i in axes.free() else a[i] for i in range(len(a))))
    return found

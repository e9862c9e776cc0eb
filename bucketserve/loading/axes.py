"""Which axis of every input and output is the batch, and which is time.

Exporters name dims as they please: `batch` and `seq`, tf2onnx's generated `unk__1915`, a
different name on every tensor, or none at all. So, in order:

1. the config, when it names a tensor's axes (`batch_axis`, `time_axis`);
2. the sequence input's two free dims, batch first ([batch, time] tokens, [batch, samples],
   [batch, time, 80] frames, [batch, 3, 32, width] image lines), or a batch fixed at 1 (an
   export that takes one sequence a run); the other inputs follow from their role, found by
   the sequence input's dim names where they share them;
3. an output whose free dims all carry the sequence input's batch and time names (its time
   axis is then the input's, step for step);
4. otherwise by what the model does (`bucketserve.loading.probe`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bucketserve.core.layout import InputRole
from bucketserve.errors import ConfigError
from bucketserve.loading.config import ModelConfig
from bucketserve.loading.signature import Dim, GraphTensor, Signature

Fail = Callable[[str, str], ConfigError]


@dataclass(frozen=True)
class Axes:
    batch: int | None  # None: a sequence input without one (an export that takes one sequence)
    time: int | None = None

    def free(self) -> tuple[int, ...]:
        return tuple(a for a in (self.batch, self.time) if a is not None)


@dataclass(frozen=True)
class ModelAxes:
    inputs: dict[str, Axes]
    outputs: dict[
        str, Axes | None
    ]  # None: found by running the model (`bucketserve.loading.probe`)
    batch_names: tuple[str, ...]  # dim names on the inputs' batch axes (static sessions fix them)
    time_names: tuple[str, ...]
    batch_fixed: bool = False  # the sequence input's batch is fixed at 1: one sequence a run
    by_name: frozenset[str] = frozenset()  # outputs whose time axis is the input's, by its name
    unbatched: bool = False  # the sequence input has no batch axis at all: one sequence a run

    @property
    def unresolved(self) -> list[str]:
        return [name for name, axes in self.outputs.items() if axes is None]


def _shown(dims: Sequence[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _check(
    tensor: GraphTensor, axes: Axes, field: str, fail: Fail, batch_fixed: bool = False
) -> Axes:
    """The axes lie inside the tensor, differ, and sit on free dims (a batch fixed at 1 too,
    in a batch-1 export); every other dim is fixed."""
    rank = len(tensor.dims)
    if any(a >= rank for a in axes.free()) or axes.batch == axes.time:
        raise fail(field, f"axes {axes.free()} do not fit dims {_shown(tensor.dims)}")
    for axis in axes.free():
        size = tensor.dims[axis]
        if axis == axes.batch and batch_fixed and size == 1:
            continue
        if axis == axes.time and isinstance(size, int):
            raise fail(
                field,
                f"dim {axis} of {_shown(tensor.dims)} is the time axis but fixed at {size}: "
                f"the model was exported at one length ({size} steps) and takes no other; "
                "export it with a dynamic time axis (or name the axes: batch_axis, time_axis)",
            )
        if isinstance(size, int):
            raise fail(
                field,
                f"dim {axis} of {_shown(tensor.dims)} is fixed at {size}, but it is the batch "
                "axis: export the model with a dynamic batch axis (or a batch of 1, served one "
                "sequence a run), or name the axes (batch_axis, time_axis)",
            )
    for i, d in enumerate(tensor.dims):
        if i not in axes.free() and not isinstance(d, int):
            raise fail(
                field,
                f"dim {i} of {_shown(tensor.dims)} is free but neither the batch nor the time "
                "axis: give its size with shape (-1 on the batch and time axes), or name the "
                "axes (batch_axis, time_axis)",
            )
    return axes


def _by_name(dims: Sequence[Dim], name: str | None, default: int) -> int:
    return dims.index(name) if name is not None and name in dims else default


def _name(dim: Dim) -> str | None:
    return dim if isinstance(dim, str) else None


def resolve_axes(signature: Signature, config: ModelConfig, fail: Fail) -> ModelAxes:
    """Every input's axes, and every output's that the graph's names settle."""
    seq_name = config.sequence_input
    seq_axes, batch_fixed = _sequence_axes(signature.inputs[seq_name], config, fail)
    assert seq_axes.time is not None
    seq_dims = signature.inputs[seq_name].dims
    unbatched = seq_axes.batch is None
    batch_name = None if unbatched else _name(seq_dims[seq_axes.batch])  # type: ignore[index]
    time_name = _name(seq_dims[seq_axes.time])
    inputs = {seq_name: seq_axes}
    for name, cfg in config.inputs.items():
        if name != seq_name and cfg.role is not InputRole.CONSTANT:  # (a constant has none)
            if unbatched:
                raise fail(
                    f"inputs.{name}",
                    f"{seq_name} has no batch axis, so the model takes a sequence alone: its "
                    'other inputs can only be constants (role = "constant", with a value)',
                )
            inputs[name] = _input_axes(
                signature.inputs[name],
                cfg.role,
                cfg.batch_axis,
                cfg.time_axis,
                (batch_name, time_name),
                fail,
                batch_fixed,
            )
    outputs = {
        name: _output_axes(signature.outputs[name], config, (batch_name, time_name), fail)
        for name in config.outputs
    }
    by_name = frozenset(
        name
        for name, axes in outputs.items()
        if axes is not None and config.outputs[name].batch_axis is None
    )

    def names(axis: Callable[[Axes], int | None]) -> tuple[str, ...]:
        found: list[str] = []
        for name, axes in inputs.items():
            i = axis(axes)
            d = None if i is None else _name(signature.inputs[name].dims[i])
            if d is not None and d not in found:
                found.append(d)
        return tuple(found)

    return ModelAxes(
        inputs,
        outputs,
        names(lambda a: a.batch),
        names(lambda a: a.time),
        batch_fixed,
        by_name,
        unbatched,
    )


def _sequence_axes(seq: GraphTensor, config: ModelConfig, fail: Fail) -> tuple[Axes, bool]:
    """The sequence input's axes (the config's, else its two free dims, batch first, or a
    first dim fixed at 1 and one free dim, or a features input's one free dim and no batch
    axis at all: `[T, 576]` frames), and whether it runs one sequence at a time."""
    cfg, dims = config.inputs[seq.name], seq.dims
    field = f"inputs.{seq.name}"
    free = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    lone = len(free) == 1 and not (free[0] != 0 and dims[0] == 1)  # not [1, time]: no batch
    if lone and cfg.batch_axis is None and cfg.role is InputRole.FEATURES:
        time = cfg.time_axis if cfg.time_axis is not None else free[0]
        return _check(seq, Axes(None, time), field, fail), True
    if cfg.role is InputRole.TOKENS and len(dims) != 2:
        raise fail(field, f"a tokens input has [batch, time]; got {_shown(dims)}")
    if len(dims) < 2:
        raise fail(
            field,
            "a features input has a batch and a time axis ([batch, samples], [batch, time, "
            f"features], [batch, channels, height, width]...); got {_shown(dims)}",
        )
    if len(free) > 2 and cfg.time_axis is None:
        raise fail(
            field,
            f"{_shown(dims)} has {len(free)} free dims ({', '.join(map(str, free))}): which is "
            "time? set time_axis, and give every other free dim but the batch its size with "
            f"shape (e.g. {_example(dims, free)})",
        )
    guess = (0, 1)
    if len(free) == 2:
        guess = (free[0], free[1])
    elif len(free) == 1 and free[0] != 0 and dims[0] == 1:
        guess = (0, free[0])
    batch = cfg.batch_axis if cfg.batch_axis is not None else guess[0]
    time = cfg.time_axis if cfg.time_axis is not None else guess[1]
    batch_fixed = batch < len(dims) and dims[batch] == 1
    return _check(seq, Axes(batch, time), field, fail, batch_fixed), batch_fixed


def _example(dims: Sequence[Dim], free: list[int]) -> str:
    """A `shape` for `dims` that keeps the first and last free dims, and fixes the others."""
    keep = {free[0], free[-1]}
    sizes = [-1 if i in keep else (d if isinstance(d, int) else 32) for i, d in enumerate(dims)]
    return f"shape = {sizes}"


def _input_axes(
    tensor: GraphTensor,
    role: InputRole,
    batch_axis: int | None,
    time_axis: int | None,
    names: tuple[str | None, str | None],
    fail: Fail,
    batch_fixed: bool,
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
        return _check(tensor, Axes(batch), field, fail, batch_fixed)
    untimed = (InputRole.LENGTHS, InputRole.ROW_LENGTHS)
    if role not in (InputRole.MASK, InputRole.TOKEN_TYPES, *untimed):
        raise fail(field, f"role {role.value!r}: only one input carries the sequence")
    timed = role not in untimed
    if len(dims) != (2 if timed else 1):
        shape = "[batch, time]" if timed else "[batch]"
        raise fail(field, f"a {role.value} input has {shape}; got {_shown(dims)}")
    batch = _by_name(dims, batch_name, 0) if batch_axis is None else batch_axis
    time = _by_name(dims, time_name, 1) if time_axis is None else time_axis
    return _check(tensor, Axes(batch, time if timed else None), field, fail, batch_fixed)


def _output_axes(
    tensor: GraphTensor, config: ModelConfig, names: tuple[str | None, str | None], fail: Fail
) -> Axes | None:
    """An output's axes from the config, or from dim names it shares with the sequence input;
    None when neither settles them (then the model is run to find them)."""
    cfg, field, dims = config.outputs[tensor.name], f"outputs.{tensor.name}", tensor.dims
    batch_name, time_name = names
    axes = None
    if cfg.batch_axis is not None:
        # (an output may declare a batch of 1 and still follow the rows: the probe measures)
        axes = _check(tensor, Axes(cfg.batch_axis, cfg.time_axis), field, fail, True)
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

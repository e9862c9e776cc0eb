"""The KServe v2 inference path that both of its protocols share (HTTP in
`serve.edges.http.kserve_routes`, gRPC in `serve.edges.grpc`): each decodes its bytes into a
`V2Request` of `WireTensor`s, and `infer` does the rest, the same way for both: the tensors
checked (datatype, shape, count, values) and turned into a model's sequences, one call to the
core, and the answers stacked back into output tensors.

The rows of a `[n, T]` (or `[n, T, F]`, in the model's own axes) sequence tensor are n
sequences, each cut to its own length; per-step outputs go back as `[n, T, ...]` with zeros
past each row's length. Each row's length comes from, in order: the model's mask or lengths
input when the request sends it; a `sequence_lengths` input `[n]` (integers) for a model that
has neither; for a token model whose pad id is reserved (its mask, when it has no mask input),
the first pad id in the row; otherwise T.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from serve.core.calls import OFF_LOOP_BYTES, Answer, Call
from serve.core.engine import Engine
from serve.core.layout import Input, InputRole, Tensor
from serve.core.model import Model
from serve.errors import InvalidInput, MalformedRequest

LENGTHS_INPUT = "sequence_lengths"  # each row's length, for models without a mask or lengths
DATATYPES: dict[str, np.dtype] = {
    name: np.dtype(t)
    for name, t in {
        "BOOL": np.bool_,
        "UINT8": np.uint8,
        "UINT16": np.uint16,
        "UINT32": np.uint32,
        "UINT64": np.uint64,
        "INT8": np.int8,
        "INT16": np.int16,
        "INT32": np.int32,
        "INT64": np.int64,
        "FP16": np.float16,
        "FP32": np.float32,
        "FP64": np.float64,
    }.items()
}
DATATYPE_OF = {dtype: name for name, dtype in DATATYPES.items()}
CLIENT_INPUTS = (  # what a client sends; states and the like are the server's to fill
    InputRole.TOKENS,
    InputRole.FEATURES,
    InputRole.MASK,
    InputRole.LENGTHS,
    InputRole.TOKEN_TYPES,
)


@dataclass(frozen=True)
class WireTensor:
    """One input tensor as a protocol carried it, not yet checked: its bytes (little-endian,
    row-major) or its values (JSON `data`, gRPC's typed contents)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes | memoryview | None = None
    values: Any = None

    @property
    def wire_bytes(self) -> int:
        return len(self.raw) if self.raw is not None else 8 * math.prod(self.shape)


@dataclass(frozen=True)
class V2Request:
    """A KServe v2 inference request, decoded from either protocol."""

    model: str
    version: str | None
    inputs: tuple[WireTensor, ...]
    outputs: tuple[str, ...] | None = None  # None: all of them
    id: str | None = None
    timeout_ms: float | None = None  # Triton's `timeout` parameter, in ms


def fitted(values: np.ndarray, dtype: np.dtype, name: str, datatype: str) -> np.ndarray:
    """Values sent as numbers (JSON, gRPC's typed contents) converted to `dtype`, or
    InvalidInput when one would change on the way: an integer out of range (INT8 300 would
    wrap to 44), a float that overflows to infinity."""
    if values.size == 0:
        return values.astype(dtype)
    kinds = "b" if dtype.kind == "b" else ("iu" if dtype.kind in "iu" else "iuf")
    if values.dtype.kind not in kinds:
        raise InvalidInput(f"input {name}: values do not fit datatype {datatype}")
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise InvalidInput(
                f"input {name}: values must lie in [{info.min}, {info.max}] for {datatype}"
            )
    with np.errstate(over="ignore"):  # an overflow shows as infinity, refused just below
        converted = values.astype(dtype)
    if dtype.kind == "f" and not np.isfinite(converted).all():
        raise InvalidInput(f"input {name}: values must be finite {datatype} numbers")
    return converted


def tensor_array(wire: WireTensor) -> np.ndarray:
    """The tensor as an array, every check made once for both protocols: a datatype we take,
    a shape without negative sizes, as many bytes or values as the shape holds, values that
    fit the datatype."""
    name, datatype, shape = wire.name, wire.datatype, list(wire.shape)
    if datatype not in DATATYPES:
        raise InvalidInput(
            f"input {name}: datatype {datatype!r} is not supported (use one of {sorted(DATATYPES)})"
        )
    if any(d < 0 for d in shape):
        raise MalformedRequest(f"input {name}: shape {shape} has a negative dimension")
    dtype, count = DATATYPES[datatype], math.prod(shape)
    if wire.raw is not None:
        if len(wire.raw) != count * dtype.itemsize:
            raise MalformedRequest(
                f"input {name}: {len(wire.raw)} raw bytes for shape {shape} of {datatype} "
                f"({count * dtype.itemsize} bytes)"
            )
        return np.frombuffer(wire.raw, dtype.newbyteorder("<")).reshape(shape)
    if wire.values is None:
        raise MalformedRequest(f"input {name}: no values")
    try:
        values = np.asarray(wire.values)
    except (ValueError, TypeError):
        raise MalformedRequest(f"input {name}: 'data' is not a rectangular array") from None
    if values.size != count:
        raise MalformedRequest(f"input {name}: {values.size} values for shape {shape}")
    return fitted(values, dtype, name, datatype).reshape(shape)


def _integers(given: np.ndarray, name: str, rows: int) -> np.ndarray:
    if given.shape != (rows,):
        raise InvalidInput(f"input {name}: expected shape [{rows}], got {list(given.shape)}")
    if given.dtype.kind not in "iu":
        raise InvalidInput(f"input {name}: lengths are integers (INT32 or INT64)")
    return given.astype(np.int64)


def _from_mask(inp: Input, given: np.ndarray, rows: int, steps: int) -> np.ndarray:
    name, expected = inp.tensor.name, inp.tensor.shape(rows, steps)
    if given.shape != expected:
        raise InvalidInput(
            f"input {name}: expected shape {list(expected)}, got {list(given.shape)}"
        )
    given = inp.tensor.to_batch_major(given)
    if not np.isin(given, (0, 1)).all():
        raise InvalidInput(f"input {name}: a mask holds 1 (a real step) or 0 (padding) only")
    lengths: np.ndarray = (given != 0).sum(axis=1)
    if not (given.astype(bool) == (np.arange(steps) < lengths[:, None])).all():
        raise InvalidInput(f"input {name}: each row must be ones followed by zeros")
    return lengths


def _from_pad_id(tensor: np.ndarray, pad: int) -> np.ndarray:
    """Each row runs up to its first pad id, which may only be followed by more of it."""
    is_pad = tensor == pad
    steps = tensor.shape[1]
    lengths: np.ndarray = np.where(is_pad.any(axis=1), is_pad.argmax(axis=1), steps)
    mixed = np.flatnonzero((is_pad != (np.arange(steps) >= lengths[:, None])).any(axis=1))
    if mixed.size:
        raise InvalidInput(
            f"row {mixed[0]}: the pad id {pad} marks where a row ends, so only more of it may "
            f"follow it (or send {LENGTHS_INPUT})"
        )
    return lengths


def row_lengths(model: Model, inputs: dict[str, np.ndarray], tensor: np.ndarray) -> np.ndarray:
    """Each row of `tensor` (batch-major) its length, by the rules in the module docstring."""
    rows, steps = tensor.shape[:2]
    layout, rules = model.info.layout, model.info.rules
    told = [i for i in layout.inputs if i.role in (InputRole.MASK, InputRole.LENGTHS)]
    if LENGTHS_INPUT in inputs and all(i.tensor.name != LENGTHS_INPUT for i in told):
        if told:
            raise InvalidInput(
                f"model {model.name} takes each row's length from its input "
                f"{told[0].tensor.name}: send that, not {LENGTHS_INPUT}"
            )
        return _integers(inputs[LENGTHS_INPUT], LENGTHS_INPUT, rows)
    for inp in told:
        if inp.tensor.name in inputs:
            given = inputs[inp.tensor.name]
            if inp.role is InputRole.LENGTHS:
                return _integers(given, inp.tensor.name, rows)
            return _from_mask(inp, given, rows, steps)
    pad = int(layout.sequence.fill)
    if not told and rules.vocab_size is not None and pad in rules.reserved_ids:
        return _from_pad_id(tensor, pad)
    return np.full(rows, steps, np.int64)


@dataclass(frozen=True)
class TensorInputs:
    """A v2 request's input tensors: the core's `Inputs`, each row of the sequence tensor a
    sequence."""

    tensors: tuple[WireTensor, ...]
    _by_name: dict[str, WireTensor] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, WireTensor] = {}
        for wire in self.tensors:
            if wire.name in by_name:
                raise MalformedRequest(f"input {wire.name} given twice")
            by_name[wire.name] = wire
        object.__setattr__(self, "_by_name", by_name)

    def count(self, model: Model) -> int:
        """The rows of the sequence tensor, read from its declared shape (0 where the shape
        is not one the model takes: decoding then says why)."""
        return self._declared(model.info.layout.sequence.tensor, 0)

    def steps(self, model: Model) -> int:
        """T: the time steps the rows were sent at, which per-step outputs are padded back to."""
        return self._declared(model.info.layout.sequence.tensor, 1)

    def _declared(self, tensor: Tensor, axis: int) -> int:
        wire = self._by_name.get(tensor.name)
        if wire is None or len(wire.shape) != len(tensor.dims):
            return 0
        return wire.shape[tensor.batch_axis if axis == 0 else (tensor.time_axis or 0)]

    @property
    def heavy(self) -> bool:
        return sum(wire.wire_bytes for wire in self.tensors) >= OFF_LOOP_BYTES

    def sequences(self, model: Model) -> list[np.ndarray]:
        roles = {i.tensor.name: i.role for i in model.info.layout.inputs}
        inputs: dict[str, np.ndarray] = {}
        for wire in self.tensors:
            inputs[wire.name] = tensor_array(wire)
        for name in inputs:
            if name not in roles and name != LENGTHS_INPUT:
                raise InvalidInput(f"model {model.name} has no input {name}")
            if roles.get(name) is InputRole.STATE:
                raise InvalidInput(f"input {name} is a state the server fills; do not send it")
            if roles.get(name) is InputRole.TOKEN_TYPES and inputs[name].any():
                raise InvalidInput(f"input {name}: only token type 0 is supported")
        sequence = model.info.layout.sequence
        name = sequence.tensor.name
        if name not in inputs:
            raise InvalidInput(f"missing input {name}")
        rank = len(sequence.tensor.dims)
        if inputs[name].ndim != rank:
            raise InvalidInput(
                f"input {name}: expected rank {rank}, got shape {list(inputs[name].shape)}"
            )
        tensor = sequence.tensor.to_batch_major(inputs[name])
        rows, steps = tensor.shape[:2]
        if rows == 0 or steps == 0:
            raise InvalidInput(f"input {name}: empty")
        lengths = row_lengths(model, inputs, tensor)
        if lengths.min() < 1 or lengths.max() > steps:
            raise InvalidInput(f"row lengths must lie in 1..{steps}")
        return [model.validate(tensor[i, : lengths[i]], i) for i in range(rows)]


def output_tensors(answer: Answer, steps: int) -> dict[str, np.ndarray]:
    """Per-sequence outputs back into tensors in the model's own axes; per-step ones
    zero-padded to the T the request was sent at."""
    model, answers = answer.model, answer.outputs
    tensors = {}
    for name in answers[0]:
        parts = [a[name] for a in answers]
        tensor = model.info.layout.output(name)
        if tensor.per_step:
            out = np.zeros((len(parts), steps, *parts[0].shape[1:]), parts[0].dtype)
            for row, part in enumerate(parts):
                out[row, : len(part)] = part
        else:
            out = np.stack(parts)
        tensors[name] = tensor.to_model_axes(out)
    return tensors


async def infer(
    engine: Engine, request: V2Request, request_id: str, timeouts_ms: Sequence[float | None] = ()
) -> tuple[Answer, dict[str, np.ndarray]]:
    """One v2 request through the core: its answer, and its outputs as tensors. The deadline
    is the soonest of Triton's `timeout` and the protocol's own (`timeouts_ms`)."""
    given = [t for t in (request.timeout_ms, *timeouts_ms) if t is not None]
    inputs = TensorInputs(request.inputs)
    call = Call(
        inputs,
        request.model,
        request.version or None,
        request.outputs,
        min(given, default=None),
        request_id,
    )
    answer = await engine.infer(call)
    return answer, output_tensors(answer, inputs.steps(answer.model))


def described(tensor: Tensor) -> dict[str, Any]:
    """A tensor as v2 metadata shows it: name, datatype, shape with -1 for a free dim."""
    return {
        "name": tensor.name,
        "datatype": DATATYPE_OF[tensor.dtype],
        "shape": [-1 if d is None else d for d in tensor.dims],
    }


def metadata(model: Model) -> dict[str, Any]:
    """The model's v2 metadata: the inputs a client sends and the outputs it gets."""
    layout = model.info.layout
    return {
        "name": model.name,
        "versions": [str(model.info.version)],
        "platform": "onnxruntime_onnx",
        "inputs": [described(i.tensor) for i in layout.inputs if i.role in CLIENT_INPUTS],
        "outputs": [described(o) for o in layout.outputs],
    }

"""The KServe v2 inference path that both of its protocols share (HTTP in
`bucketserve.edges.http.kserve_routes`, gRPC in `bucketserve.edges.grpc`): each decodes its
bytes into a `V2Request` of `WireTensor`s, and `infer` does the rest, the same way for both:
the tensors checked (datatype, shape, count, values) and turned into a model's sequences, one
call to the core, and the answers stacked back into output tensors.

The rows of a `[n, T]` (or `[n, T, F]`, `[n, 3, 32, W]`: in the model's own axes) sequence
tensor are n sequences, each cut to its own length; per-step outputs go back in their own axes
with the steps of T (`[n, ceil(T / 4), V]` for a CTC head over subsampled frames), zeros past
each row's own. Each row's length comes from, in order: the model's mask or lengths
input when the request sends it; a `sequence_lengths` input `[n]` (integers) for a model that
has neither; for a token model whose pad id is reserved (its mask, when it has no mask input),
the first pad id in the row; otherwise T.

A model with a tokenizer also takes a BYTES input `text` ([n] or [n, 1]; a classifier also
[n, 2], n text pairs such as (query, document) for a cross-encoder) in place of its token
inputs: n texts, tokenised and checked as /predict's `text`; per-step outputs then come back
padded to the longest of them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bucketserve.core.calls import OFF_LOOP_BYTES, Answer, Call, TextPairs, Texts
from bucketserve.core.engine import Engine
from bucketserve.core.layout import FILLED, Input, InputRole, Tensor
from bucketserve.core.model import TRUNCATE, Model, Truncation
from bucketserve.core.task import Task
from bucketserve.edges.tensors import (
    DATATYPE_OF,
    TEXT,
    TEXT_INPUT,
    WireTensor,
    tensor_array,
    tensor_texts,
)
from bucketserve.errors import InvalidInput, MalformedRequest, quoted

LENGTHS_INPUT = "sequence_lengths"  # each row's length, for models without a mask or lengths
# For a model with a tokenizer: texts instead of its token inputs, tokenised as /predict's are.
TEXT_METADATA = {"name": TEXT_INPUT, "datatype": TEXT, "shape": [-1]}


class Unsigned(int):
    """An integer a protocol sent as unsigned (gRPC's `uint64_param`, which `tritonclient`
    sends `priority` as): not an int64, so not a `timeout`."""


# Triton's request parameters, with the types it reads them as: `timeout` in microseconds (an
# int64; 0, its default: none of the request's own), `priority` (its level, 1 first; 0, its
# default: the server's default), `binary_data_output` (HTTP: outputs as binary unless named
# otherwise); and for `text`, as every text route takes them, `truncate` (default true) and
# `truncation_direction` (right or left).
PARAMETERS: dict[str, tuple[type, ...]] = {
    "timeout": (int,),
    "priority": (int, Unsigned),
    "binary_data_output": (bool,),
    "truncate": (bool,),
    "truncation_direction": (str,),
}
DIRECTIONS = ("right", "left")
CLIENT_INPUTS = (  # what a client sends; states and the like are the server's to fill
    InputRole.TOKENS,
    InputRole.FEATURES,
    InputRole.MASK,
    InputRole.LENGTHS,
    InputRole.TOKEN_TYPES,
)


@dataclass(frozen=True)
class V2Request:
    """A KServe v2 inference request, decoded from either protocol."""

    model: str
    version: str | None
    inputs: tuple[WireTensor, ...]
    outputs: tuple[str, ...] | None = None  # None: all of them
    id: str | None = None
    timeout_ms: float | None = None  # Triton's `timeout` parameter, in ms
    truncation: Truncation = TRUNCATE  # how a `text` longer than the model takes is cut
    priority: int | None = None  # Triton's `priority` parameter (0: none of its own)


def timeout_ms(parameters: Mapping[str, object]) -> float | None:
    """The request's own deadline from Triton's parameters, each checked to be one we know,
    of a type Triton reads it as (a bool is not an int64, nor a double, nor a uint64)."""
    for key, value in parameters.items():
        kinds = PARAMETERS.get(key)
        if kinds is None:
            raise MalformedRequest(
                f"parameter {quoted(key)} is not supported (use {', '.join(PARAMETERS)})"
            )
        if type(value) not in kinds:
            kind = "a bool" if bool in kinds else "a string" if str in kinds else "an int64"
            raise MalformedRequest(f"parameter {key}: expected {kind}")
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise MalformedRequest(f"parameter {key}: expected 0 or more")
    timeout = parameters.get("timeout")
    return timeout / 1000 if isinstance(timeout, int) and timeout else None


def priority(parameters: Mapping[str, object]) -> int | None:
    """The request's priority level from Triton's parameters (their types checked by
    `timeout_ms`); None for 0, Triton's default, or none."""
    level = parameters.get("priority")
    return level if isinstance(level, int) and level else None


def truncation(parameters: Mapping[str, object]) -> Truncation:
    """How a `text` longer than the model takes is cut, by the request's parameters (their
    types checked by `timeout_ms`)."""
    direction = parameters.get("truncation_direction", "right")
    if direction not in DIRECTIONS:
        raise MalformedRequest(
            f"parameter truncation_direction: expected {' or '.join(DIRECTIONS)}"
        )
    return Truncation(parameters.get("truncate") is not False, direction == "left")


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
    pad = int(inp.fill)  # the model's value at padding: 0, or 1 for a mask set at padding
    if not np.isin(given, (0, 1)).all():
        raise InvalidInput(
            f"input {name}: a mask holds {1 - pad} (a real step) or {pad} (padding) only"
        )
    real = given != pad
    lengths: np.ndarray = real.sum(axis=1)
    if not (real == (np.arange(steps) < lengths[:, None])).all():
        raise InvalidInput(
            f"input {name}: each row must be real steps ({1 - pad}) followed by padding ({pad})"
        )
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
    truncation: Truncation = TRUNCATE  # how a `text` is cut

    def __post_init__(self) -> None:
        names = [wire.name for wire in self.tensors]
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is not None:
            raise InvalidInput(f"input {quoted(twice)} given twice")

    def count(self, model: Model) -> int:
        """The rows of the sequence tensor (or the texts), read from its declared shape (0
        where the shape is not one the model takes: decoding then says why)."""
        text = self._text(model)
        if text is not None:
            return max(0, text.shape[0]) if text.shape else 0
        sequence = model.info.layout.sequence.tensor
        if sequence.batch_axis is None:  # a model without one takes one sequence, as is
            wire = next((w for w in self.tensors if w.name == sequence.name), None)
            return int(wire is not None and len(wire.shape) == len(sequence.dims))
        return self._declared(sequence, sequence.batch_axis)

    def steps(self, model: Model) -> int | None:
        """T: the time steps the rows were sent at, which per-step outputs are padded back to
        (None for texts: the longest of them, tokenised)."""
        if self._text(model) is not None:
            return None
        sequence = model.info.layout.sequence.tensor
        assert sequence.time_axis is not None  # (a sequence input has one)
        return self._declared(sequence, sequence.time_axis)

    def _text(self, model: Model) -> WireTensor | None:
        """The texts tensor, where one is sent (to a model with no input of that name)."""
        if any(i.tensor.name == TEXT_INPUT for i in model.info.layout.inputs):
            return None
        return next((w for w in self.tensors if w.name == TEXT_INPUT), None)

    def _declared(self, tensor: Tensor, axis: int) -> int:
        """The size the request declares on `axis` of the input `tensor`."""
        wire = next((w for w in self.tensors if w.name == tensor.name), None)
        if wire is None or len(wire.shape) != len(tensor.dims):
            return 0
        return max(0, wire.shape[axis])

    @property
    def heavy(self) -> bool:
        return sum(wire.wire_bytes for wire in self.tensors) >= OFF_LOOP_BYTES

    def sequences(self, model: Model) -> list[np.ndarray]:
        text = self._text(model)
        if text is not None:
            return self._texts(model, text)
        inputs = {
            wire.name: tensor_array(wire, _expected(model, wire.name)) for wire in self.tensors
        }
        for inp in model.info.layout.inputs:
            given = inputs.get(inp.tensor.name)
            if inp.role is InputRole.TOKEN_TYPES and given is not None and given.any():
                raise InvalidInput(f"input {inp.tensor.name}: only token type 0 is supported")
        sequence = model.info.layout.sequence
        name = sequence.tensor.name
        if name not in inputs:
            raise InvalidInput(f"missing input {name}")
        tensor = sequence.tensor.to_batch_major(inputs[name])
        rows, steps = tensor.shape[:2]
        lengths = row_lengths(model, inputs, tensor)
        if lengths.min() < 1 or lengths.max() > steps:
            raise InvalidInput(f"row lengths must lie in 1..{steps}")
        return [model.validate(tensor[i, : lengths[i]], i, time_first=True) for i in range(rows)]

    def _texts(self, model: Model, text: WireTensor) -> list[np.ndarray]:
        """Texts, tokenised by the model as /predict's `text` is (every check the same)."""
        if model.tokenizer is None:
            sequence = model.info.layout.sequence.tensor.name
            raise InvalidInput(f"model {model.name} has no tokenizer: send {sequence}")
        others = [w.name for w in self.tensors if w is not text]
        if others:
            raise InvalidInput(
                f"input {TEXT_INPUT}: send it alone (the server makes {others[:4]} from it)"
            )
        pairs = model.info.rule(Task.CLASSIFY) is not None  # (a model that reads pairs of texts)
        rows = tensor_texts(text, (1, 2) if pairs else (1,))
        if len(rows[0]) == 2:
            return TextPairs([(a, b) for a, b in rows], self.truncation).sequences(model)
        return Texts([row[0] for row in rows], self.truncation).sequences(model)


def _expected(model: Model, name: str) -> Tensor | None:
    """The model input a tensor of this name is sent for (None: `sequence_lengths`), or
    InvalidInput when the client has no business sending it."""
    if name == LENGTHS_INPUT:
        return None
    inp = next((i for i in model.info.layout.inputs if i.tensor.name == name), None)
    if inp is None:
        raise InvalidInput(f"model {model.name} has no input {quoted(name)}")
    if inp.role in FILLED:
        raise InvalidInput(f"input {name} is a {inp.role.value} the server fills; do not send it")
    return inp.tensor


def output_tensors(answer: Answer, steps: int) -> dict[str, np.ndarray]:
    """Per-sequence outputs back into tensors in the model's own axes; per-step ones
    zero-padded to the output length of the T the request was sent at."""
    model, answers = answer.model, answer.outputs
    tensors = {}
    for name in answers[0]:
        parts = [a[name] for a in answers]
        tensor = with_batch_axis(model.info.layout.output(name))
        if tensor.per_step:
            out = np.zeros(tensor.shape(len(parts), steps), parts[0].dtype)
            rows = tensor.to_batch_major(out)  # a view: writing it fills `out`
            for row, part in enumerate(parts):
                rows[row, : part.shape[tensor.row_time_axis]] = tensor.row_time_first(part)
            tensors[name] = out
        else:
            stacked = np.stack(parts)
            tensors[name] = tensor.to_model_axes(stacked)
    return tensors


def with_batch_axis(tensor: Tensor) -> Tensor:
    """An output as v2 carries it: with a batch axis, which a batch-1 model's output without
    one gets in front (a request's rows are stacked there)."""
    if tensor.batch_axis is not None:
        return tensor
    time = None if tensor.time_axis is None else tensor.time_axis + 1
    return dataclasses.replace(tensor, dims=(None, *tensor.dims), batch_axis=0, time_axis=time)


async def infer(
    engine: Engine,
    request: V2Request,
    request_id: str,
    timeouts_ms: Sequence[float | None] = (),
    priority: int | None = None,
    tenant: str = "",
) -> tuple[Answer, dict[str, np.ndarray]]:
    """One v2 request through the core: its answer, and its outputs as tensors. The deadline
    is the soonest of Triton's `timeout` and the protocol's own (`timeouts_ms`); the level is
    Triton's `priority`, else the protocol's own (`priority`: a header, or metadata)."""
    given = [t for t in (request.timeout_ms, *timeouts_ms) if t is not None]
    inputs = TensorInputs(request.inputs, request.truncation)
    call = Call(
        inputs,
        request.model,
        request.version or None,
        request.outputs,
        min(given, default=None),
        request_id,
        priority=request.priority or priority,
        tenant=tenant,
    )
    answer = await engine.infer(call)
    steps = inputs.steps(answer.model)
    return answer, output_tensors(answer, max(answer.lengths) if steps is None else steps)


# The repository extension's parameters read here, as Triton reads them: a load takes none
# (Triton's inline config and files are refused: the model is read from the repository), an
# unload `unload_dependents`, which tritonclient always sends (no model here has dependents).
LOAD_PARAMETERS: tuple[str, ...] = ()
UNLOAD_PARAMETERS = ("unload_dependents",)


def repository_parameters(given: Iterable[str], allowed: tuple[str, ...]) -> None:
    """MalformedRequest naming the parameters of a load or unload this server does not take."""
    unknown = sorted(str(name)[:64] for name in set(given) - set(allowed))
    if unknown:
        raise MalformedRequest(
            f"parameter(s) {unknown[:4]} are not taken here: the model is read from the repository"
        )


def described(tensor: Tensor) -> dict[str, Any]:
    """A tensor as v2 metadata shows it: name, datatype, shape with -1 for a free dim."""
    return {
        "name": tensor.name,
        "datatype": DATATYPE_OF[tensor.dtype],
        "shape": [-1 if d is None else d for d in tensor.dims],
    }


def metadata(model: Model, versions: Iterable[int] = ()) -> dict[str, Any]:
    """The model's v2 metadata: the versions served (default: its own), the inputs a client
    sends and the outputs it gets, and (an extension) this version's fingerprint."""
    layout = model.info.layout
    return {
        "name": model.name,
        "versions": [str(v) for v in versions] or [str(model.info.version)],
        "platform": "onnxruntime_onnx",
        "inputs": [described(i.tensor) for i in layout.inputs if i.role in CLIENT_INPUTS]
        + ([TEXT_METADATA] if model.tokenizer is not None else []),
        "outputs": [described(with_batch_axis(o)) for o in layout.outputs],
        "fingerprint": model.info.fingerprint,
    }


def triton_config(model: Model) -> dict[str, Any]:
    """The model as Triton's model configuration describes one (its JSON form), for the clients
    that read it (`tritonclient`'s `get_model_config`, `perf_analyzer`, Model Analyzer). The
    inputs are the metadata's, each marked `optional` unless every request must send it: the
    sequence input, where the model has no tokenizer (a text model takes `text` or its token
    inputs; a mask, lengths and token types have defaults). `max_batch_size` 0: the dims are
    the model's whole shapes, the batch axis included where it lies. `dynamic_batching`: the
    server forms the batches.
    """
    described = metadata(model)
    required = set() if model.tokenizer is not None else {model.info.layout.sequence.tensor.name}

    def tensor(t: dict[str, Any]) -> dict[str, Any]:
        datatype = "STRING" if t["datatype"] == TEXT else t["datatype"]
        return {"name": t["name"], "data_type": f"TYPE_{datatype}", "dims": t["shape"]}

    return {
        "name": model.name,
        "platform": described["platform"],
        "backend": "onnxruntime",
        "max_batch_size": 0,
        "input": [
            {**tensor(t), "optional": t["name"] not in required} for t in described["inputs"]
        ],
        "output": [tensor(t) for t in described["outputs"]],
        "dynamic_batching": {},
    }


def most_values(model: Model, rows: int) -> int:
    """The most numbers a v2 request for `model` can carry: `rows` sequences at its longest,
    in every input a client sends, and their `sequence_lengths` (a request's limits allow no
    more, so a JSON body that holds more is refused before it is parsed)."""
    length, total = model.plan.max_length, rows
    for inp in model.info.layout.inputs:
        tensor = inp.tensor
        if inp.role not in CLIENT_INPUTS:
            continue
        free = (tensor.batch_axis, tensor.time_axis)
        step = math.prod(d for i, d in enumerate(tensor.dims) if i not in free and d is not None)
        total += rows * (length if tensor.time_axis is not None else 1) * step
    return total

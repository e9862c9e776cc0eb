"""A model's tensors as the request path sees them: roles, dtypes, batch and time axes; collate
and split.

Built once at load (by `bucketserve.loading`), read on every batch. No ONNX Runtime, no asyncio.

- `Layout.collate` builds every model input for a batch: the sequences padded to the batch's
  length, pad rows (MXNet's `DataBatch.pad`) when a static shape asks for more rows, mask,
  lengths, token types and state inputs, each with its batch and time axes where the graph
  has them.
- `Layout.split` drops pad rows and cuts per-step outputs back to each sequence's own output
  length (its `Steps`: a strided output has about a quarter of the steps, say).

A text pair (a query and a document, for a cross-encoder) is one sequence whose steps carry
a segment id beside each token id (`segmented`): collate feeds the ids to the tokens input and
the segments to the token types input; every other sequence has segment 0 throughout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np


class InputRole(StrEnum):
    """What a model input carries. Requests provide only the sequence (tokens or features)."""

    TOKENS = "tokens"  # int ids, [batch, time]
    FEATURES = "features"  # per-step values: [batch, samples], [batch, time, dim], images...
    MASK = (
        "mask"  # 1 at real positions, 0 at padding (its pad value: 1 turns it round), [batch, time]
    )
    LENGTHS = "lengths"  # each row's length, [batch]
    # each row's length, [batch], for an input the server added to a copy it rewrote (its
    # RNNs given each row's length): fed by the server, never sent, never shown to a client
    ROW_LENGTHS = "row_lengths"
    TOKEN_TYPES = "token_types"  # segment ids (a pair's second text 1, else 0), [batch, time]
    STATE = "state"  # e.g. an RNN's initial state; filled like MXNet's `state_names`
    CONSTANT = "constant"  # one value on every run (a sample rate): the config's, never sent


SEQUENCE_ROLES = (InputRole.TOKENS, InputRole.FEATURES)
FILLED = (InputRole.STATE, InputRole.CONSTANT)  # the server fills them with one value

Outputs = dict[str, np.ndarray]  # one sequence's outputs, by name
SEGMENTED = np.dtype([("id", np.int64), ("segment", np.int64)])  # a token step of a text pair


def segmented(ids: np.ndarray, segments: Sequence[int] | np.ndarray) -> np.ndarray:
    """A sequence of token `ids` with each one's segment id (a text pair's)."""
    steps = np.empty(len(ids), SEGMENTED)
    steps["id"], steps["segment"] = ids, segments
    return steps


def token_ids(sequence: np.ndarray) -> np.ndarray:
    """A sequence's token ids (its steps, unless they carry segments too)."""
    return sequence["id"] if sequence.dtype.names else sequence


@dataclass(frozen=True)
class Steps:
    """How many steps an output's time axis has for an input `length` steps long:
    floor((length + offset) / stride). A strided convolution front end follows this rule, and
    so does a stack of them; the identity when the output keeps the input's time axis."""

    stride: int = 1
    offset: int = 0

    def of(self, length: int) -> int:
        return (length + self.offset) // self.stride

    def __str__(self) -> str:
        shifted = f"(T {'+-'[self.offset < 0]} {abs(self.offset)})" if self.offset else "T"
        return shifted.strip("()") if self.stride == 1 else f"floor({shifted} / {self.stride})"


SAME_STEPS = Steps()


@dataclass(frozen=True)
class Tensor:
    """One graph input or output: fixed sizes, where its batch and time axes are, and (for an
    output) how its time axis follows the input's."""

    name: str
    dtype: np.dtype
    dims: tuple[int | None, ...]  # fixed sizes; None on the batch and time axes
    batch_axis: int | None  # None: an output of a batch-1 model that has no batch axis
    time_axis: int | None = None  # None: the tensor has no time axis
    steps: Steps = SAME_STEPS

    @property
    def per_step(self) -> bool:
        return self.time_axis is not None

    def shape(self, rows: int, length: int) -> tuple[int, ...]:
        """The concrete shape for a batch of `rows` sequences padded to `length` (input) steps."""
        sizes = list(self.dims)
        if self.batch_axis is not None:
            sizes[self.batch_axis] = rows
        if self.time_axis is not None:
            sizes[self.time_axis] = self.steps.of(length)
        return tuple(int(s) for s in sizes)  # type: ignore[arg-type]

    def to_model_axes(self, batch_major: np.ndarray) -> np.ndarray:
        """An array laid out [batch, time, ...] moved to this tensor's own axes."""
        moved = self._axes()
        if moved != tuple(range(len(moved))):
            batch_major = np.ascontiguousarray(np.moveaxis(batch_major, range(len(moved)), moved))
        return batch_major if self.batch_axis is not None else batch_major[0]

    def to_batch_major(self, array: np.ndarray) -> np.ndarray:
        """This tensor's array with its batch axis first and its time axis second (a view); a
        tensor without a batch axis is one row."""
        if self.batch_axis is None:
            array = array[np.newaxis]
        moved = self._axes()
        if moved == tuple(range(len(moved))):
            return array
        return np.moveaxis(array, moved, range(len(moved)))

    def row_as_sent(self, row: np.ndarray) -> np.ndarray:
        """One row, time first, in the tensor's own axes without the batch axis (how a
        sequence is sent to /predict and its outputs come back: an image line as [3, 48, W])."""
        return row if self.row_time_axis == 0 else np.moveaxis(row, 0, self.row_time_axis)

    def row_time_first(self, row: np.ndarray) -> np.ndarray:
        """`row_as_sent`, undone."""
        return row if self.row_time_axis == 0 else np.moveaxis(row, self.row_time_axis, 0)

    @property
    def row_time_axis(self) -> int:
        """Where the time axis lies in one row (the tensor without its batch axis)."""
        if self.time_axis is None:
            return 0
        before = self.batch_axis is not None and self.batch_axis < self.time_axis
        return self.time_axis - before

    def _axes(self) -> tuple[int, ...]:
        """The batch and time axes in the batch-major array's rank (batch-less: one added)."""
        shift = self.batch_axis is None
        batch = 0 if self.batch_axis is None else self.batch_axis
        return (batch,) if self.time_axis is None else (batch, self.time_axis + shift)


@dataclass(frozen=True)
class Input:
    tensor: Tensor
    role: InputRole
    fill: float  # the pad value (sequence input; a mask's at padding), a state's or constant's


@dataclass(frozen=True)
class Layout:
    """How one model's inputs are built from sequences, and its outputs taken apart."""

    inputs: tuple[Input, ...]
    outputs: tuple[Tensor, ...]

    @property
    def sequence(self) -> Input:
        return next(i for i in self.inputs if i.role in SEQUENCE_ROLES)

    def output(self, name: str) -> Tensor:
        return next(o for o in self.outputs if o.name == name)

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.outputs]

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        return (*(i.tensor for i in self.inputs), *self.outputs)

    def collate(
        self, sequences: Sequence[np.ndarray], rows: int, length: int
    ) -> dict[str, np.ndarray]:
        """Feeds for `sequences` padded to `length`, plus pad rows up to `rows`.

        A pad row is one step long (a pad token, a zero frame): a row of length 0 is something
        some models (masked softmax, RNNs) cannot run on, and its outputs are dropped anyway.
        """
        lengths = np.ones(rows, np.int64)
        lengths[: len(sequences)] = [len(s) for s in sequences]
        feeds: dict[str, np.ndarray] = {}
        for inp in self.inputs:
            tensor = inp.tensor
            if inp.role in FILLED:  # no time axis; a state's batch wherever the graph has it
                feeds[tensor.name] = np.full(tensor.shape(rows, length), inp.fill, tensor.dtype)
                continue
            shape = _batch_major(tensor.shape(rows, length), tensor)
            if inp.role in (InputRole.TOKENS, InputRole.FEATURES):
                batch = np.full(shape, inp.fill, tensor.dtype)
                for row, seq in enumerate(sequences):
                    batch[row, : len(seq)] = token_ids(seq)
            elif inp.role is InputRole.MASK:  # its pad value at padding, the other at real steps
                real = np.arange(length) < lengths[:, None]
                batch = (real != bool(inp.fill)).astype(tensor.dtype)
            elif inp.role in (InputRole.LENGTHS, InputRole.ROW_LENGTHS):
                batch = lengths.astype(tensor.dtype)
            else:  # TOKEN_TYPES
                batch = np.zeros(shape, tensor.dtype)
                for row, seq in enumerate(sequences):
                    if seq.dtype.names:
                        batch[row, : len(seq)] = seq["segment"]
            feeds[tensor.name] = tensor.to_model_axes(batch)
        return feeds

    def split(self, outputs: Mapping[str, np.ndarray], lengths: Sequence[int]) -> list[Outputs]:
        """One dict per real row: pad rows dropped, per-step outputs cut to the row's own
        output length, each in its tensor's own axes without the batch axis."""
        rows: list[Outputs] = [{} for _ in lengths]
        for tensor in self.outputs:
            if tensor.name not in outputs:
                continue
            out = tensor.to_batch_major(outputs[tensor.name])
            for row, length in enumerate(lengths):
                if tensor.per_step:
                    part = tensor.row_as_sent(out[row, : tensor.steps.of(length)])
                else:
                    part = out[row]
                # (contiguous for the JSON encoder; ascontiguousarray would make a scalar [x])
                rows[row][tensor.name] = part if part.flags.c_contiguous else part.copy()
        return rows


def _batch_major(shape: tuple[int, ...], tensor: Tensor) -> tuple[int, ...]:
    """An input's `shape` (in its own axis order) reordered to [batch, time, the rest]; one
    without a batch axis gets one of 1 in front (`to_model_axes` takes it off again)."""
    front = [a for a in (tensor.batch_axis, tensor.time_axis) if a is not None]
    rest = [i for i in range(len(shape)) if i not in front]
    reordered = tuple(shape[i] for i in front + rest)
    return reordered if tensor.batch_axis is not None else (1, *reordered)

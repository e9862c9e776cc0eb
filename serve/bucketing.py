"""Pure bucketing: which key a length falls in, how many rows a key holds, collate and split.

No ONNX Runtime and no asyncio: plain functions over numpy arrays, tested on their own.

- `BucketPlan` maps a sequence length to a `BucketKey(rows, length)`: the bucket edge it pads
  to and the batch capacity there, min(max_batch_size, max_batch_tokens // length).
- `Layout.collate` builds every model input for a batch: the sequence padded to the batch's
  length, pad rows (MXNet's `DataBatch.pad`) when a static shape asks for more rows, mask,
  lengths, token types and state inputs.
- `split` drops pad rows and cuts per-step outputs back to each sequence's own length.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from serve.config import InputRole
from serve.errors import InvalidInput
from serve.repository import ModelSpec
from serve.signature import Signature, TensorSpec


@dataclass(frozen=True, order=True)
class BucketKey:
    """A bound executor's shape: up to `rows` sequences, each padded to `length`."""

    rows: int
    length: int

    def __str__(self) -> str:
        return f"{self.rows}x{self.length}"


@dataclass(frozen=True)
class BucketPlan:
    edges: tuple[int, ...]
    max_batch_size: int
    max_batch_tokens: int
    exact_lengths: bool = False  # pad-sensitive models: one key per exact length, never padded

    @property
    def max_length(self) -> int:
        return self.edges[-1]

    def capacity(self, length: int) -> int:
        return max(1, min(self.max_batch_size, self.max_batch_tokens // length))

    def key_for(self, length: int) -> BucketKey:
        if not 1 <= length <= self.max_length:
            raise InvalidInput(f"sequence length {length} is outside 1..{self.max_length}")
        edge = length if self.exact_lengths else self.edges[bisect.bisect_left(self.edges, length)]
        return BucketKey(self.capacity(edge), edge)

    def all_keys(self) -> list[BucketKey]:
        lengths = range(1, self.max_length + 1) if self.exact_lengths else self.edges
        return [BucketKey(self.capacity(n), n) for n in lengths]

    @property
    def default_key(self) -> BucketKey:
        """The longest bucket at its capacity: bound first, at load, like MXNet's default key."""
        return BucketKey(self.capacity(self.max_length), self.max_length)

    def batches(self, lengths: Sequence[int]) -> Iterator[tuple[BucketKey, list[int]]]:
        """Group sequence indices by key, in order, each group cut to the key's capacity."""
        groups: dict[BucketKey, list[int]] = {}
        for index, length in enumerate(lengths):
            groups.setdefault(self.key_for(length), []).append(index)
        for key in sorted(groups, key=lambda k: k.length):
            members = groups[key]
            for start in range(0, len(members), key.rows):
                yield key, members[start : start + key.rows]


@dataclass(frozen=True)
class _Input:
    name: str
    role: InputRole
    spec: TensorSpec
    fill: float  # pad value for the sequence input, the state's value for a state input


@dataclass(frozen=True)
class Layout:
    """How one model's inputs are built from sequences, and which outputs are per step."""

    signature: Signature
    inputs: tuple[_Input, ...]
    per_step: Mapping[str, bool]

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> Layout:
        inputs = tuple(
            _Input(
                name,
                cfg.role,
                spec.signature.inputs[name],
                cfg.fill if cfg.role is InputRole.STATE else cfg.pad_value,
            )
            for name, cfg in spec.config.inputs.items()
        )
        per_step = {name: out.per_step for name, out in spec.config.outputs.items()}
        return cls(spec.signature, inputs, per_step)

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
            shape = self.signature.shape(inp.spec, rows, length)
            if inp.role in (InputRole.TOKENS, InputRole.FEATURES):
                batch = np.full(shape, inp.fill, inp.spec.dtype)
                for row, seq in enumerate(sequences):
                    batch[row, : len(seq)] = seq
            elif inp.role is InputRole.MASK:
                batch = (np.arange(length) < lengths[:, None]).astype(inp.spec.dtype)
            elif inp.role is InputRole.LENGTHS:
                batch = lengths.astype(inp.spec.dtype)
            elif inp.role is InputRole.TOKEN_TYPES:
                batch = np.zeros(shape, inp.spec.dtype)
            else:  # STATE
                batch = np.full(shape, inp.fill, inp.spec.dtype)
            feeds[inp.name] = batch
        return feeds


def split(
    outputs: Mapping[str, np.ndarray], lengths: Sequence[int], per_step: Mapping[str, bool]
) -> list[dict[str, np.ndarray]]:
    """One dict per real row: pad rows dropped, per-step outputs cut to the row's own length."""
    return [
        {name: out[row, :length] if per_step[name] else out[row] for name, out in outputs.items()}
        for row, length in enumerate(lengths)
    ]

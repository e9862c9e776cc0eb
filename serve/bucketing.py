"""Pure bucketing: which key a length falls in, and how many rows a key holds.

No ONNX Runtime and no asyncio. `BucketPlan` maps a sequence length to a `BucketKey(rows,
length)`: the bucket edge it pads to and the batch capacity there, min(max_batch_size,
max_batch_tokens // length). Collating a batch and splitting its outputs is `serve.layout`'s.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from serve.errors import InvalidInput


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

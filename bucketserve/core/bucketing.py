"""Pure bucketing: which key a length falls in, and how many rows a key holds.

No ONNX Runtime and no asyncio. `BucketPlan` maps a sequence length to a `BucketKey(rows,
length)`: the bucket edge it pads to and the batch capacity there, min(max_batch_size,
max_batch_tokens // length, the rows whose batch fits the memory budget). Its edges end at the
longest length whose batch of one fits the budget: a longer sequence is refused before it
queues. How far a model may be batched is its `Policy`, chosen at load
from what batching was measured to do to its answers (`Invariance`). Collating a batch and
splitting its outputs is `bucketserve.core.layout`'s.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

from bucketserve.core.memory import Footprint
from bucketserve.errors import InvalidInput


@dataclass(frozen=True, order=True)
class BucketKey:
    """A bound executor's shape: up to `rows` sequences, each padded to `length`."""

    rows: int
    length: int

    def __str__(self) -> str:
        return f"{self.rows}x{self.length}"


class Policy(StrEnum):
    """How far a model's sequences may share a run, from the loosest to the strictest."""

    BUCKETS = "buckets"  # any lengths of one bucket, padded: padding and batching move nothing
    EXACT_LENGTH = "exact-length"  # only equal lengths, never padded: padding moves outputs
    SINGLE = "single"  # one sequence per run: other rows move a row's outputs


@dataclass(frozen=True)
class Invariance:
    """What batching does to a model's answers, measured at load: the worst difference from
    the model run on each sequence alone, |batched - alone| / (1 + |alone|), when padded in a
    batch and when in an unpadded batch of equal lengths."""

    padding: float
    batching: float
    tolerance: float
    # how far apart the answers of different sequences of one length are, each run alone: 0
    # when the model does not read its input as it is fed (a mask that points the other way)
    spread: float = float("inf")

    @property
    def policy(self) -> Policy:
        if not self.batching <= self.tolerance:  # (a NaN is not within any tolerance)
            return Policy.SINGLE
        if not self.padding <= self.tolerance:
            return Policy.EXACT_LENGTH
        return Policy.BUCKETS


def round_up(length: int, multiple: int) -> int:
    """The least multiple of `multiple` that is at least `length`."""
    return -(-length // multiple) * multiple


@dataclass(frozen=True)
class BucketPlan:
    edges: tuple[int, ...]
    max_batch_size: int
    max_batch_tokens: int
    policy: Policy = Policy.BUCKETS
    # the model runs only at lengths that are multiples of this (a detector's width at 32):
    # every edge is one, and a sequence runs padded up to one, its outputs cut back
    multiple: int = 1
    # what a batch needs in memory, and the bytes every batch running at once may need
    # together: a key holds no more rows than fit alone (None: not bounded by memory)
    footprint: Footprint | None = None
    budget: int | None = None

    def __post_init__(self) -> None:
        if any(e % self.multiple for e in self.edges):
            raise ValueError(f"edges {self.edges} are not all multiples of {self.multiple}")

    def run_length(self, length: int) -> int:
        """The length a sequence of `length` steps runs at, alone or in an unpadded batch."""
        return round_up(length, self.multiple)

    @property
    def max_length(self) -> int:
        return self.edges[-1]

    def capacity(self, length: int) -> int:
        if self.policy is Policy.SINGLE:
            return 1
        return max(1, min(self.max_batch_size, self.max_batch_tokens // length, self.fit(length)))

    def fit(self, length: int) -> int:
        """The most rows of `length` whose batch fits the memory budget alone."""
        if self.footprint is None or self.budget is None:
            return 1 << 30
        return self.footprint.rows(length, self.budget)

    def need(self, rows: int, length: int) -> int:
        """The bytes a batch of `rows` x `length` needs while it runs (0: not measured)."""
        return 0 if self.footprint is None else self.footprint.need(rows, length)

    def bucket_of(self, length: int) -> int:
        """The configured edge that `length` falls under (a metric label, whatever the key)."""
        return self.edges[bisect.bisect_left(self.edges, length)]

    def key_for(self, length: int) -> BucketKey:
        if not 1 <= length <= self.max_length:
            raise InvalidInput(f"sequence length {length} is outside 1..{self.max_length}")
        exact = self.policy is Policy.EXACT_LENGTH
        edge = self.run_length(length) if exact else self.bucket_of(length)
        return BucketKey(self.capacity(edge), edge)

    def all_keys(self) -> list[BucketKey]:
        exact = self.policy is Policy.EXACT_LENGTH
        lengths = range(self.multiple, self.max_length + 1, self.multiple) if exact else self.edges
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

"""Every sequence's reuse, keyed once (`Reuse`): a model version's answers kept by the
sequence's exact inputs and the answer asked (its head), to give again without running the
model (`ResultCache`), and the sequences queued or running that an identical one may join.
The scheduler owns one for a model whose answers cannot depend on what they ran with.

Only a model whose check proved its answers independent of batching and padding (policy
`buckets`) has one: its answer to a sequence is then the same whoever it ran with, so an
answer kept is the answer the model gives that sequence alone. Bounded in bytes (keys
included), least recently used first out; one cache per model version, dropped with it when
the version is reloaded or unloaded.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from bucketserve.core.bucketing import Invariance, Policy
from bucketserve.core.layout import Outputs

ENTRY_OVERHEAD = 256  # bytes an entry costs besides its key and arrays (the dicts, the tuple)


def exact_inputs(sequence: np.ndarray) -> bytes:
    """A sequence's exact inputs as one key: its type (segments included), shape and bytes.
    Equal keys mean equal inputs (the tokenizer's ids, for a text)."""
    header = f"{sequence.dtype.descr}{sequence.shape}".encode()
    return header + b"\0" + np.ascontiguousarray(sequence).tobytes()


def refused_because(invariance: Invariance, bound_bytes: int) -> str | None:
    """Why a model gets no cache (None: it gets one)."""
    if bound_bytes <= 0:
        return "off: --result-cache-mb is 0"
    policy = invariance.policy
    if policy is Policy.BUCKETS:
        return None
    moved = "batching" if policy is Policy.SINGLE else "padding"
    figure = invariance.batching if policy is Policy.SINGLE else invariance.padding
    return (
        f"off: the check found {moved} moves its answers by {figure:.2g} (tolerance "
        f"{invariance.tolerance:.2g}), so an answer depends on what it ran with"
    )


class ResultCache:
    def __init__(self, bound_bytes: int) -> None:
        self.bound_bytes = bound_bytes
        self.bytes = 0
        self._entries: OrderedDict[bytes, tuple[Outputs, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> Outputs | None:
        """The answer kept under `key` (a sequence's exact inputs and its head), now the most
        recently used."""
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found[0]

    def put(self, key: bytes, answer: Outputs) -> None:
        """Keep `answer` (read-only, as every request that gets it shares it), dropping the
        least recently used until the bound holds. One larger than the bound is not kept."""
        if key in self._entries:
            return
        kept = {name: _frozen(array) for name, array in answer.items()}
        size = len(key) + sum(np.asarray(a).nbytes for a in kept.values()) + ENTRY_OVERHEAD
        if size > self.bound_bytes:
            return
        self._entries[key] = (kept, size)
        self.bytes += size
        while self.bytes > self.bound_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0


def _frozen(array: np.ndarray) -> np.ndarray:
    """`array` made read-only: a head's answer owns its data (`heads.owned`); a view of
    something else is copied first, so that nothing more than the answer is kept."""
    if not isinstance(array, np.ndarray):  # a numpy scalar (one per sequence): immutable
        return array
    if array.base is not None:
        array = array.copy()
    array.flags.writeable = False
    return array


class Reuse:
    """A model version's reuse of answers, by identity (`exact_inputs` and the answer asked):
    those kept, and the sequences queued or running (their leaders, which an identical one
    joins)."""

    def __init__(self, bound_bytes: int) -> None:
        self.kept = ResultCache(bound_bytes)
        self._leaders: dict[bytes, Any] = {}

    @property
    def kept_bytes(self) -> int:
        """What the answers kept take, keys and overhead counted."""
        return self.kept.bytes

    def answer(self, key: bytes) -> Outputs | None:
        return self.kept.get(key)

    def keep(self, key: bytes, answer: Outputs) -> None:
        self.kept.put(key, answer)

    def leader(self, key: bytes) -> Any:
        """The sequence queued or running under `key`, if any."""
        return self._leaders.get(key)

    def lead(self, key: bytes, leader: Any) -> None:
        self._leaders[key] = leader

    def left(self, key: bytes, leader: Any) -> None:
        """`leader` answered or dropped: no sequence joins it any more."""
        if self._leaders.get(key) is leader:
            del self._leaders[key]

    def clear(self) -> None:
        self.kept.clear()

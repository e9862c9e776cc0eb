"""The exact result cache: a model version's answers kept by the sequence's exact inputs and
the answer asked (its head), for the engine to give again without running the model.

Only a model whose check proved its answers independent of batching and padding (policy
`buckets`) has one: its answer to a sequence is then the same whoever it ran with, so an
answer kept is the answer the model gives that sequence alone. Bounded in bytes (keys
included), least recently used first out; one cache per model version, dropped with it when
the version is reloaded or unloaded.
"""

from __future__ import annotations

from collections import OrderedDict

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

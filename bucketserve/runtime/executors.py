"""Executors: MXNet's per-bucket executors, bound lazily, all on one copy of the weights.

Three strategies, chosen by a model's config:

- `shared-session` (bucketing): one session; each bucket key gets its own binding with buffers
  preallocated at the key's shape, and a batch runs at its real rows and its own longest
  sequence (on a CPU every padded position costs; only static-shape engines need the edge).
- `session-per-key` (bucketing): one static-shape session per key (free dims fixed), weights
  shared through the memmap; partial batches are filled with pad rows. This is the shape that
  CUDA graphs and TensorRT engines need on a GPU.
- `mutable`: MXNet's MutableModule: one session, one set of buffers at the maximum shape (per
  instance running at once), exact-shape views rebound when the shape changes; batches pad to
  their own longest sequence.

A key is bound on its first batch or by `prepare`, once, even under concurrent first use.
When the server runs several batches at once (`instances`), a batch that finds every binding
of its key busy gets another one like it, on the same session and weights: a key ends up with
as many bindings as it ever had concurrent batches, and no more.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence

import numpy as np
import onnxruntime as ort

from bucketserve.core.bucketing import BucketKey, BucketPlan
from bucketserve.core.layout import Layout
from bucketserve.runtime.binding import BufferBinding
from bucketserve.runtime.sessions import GraphFile, create_session
from bucketserve.runtime.weights import SharedWeights


class Executor(ABC):
    binding: str

    def __init__(
        self,
        graph: GraphFile,
        layout: Layout,
        plan: BucketPlan,
        session: ort.InferenceSession | None = None,
    ) -> None:
        """`session`: one made at load over `graph`, which the strategies that run everything
        on one session take as theirs."""
        self.graph = graph
        self.layout = layout
        self.plan = plan
        self._bound: set[BucketKey] = set()
        # Bindings by family: one per key, except in mutable mode, where every key shares them.
        self._families: dict[Hashable, list[BufferBinding]] = {}
        self._key_locks: dict[BucketKey, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    @property
    def bound_keys(self) -> frozenset[BucketKey]:
        return frozenset(self._bound)

    def bound_key_count(self) -> int:
        return len(self._bound)

    @property
    @abstractmethod
    def sessions(self) -> list[ort.InferenceSession]:
        """The sessions this executor holds now."""

    @property
    def providers(self) -> list[str]:
        """The execution providers the sessions really run on, as ONNX Runtime reports them."""
        return list(self.sessions[0].get_providers())

    @abstractmethod
    def batch_shape(self, key: BucketKey, lengths: Sequence[int]) -> tuple[int, int]:
        """(rows, length) that a batch of sequences with these lengths runs at under `key`."""

    @abstractmethod
    def _bind(self, key: BucketKey) -> BufferBinding:
        """A new binding for `key`: its first, or another for a concurrent batch."""

    def _family(self, key: BucketKey) -> Hashable:
        """Keys of one family share their bindings."""
        return key

    def prepare(self, key: BucketKey) -> bool:
        """Bind `key` unless bound already; True when this call bound it."""
        if key in self._bound:
            return False
        with self._locks_lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            if key in self._bound:
                return False
            if self._family(key) not in self._families:
                self._families[self._family(key)] = [self._bind(key)]
            self._bound.add(key)
            return True

    def run(
        self, key: BucketKey, feeds: Mapping[str, np.ndarray], rows: int, length: int
    ) -> dict[str, np.ndarray]:
        """Run collated `feeds` of `rows` x `length` (the key's `batch_shape`) under `key`,
        binding the key if it is new."""
        self.prepare(key)
        family = self._families[self._family(key)]
        binding = next((b for b in list(family) if b.lock.acquire(blocking=False)), None)
        if binding is None:  # every binding of this key is running a batch
            binding = self._bind(key)
            binding.lock.acquire()
            with self._locks_lock:
                family.append(binding)
        try:
            return binding.run(feeds, rows, length)
        finally:
            binding.lock.release()


class _OneSessionExecutor(Executor):
    """Every key on one session (the load-time one when given); a batch runs its real rows at
    its own longest sequence (rounded up to the length the model runs at)."""

    def __init__(
        self,
        graph: GraphFile,
        layout: Layout,
        plan: BucketPlan,
        session: ort.InferenceSession | None = None,
    ) -> None:
        super().__init__(graph, layout, plan, session)
        self._session = session or create_session(graph)

    @property
    def sessions(self) -> list[ort.InferenceSession]:
        return [self._session]

    def batch_shape(self, key: BucketKey, lengths: Sequence[int]) -> tuple[int, int]:
        return len(lengths), self.plan.run_length(max(lengths))


class SharedSessionExecutor(_OneSessionExecutor):
    binding = "shared-session"

    def _bind(self, key: BucketKey) -> BufferBinding:
        return BufferBinding(self._session, self.layout, [(key.rows, key.length)])


class SessionPerKeyExecutor(Executor):
    binding = "session-per-key"

    def __init__(
        self,
        graph: GraphFile,
        layout: Layout,
        plan: BucketPlan,
        session: ort.InferenceSession | None = None,
    ) -> None:
        """(`session` is not used: every key gets a static-shape session of its own.)"""
        super().__init__(graph, layout, plan, session)
        self.weights = SharedWeights(graph.path)
        self._sessions: dict[BucketKey, ort.InferenceSession] = {}

    @property
    def sessions(self) -> list[ort.InferenceSession]:
        return list(self._sessions.values())

    def batch_shape(self, key: BucketKey, lengths: Sequence[int]) -> tuple[int, int]:
        return key.rows, key.length

    def _bind(self, key: BucketKey) -> BufferBinding:
        session = self._sessions.get(key)
        if session is None:  # the key's first binding; later ones share its session
            session = self._sessions[key] = create_session(
                self.graph,
                weights=self.weights,
                static_dims=self.graph.static_dims(key.rows, key.length),
            )
        return BufferBinding(session, self.layout, [(key.rows, key.length)])


class MutableExecutor(_OneSessionExecutor):
    binding = "mutable"

    def __init__(
        self,
        graph: GraphFile,
        layout: Layout,
        plan: BucketPlan,
        session: ort.InferenceSession | None = None,
    ) -> None:
        super().__init__(graph, layout, plan, session)
        self._shapes = [(k.rows, k.length) for k in plan.all_keys()]
        self._families[None] = [self._bind(plan.default_key)]  # bound once, at the max shape

    def _bind(self, key: BucketKey) -> BufferBinding:
        return BufferBinding(self._session, self.layout, self._shapes)

    def _family(self, key: BucketKey) -> Hashable:
        return None  # every key shares the max-shape buffers


BINDINGS: dict[str, type[Executor]] = {
    cls.binding: cls for cls in (SharedSessionExecutor, SessionPerKeyExecutor, MutableExecutor)
}


def make_executor(
    binding: str,
    graph: GraphFile,
    layout: Layout,
    plan: BucketPlan,
    session: ort.InferenceSession | None = None,
) -> Executor:
    """The executor for `binding`; `session` (one made at load over `graph`) is reused by the
    strategies that run everything on one session."""
    return BINDINGS[binding](graph, layout, plan, session)

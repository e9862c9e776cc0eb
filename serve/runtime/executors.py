"""Executors: MXNet's per-bucket executors, bound lazily, all on one copy of the weights.

Three strategies, chosen by a model's config:

- `shared-session` (bucketing): one session; each bucket key gets its own binding with buffers
  preallocated at the key's shape, and a batch runs at its real rows and its own longest
  sequence (on a CPU every padded position costs; only static-shape engines need the edge).
- `session-per-key` (bucketing): one static-shape session per key (free dims fixed), weights
  shared through the memmap; partial batches are filled with pad rows. This is the shape that
  CUDA graphs and TensorRT engines need on a GPU.
- `mutable`: MXNet's MutableModule: one session, one set of buffers at the maximum shape,
  exact-shape views rebound when the shape changes; batches pad to their own longest sequence.

A key is bound on its first batch or by `prepare`, once, even under concurrent first use.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import onnxruntime as ort

from serve.bucketing import BucketKey, BucketPlan
from serve.repository import ModelSpec
from serve.runtime.binding import BufferBinding
from serve.runtime.sessions import create_session
from serve.runtime.weights import SharedWeights


class Executor(ABC):
    strategy: str

    def __init__(self, spec: ModelSpec, plan: BucketPlan) -> None:
        self.spec = spec
        self.plan = plan
        self.output_names = list(spec.config.outputs)
        self.bind_counts: Counter[BucketKey] = Counter()
        self._bindings: dict[BucketKey, BufferBinding] = {}
        self._key_locks: dict[BucketKey, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    @property
    def bound_keys(self) -> frozenset[BucketKey]:
        return frozenset(self._bindings)

    def bound_key_count(self) -> int:
        return len(self._bindings)

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
        """Bind an executor for `key`; called once per key."""

    def prepare(self, key: BucketKey) -> bool:
        """Bind `key` unless bound already; True when this call bound it."""
        if key in self._bindings:
            return False
        with self._locks_lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            if key in self._bindings:
                return False
            binding = self._bind(key)
            self.bind_counts[key] += 1
            self._bindings[key] = binding
            return True

    def run(self, key: BucketKey, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run collated `feeds` (already at `batch_shape`) under `key`, binding it if new."""
        self.prepare(key)
        binding = self._bindings[key]
        rows, length = feeds[self.spec.config.sequence_input].shape[:2]
        with binding.lock:
            return binding.run(feeds, rows, length)


class SharedSessionExecutor(Executor):
    strategy = "shared-session"

    def __init__(self, spec: ModelSpec, plan: BucketPlan) -> None:
        super().__init__(spec, plan)
        self._session = create_session(spec.onnx_path, spec.config.providers)

    @property
    def sessions(self) -> list[ort.InferenceSession]:
        return [self._session]

    def batch_shape(self, key: BucketKey, lengths: Sequence[int]) -> tuple[int, int]:
        return len(lengths), max(lengths)

    def _bind(self, key: BucketKey) -> BufferBinding:
        return BufferBinding(
            self._session, self.spec.signature, self.output_names, [(key.rows, key.length)]
        )


class SessionPerKeyExecutor(Executor):
    strategy = "session-per-key"

    def __init__(self, spec: ModelSpec, plan: BucketPlan) -> None:
        super().__init__(spec, plan)
        self.weights = SharedWeights(spec.onnx_path)

    @property
    def sessions(self) -> list[ort.InferenceSession]:
        return [b.session for b in self._bindings.values()]

    def batch_shape(self, key: BucketKey, lengths: Sequence[int]) -> tuple[int, int]:
        return key.rows, key.length

    def _bind(self, key: BucketKey) -> BufferBinding:
        sig = self.spec.signature
        session = create_session(
            self.spec.onnx_path,
            self.spec.config.providers,
            weights=self.weights,
            static_dims={sig.batch_dim: key.rows, sig.time_dim: key.length},
        )
        return BufferBinding(session, sig, self.output_names, [(key.rows, key.length)])


class MutableExecutor(Executor):
    strategy = "mutable"

    def __init__(self, spec: ModelSpec, plan: BucketPlan) -> None:
        super().__init__(spec, plan)
        session = create_session(spec.onnx_path, spec.config.providers)
        shapes = [(k.rows, k.length) for k in plan.all_keys()]
        self._binding = BufferBinding(session, spec.signature, self.output_names, shapes)

    @property
    def sessions(self) -> list[ort.InferenceSession]:
        return [self._binding.session]

    def batch_shape(self, key: BucketKey, lengths: Sequence[int]) -> tuple[int, int]:
        return len(lengths), max(lengths)

    def _bind(self, key: BucketKey) -> BufferBinding:
        return self._binding  # every key shares the max-shape buffers


def make_executor(strategy: str, spec: ModelSpec, plan: BucketPlan) -> Executor:
    classes: dict[str, type[Executor]] = {
        cls.strategy: cls for cls in (SharedSessionExecutor, SessionPerKeyExecutor, MutableExecutor)
    }
    return classes[strategy](spec, plan)

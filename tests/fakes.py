"""The one fake of the model seam: a real `Model` (validation, collate, split, bucket plan)
over a runner that computes in numpy instead of ONNX Runtime, records every batch, holds
batches at a gate, counts how many run at once and fails on demand.

The engine is built from ready models, so the scheduler, admission, edge and protocol tests
hand it this one and run in milliseconds.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import numpy as np

from bucketserve.core.bucketing import BucketKey, BucketPlan, Invariance
from bucketserve.core.layout import Input, InputRole, Layout, Tensor
from bucketserve.core.memory import Footprint
from bucketserve.core.model import Model, ModelInfo, SequenceRules
from bucketserve.core.task import Task
from bucketserve.core.tasks.embedding import Embedding

IDS = np.dtype(np.int64)
LAYOUT = Layout(
    inputs=(
        Input(Tensor("ids", IDS, (None, None), batch_axis=0, time_axis=1), InputRole.TOKENS, 0),
        Input(Tensor("mask", IDS, (None, None), batch_axis=0, time_axis=1), InputRole.MASK, 0),
    ),
    outputs=(
        Tensor("doubled", IDS, (None, None), batch_axis=0, time_axis=1),  # each id times 2
        Tensor("total", IDS, (None,), batch_axis=0),  # the sum of a sequence's ids
    ),
)


class FakeExecutor:
    """Runs batches in numpy: `doubled` = ids x 2 per step, `total` = the masked sum."""

    binding = "fake"

    def __init__(self) -> None:
        self.batches: list[tuple[BucketKey, list[int]]] = []  # each batch's key, row lengths
        self.first_ids: list[list[int]] = []  # each batch's rows, by their first id
        self.gate = threading.Event()  # batches wait here while it is clear
        self.gate.set()
        self.gated_from = 0  # only batches of at least this length wait at the gate
        self.entered = threading.Event()  # set once a batch has started
        self.failure: Exception | None = None  # raised by a batch while set,
        self.fail_on: int | None = None  # or only by one with a row that starts with this id
        self.running = 0  # batches inside `run` now
        self.most_at_once = 0
        self._lock = threading.Lock()
        self._bound: set[BucketKey] = set()

    @property
    def providers(self) -> list[str]:
        return ["numpy"]

    @property
    def sequences(self) -> int:
        return sum(len(lengths) for _, lengths in self.batches)

    def bound_key_count(self) -> int:
        return len(self._bound)

    def batch_shape(self, key: BucketKey, lengths: Sequence[int]) -> tuple[int, int]:
        return len(lengths), max(lengths)

    def prepare(self, key: BucketKey) -> bool:
        bound = key not in self._bound
        self._bound.add(key)
        return bound

    def run(
        self, key: BucketKey, feeds: Mapping[str, np.ndarray], rows: int, length: int
    ) -> dict[str, np.ndarray]:
        ids, mask = feeds["ids"], feeds["mask"]
        assert ids.shape == mask.shape == (rows, length)
        self.prepare(key)  # bound on first use, like the real executors
        firsts = [int(i) for i in ids[:, 0]]
        with self._lock:
            self.batches.append((key, [int(n) for n in mask.sum(axis=1)]))
            self.first_ids.append(firsts)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            self.entered.set()
            if length >= self.gated_from and not self.gate.wait(timeout=30):
                raise TimeoutError("test gate never opened")
            if self.failure is not None and self.fail_on in (None, *firsts):
                raise self.failure
            return {"doubled": ids * 2, "total": (ids * mask).sum(axis=1)}
        finally:
            with self._lock:
                self.running -= 1


def fake_model(
    name: str = "fake",
    *,
    edges: tuple[int, ...] = (8, 16, 32, 64, 128),
    max_batch_size: int = 8,
    max_batch_tokens: int | None = None,
    queue_capacity: int = 2048,
    max_queue_delay_ms: float = 0,
    embedding: Embedding | None = None,
    invariance: Invariance | None = None,
    footprint: Footprint | None = None,
    budget: int | None = None,
) -> tuple[Model, FakeExecutor]:
    """A ready model over `FakeExecutor`, and the executor (to read or gate its batches).
    `invariance`: what its check found (default: batching and padding move nothing);
    `footprint` and `budget`: what a batch needs in memory, in what the process has (default:
    not bounded)."""
    tokens = max_batch_tokens or max_batch_size * edges[-1]
    plan = BucketPlan(edges, max_batch_size, tokens, footprint=footprint, budget=budget)
    info = ModelInfo(
        name=name,
        version=1,
        layout=LAYOUT,
        plan=plan,
        rules=SequenceRules(dtype=IDS, max_length=edges[-1], vocab_size=1000),
        max_queue_delay_s=max_queue_delay_ms / 1000,
        queue_capacity=queue_capacity,
        invariance=invariance or Invariance(padding=0.0, batching=0.0, tolerance=1e-4),
        text_chars=None,
        served_config={"name": name, "version": "1", "strategy": "fake"},
        task_rules={} if embedding is None else {Task.EMBED: embedding},
    )
    executor = FakeExecutor()
    return Model(info, executor), executor

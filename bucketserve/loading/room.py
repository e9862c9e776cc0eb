"""The room a model's batches have: the memory budget every batch running at once shares,
and what one batch of the model needs in it (its footprint, measured here first, before
anything runs the model at length). From the two, what serving may run and so what load time
may: sequences up to the longest whose batch of one fits the budget (its buckets end there),
and at each length as many rows as the batch tokens and the budget allow. Whether the model's
sessions draw on the process's shared arena is decided here too: a model whose largest batch
is large runs without it, so that what a run takes is given back when it ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bucketserve.core.bucketing import BucketPlan
from bucketserve.core.budget import Hold, MemoryBudget
from bucketserve.core.memory import Footprint
from bucketserve.errors import ConfigError
from bucketserve.loading.footprint import FOOTPRINT_FILE, measure_footprint
from bucketserve.loading.layouts import input_layout, sequence_rules
from bucketserve.loading.repository import ModelSpec
from bucketserve.loading.served_file import served_graph
from bucketserve.runtime.memory import memory_limit
from bucketserve.runtime.sessions import create_session, run_all, runs_on_cpu
from bucketserve.settings import Settings

log = logging.getLogger(__name__)

# A model whose largest batch needs more than this runs off the process's arena: the arena
# keeps the most it ever held (and grows by doubling), which for batches this large is
# memory the budget would not see; below it, the arena's reuse is worth 3-7% of a short
# batch's time (minilm, 1 x 16 to 4 x 24; minilm's largest batch, 16 x 256, needs ~250 MiB).
ARENA_MOST = 2**30
ARENA_PART = 1 / 8  # (nor more than this part of the budget)


def footprint_of(
    spec: ModelSpec, binding: str, cache_dir: Path, budget: int | None, hold: Hold | None = None
) -> Footprint | None:
    """What a batch of `spec` needs in memory, measured on a session of its own, its points
    kept beside the server's copy of the graph (named by its content: the same graph,
    whatever its config says, is measured once); None where nothing bounds the process's
    memory, or the model runs on a device whose memory is its own."""
    graph = served_graph(spec, cache_dir, binding == "session-per-key")
    if budget is None or not runs_on_cpu(list(graph.providers)):
        return None
    session = create_session(dataclasses.replace(graph, arena=False))
    return measure_footprint(
        spec.name,
        functools.partial(run_all, session),
        input_layout(spec),
        sequence_rules(spec),
        spec.config.batching.max_batch_tokens,
        budget,
        graph.path.parent / FOOTPRINT_FILE,
        batched=not spec.axes.batch_fixed,
        hold=hold,
    )


@dataclass(frozen=True)
class Room:
    """`budget`: the bytes every batch running at once may need together (None: no bound);
    `footprint`: what one batch of the model needs (None: not measured); `hold`: where
    each run at load holds what it needs (None: the load has the process to itself)."""

    budget: int | None
    footprint: Footprint | None
    hold: Hold | None = None  # what holds a load-time run's memory (a load beside serving)

    def longest(self, spec: ModelSpec) -> int:
        """The longest bucket, or the longest length whose batch of one fits the budget
        where that is shorter; ConfigError where not even one step fits."""
        longest = spec.config.batching.longest
        if self.footprint is None or self.budget is None:
            return longest
        fits = self.footprint.longest(self.budget)
        if fits < 1:
            raise ConfigError(
                f"model {spec.name}: a batch of one sequence of one step needs "
                f"{_gib(self.footprint.need(1, 1))}, more than the memory budget "
                f"({_gib(self.budget)}): give the server more memory (--memory-budget, or the "
                "container's limit)"
            )
        return min(longest, fits)

    def edges(self, spec: ModelSpec) -> list[int]:
        """The config's bucket edges up to `longest`, and it the last."""
        longest = self.longest(spec)
        return [*(e for e in spec.config.batching.edges if e < longest), longest]

    def rows_at(self, spec: ModelSpec) -> Callable[[int], int]:
        """The most rows a batch of each length may hold: within the batch tokens and the
        budget (max_batch_size aside: the probe needs a few rows to find a batch axis)."""
        batching = spec.config.batching
        plan = BucketPlan(
            tuple(self.edges(spec)),
            batching.max_batch_tokens,  # (rows bounded by the tokens alone)
            batching.max_batch_tokens,
            footprint=self.footprint,
            budget=self.budget,
        )
        return plan.capacity

    def allows(self, spec: ModelSpec) -> Callable[[int, int], bool]:
        """Whether serving may run a batch of (rows, length): what load time may run."""
        longest, rows_at = self.longest(spec), self.rows_at(spec)
        return lambda rows, length: length <= longest and rows <= rows_at(length)

    def holding(self, rows: int, length: int) -> AbstractContextManager[None]:
        """A block during which a load-time run of (rows, length) holds its memory in the
        budget (nothing held where the load has the process to itself)."""
        if self.hold is None or self.footprint is None:
            return contextlib.nullcontext()
        return self.hold(self.footprint.need(rows, length))

    def arena(self, spec: ModelSpec) -> bool:
        """Whether the model's sessions draw on the process's arena: unless its largest
        batch (a full batch at any bucket) needs more than `ARENA_MOST`, or than
        `ARENA_PART` of the budget."""
        if self.footprint is None:
            return True
        rows_at = self.rows_at(spec)
        batch_size = spec.config.batching.max_batch_size
        largest = max(
            self.footprint.need(min(batch_size, rows_at(edge)), edge) for edge in self.edges(spec)
        )
        return largest <= min(ARENA_MOST, (self.budget or ARENA_MOST) * ARENA_PART)

    def described(self, spec: ModelSpec, plan: BucketPlan, arena: bool) -> dict[str, Any]:
        """The config route's `memory`: the budget, the footprint, the longest sequence
        served and why, and whether the sessions draw on the shared arena."""
        described: dict[str, Any] = {
            "budget_bytes": self.budget,
            "longest": plan.max_length,
            "arena": arena,
        }
        if self.footprint is not None:
            described["footprint"] = self.footprint.described()
            key = plan.default_key
            described["default_key_bytes"] = plan.need(key.rows, key.length)
        if plan.max_length < spec.config.batching.longest:
            described["cut_from"] = spec.config.batching.longest
        return described


def _gib(size: float) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


# Kept out of the budget for the request path (bodies, tokens, answers): this part of the
# limit, and at least RESERVE_LEAST
RESERVE_PART = 1 / 16
RESERVE_LEAST = 256 * 2**20


def memory_budget(settings: Settings, specs: Sequence[ModelSpec]) -> MemoryBudget:
    """The bytes every batch running at once may need together: --memory-budget, else the
    limit the process runs under (its container's, else the machine's) less what is held at
    start, twice the models' files (a session's weights, and the copies it packs them into),
    each model's result cache and a reserve for the request path; said in the log."""
    given = settings.memory_budget_bytes()
    if given is not None:
        log.info("memory budget for batches: %s (--memory-budget)", _gib(given))
        return MemoryBudget(given, "--memory-budget")
    limit = memory_limit()
    if limit is None:
        log.info("memory budget for batches: none (no memory limit can be read here)")
        return MemoryBudget(None, "none")
    files = sum(
        path.stat().st_size
        for spec in specs
        for path in spec.onnx_path.parent.rglob("*")
        if path.is_file()
    )
    caches = len(specs) * int(settings.result_cache_mb * 2**20)
    reserve = max(RESERVE_LEAST, int(limit.limit * RESERVE_PART)) + caches
    total = limit.room - 2 * files - reserve
    if total <= 0:
        raise ConfigError(
            f"memory_budget: {limit.source} is {_gib(limit.limit)}, of which {_gib(limit.held)} "
            f"is held and the models' files take {_gib(files)}: no room is left for batches; "
            "give the server more memory, or set --memory-budget"
        )
    log.info(
        "memory budget for batches: %s (%s %s, %s held, the models' files %s, reserve %s)",
        _gib(total),
        limit.source,
        _gib(limit.limit),
        _gib(limit.held),
        _gib(files),
        _gib(reserve),
    )
    return MemoryBudget(total, limit.source)

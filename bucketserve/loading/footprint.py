"""A model's footprint, measured at load, before anything else runs it at length: the peak
bytes one run holds above the idle process at a few (rows, length) points, fitted as fixed +
rows x length + rows x length² (`core.memory`).

The points grow from short to long, one sequence each, doubling the length, then a few
rows at a middle length; a point is run only where the curve fitted so far says it needs at
most half the budget (from one doubling to the next the cost at most quadruples, where a
curve fitted over shorter lengths may have said it doubles: a point is never run past the
budget). Every point is a shape serving runs: one sequence up to the longest bucket, rows
within `max_batch_tokens`. The runs are on a session of their own without ONNX Runtime's
arena, which frees what a run allocates when it ends, so each peak is the run's own; the
model's first short run, before any is measured, reads every weight in. The points are kept
beside the server's copy of the graph (named by its content), so a restart reads them back
and runs only the points its budget allows that were not measured.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from bucketserve.core.budget import Hold
from bucketserve.core.layout import Layout
from bucketserve.core.memory import Footprint, fit_footprint
from bucketserve.core.model import SequenceRules
from bucketserve.loading.check import random_sequences
from bucketserve.runtime.memory import peak_of

log = logging.getLogger(__name__)

Run = Callable[[Mapping[str, np.ndarray]], object]  # feeds -> every output (one plain run)
Point = tuple[int, int, int]  # rows, length, peak bytes

SHORTEST = 64  # the first length measured
SHARE = 0.5  # a point is run where the curve so far says it needs at most this of the budget
ROWS = (2, 4)  # the rows of the points that tell how a batch grows with its rows
FORMAT = "1"  # bumped when what the cache keeps changes
FOOTPRINT_FILE = "footprint.json"  # the points, beside the server's copy of a graph


def lengths_to_measure(longest: int) -> list[int]:
    """One sequence at each: SHORTEST, doubling, then the longest (and no more)."""
    lengths, length = [], SHORTEST
    while length < longest:
        lengths.append(length)
        length *= 2
    return [*lengths, longest]


def measure_footprint(
    name: str,
    run: Run,
    inputs: Layout,
    rules: SequenceRules,
    max_batch_tokens: int,
    budget: int | None,
    cache: Path | None = None,
    batched: bool = True,
    hold: Hold | None = None,
) -> Footprint | None:
    """The model's footprint up to `rules.max_length`, within `budget` (None: every point);
    `batched` False: a model whose batch is fixed at one is measured on one sequence only;
    `hold`: where each point holds what it may need (a load beside serving: the most the
    curve so far allows a point, twice what it says, or the budget's share).
    None where no point runs (a model that runs on none of these lengths is measured by
    nothing here; the probe will say why)."""
    kept = _read(cache)
    points: dict[tuple[int, int], int] = dict(kept)
    log.debug("model %s: footprint points kept: %s", name, sorted(points))

    def measured(rows: int, length: int) -> int | None:
        if (rows, length) in points:
            return points[(rows, length)]
        held = 0
        if budget is not None and len(points) >= 2:
            predicted = _fitted(points).need(rows, length)
            if predicted > budget * SHARE:
                return None
            held = int(min(budget * SHARE, 2 * predicted))
        sequences = random_sequences(rules, [length] * rows, seed=length + rows)
        log.debug("model %s: load runs %d x %d (its footprint)", name, rows, length)
        try:
            feeds = inputs.collate(sequences, rows, length)
            with hold(held) if hold is not None and held else contextlib.nullcontext():
                _, peak = peak_of(lambda: run(feeds))
        except Exception as exc:  # ONNX Runtime's own types: a length it does not run
            log.debug("model %s: the footprint's %d x %d did not run: %s", name, rows, length, exc)
            return None
        points[(rows, length)] = peak
        return peak

    warm = random_sequences(rules, [min(8, rules.max_length)], seed=1)
    try:
        run(inputs.collate(warm, 1, len(warm[0])))  # (every weight read in: not a run's)
    except Exception:  # (a model that needs more steps: the points find where it runs)
        log.debug("model %s: the footprint's first short run did not run", name)
    alone = [n for n in lengths_to_measure(rules.max_length) if measured(1, n) is not None]
    if not alone:
        return None
    middle = alone[min(len(alone) - 1, 3)]  # (512 tokens, or the longest measured below it)
    for rows in ROWS if batched else ():
        length = min(middle, max_batch_tokens // rows)
        if length >= alone[0]:
            measured(rows, length)
    _write(cache, points, kept)
    footprint = _fitted(points)
    log.info(
        "model %s: a batch needs %s (measured at %s)",
        name,
        described_need(footprint),
        ", ".join(f"{r}x{n}: {_mib(b)}" for (r, n), b in sorted(points.items())),
    )
    return footprint


def _fitted(points: Mapping[tuple[int, int], int]) -> Footprint:
    return fit_footprint([(r, n, b) for (r, n), b in sorted(points.items())])


def described_need(footprint: Footprint) -> str:
    """The curve in words, for the log: fixed, per token and per token squared."""
    return (
        f"{_mib(footprint.fixed)} + {footprint.per_token / 1024:.2f} KiB a token + "
        f"{footprint.per_square:.4g} B a token² (per row)"
    )


def _mib(size: float) -> str:
    return f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size / 1024:.0f} KiB"


def _read(cache: Path | None) -> dict[tuple[int, int], int]:
    """The points kept for this content (none when none were, or the file is not ours)."""
    if cache is None or not cache.is_file():
        return {}
    try:
        kept = json.loads(cache.read_text(encoding="utf-8"))
        if kept.get("format") != FORMAT:
            return {}
        return {(int(r), int(n)): int(b) for r, n, b in kept["points"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _write(
    cache: Path | None,
    points: Mapping[tuple[int, int], int],
    kept: Mapping[tuple[int, int], int],
) -> None:
    """The points kept for the next load, where any was measured now (best effort: a cache
    that cannot be written costs the next load its runs, nothing else)."""
    if cache is None or points.keys() == kept.keys():
        return
    content = {"format": FORMAT, "points": [[r, n, b] for (r, n), b in sorted(points.items())]}
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        written = cache.with_suffix(".tmp")
        written.write_text(json.dumps(content), encoding="utf-8")
        written.replace(cache)
    except OSError as exc:
        log.warning("%s: the footprint's points not kept (%s)", cache, exc.strerror)

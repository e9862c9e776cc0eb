"""The bucket planner: bucket edges fitted to observed request lengths.

Pure arithmetic. A sequence of length L in a bucket with edge E computes E positions, E - L of
them padding. Given a sample of lengths and a number of keys K, `plan_edges` finds the K edges
that minimise the expected padded positions, exactly, by dynamic programming over the distinct
lengths (an optimal edge always sits on an observed length). `power_of_two_edges` is the usual
hand-made alternative it is compared against. `bucket_edges` is the ladder a model gets when
no traffic is known (what `models import` writes), and `extended` carries a plan fitted to a
sample up to a model's longest with it: past the traffic seen, a sequence still has a bucket
near its own length, never one it shares with sequences many times shorter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SHORTEST_EDGE = 16


@dataclass(frozen=True)
class Plan:
    edges: tuple[int, ...]
    waste: float  # expected padded / computed positions


def read_lengths(path: Path) -> list[int]:
    """A length sample: one positive integer per line (blank lines and # comments skipped)."""
    lengths = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if text:
            if not text.isdigit() or int(text) < 1:
                raise ValueError(f"line {number}: {text!r} is not a positive length")
            lengths.append(int(text))
    if not lengths:
        raise ValueError("no lengths in the sample")
    return lengths


def padding_waste(lengths: Iterable[int], edges: Sequence[int]) -> float:
    """Padded positions over computed positions when each length pads to its bucket's edge."""
    sample = np.asarray(list(lengths), np.int64)
    if sample.size == 0:
        return 0.0
    if sample.max() > edges[-1]:
        raise ValueError(f"length {sample.max()} is longer than the last edge {edges[-1]}")
    padded_to = np.asarray(edges)[np.searchsorted(edges, sample)]
    return float((padded_to - sample).sum() / padded_to.sum())


def bucket_edges(longest: int) -> list[int]:
    """Edges from 16 up to `longest`: 8 tokens apart up to 64, then the step doubles each
    time the edge reaches eight steps (16 apart to 128, 32 to 256, ...): past 64 tokens a
    bucket is 1/8 to 1/4 longer than the one before. Where a sequence costs the most, its
    padding does too: with buckets 1.5 times the one before, a rerank load of passages
    (median ~65 tokens) ran 0.88x a server that runs one pair at a time; with these, 0.99x."""
    edges, step, edge = [], 8, SHORTEST_EDGE
    while edge < longest:
        edges.append(edge)
        if edge >= 8 * step:
            step *= 2
        edge += step
    return [*edges, longest]


def extended(edges: Sequence[int], longest: int, longest_seen: int) -> tuple[int, ...]:
    """`edges` fitted to a sample and ending at `longest`: past the sample's longest, the
    ladder of `bucket_edges` in place of the one bucket that reached `longest` (unchanged
    where the fit padded the longest seen to `longest` itself)."""
    fitted = [e for e in edges if e < longest]
    if not fitted or fitted[-1] < longest_seen:
        return tuple(edges)
    return (*fitted, *(e for e in bucket_edges(longest) if e > fitted[-1]))


def power_of_two_edges(max_length: int, smallest: int = 8) -> tuple[int, ...]:
    edges = [smallest]
    while edges[-1] < max_length:
        edges.append(edges[-1] * 2)
    return (*edges[:-1], max_length) if edges[-1] > max_length else tuple(edges)


def plan_edges(lengths: Iterable[int], keys: int, max_length: int | None = None) -> Plan:
    """The `keys` edges minimising padding for this sample; the last edge is `max_length`
    (default: the longest length seen), so every length the server accepts has a bucket."""
    counts = Counter(int(n) for n in lengths)
    if not counts or min(counts) < 1:
        raise ValueError("need a sample of positive lengths")
    top = max_length if max_length is not None else max(counts)
    if max(counts) > top:
        raise ValueError(f"sample holds length {max(counts)} > max_length {top}")
    counts[top] += 0  # the top edge must exist even if no sample reaches it
    values = np.array(sorted(counts), np.int64)
    weights = np.array([counts[v] for v in values], np.float64)
    n = len(values)
    keys = min(keys, n)
    # prefix sums: a group values[i..j] padded to values[j] computes values[j] * count positions
    c = np.concatenate([[0.0], np.cumsum(weights)])
    best = np.full((keys + 1, n), np.inf)  # best[k, j]: k groups covering values[0..j]
    choice = np.zeros((keys + 1, n), np.int64)
    best[1] = values * c[1:]
    for k in range(2, keys + 1):
        for j in range(k - 1, n):
            starts = np.arange(k - 1, j + 1)  # the last group is values[i..j]
            cost = best[k - 1, starts - 1] + values[j] * (c[j + 1] - c[starts])
            i = int(np.argmin(cost))
            best[k, j], choice[k, j] = cost[i], starts[i]
    k = int(np.argmin(best[1:, n - 1])) + 1  # fewer keys if that is as good
    edges, j = [], n - 1
    while k >= 1:
        edges.append(int(values[j]))
        j = int(choice[k, j]) - 1
        k -= 1
    edges.reverse()
    sample = [v for v, w in counts.items() for _ in range(w)]
    return Plan(tuple(edges), padding_waste(sample, edges))

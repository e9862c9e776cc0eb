"""The invariance check, run at load: what do padding and batching do to a model's answers?

Two measurements, each over a few random batches of sequences that avoid reserved ids, each
the worst difference from the model run on every sequence alone, unpadded. Batches run the way
serving runs them (into bound buffers at the batch's shape, `together`), with rows of very
different scale side by side (a quiet clip beside a loud one: a model that normalises over the
batch moves), at short lengths and at the longest bucket's:

- padding: sequences of different lengths in one batch, padded to a longer length, with a pad
  row (what a bucket does). An unmasked pooling or an RNN without `sequence_lens` moves here.
- batching: sequences of one length in one batch, no padding at all. A model whose rows
  change each other (int8 dynamic quantisation takes its scale from the whole batch) moves.

Where the builder can make sequences like the traffic's (`Traffic`: a text model's texts
tokenised, pairs for a pair classifier), the rounds run those. Where the config forces a
policy, the figures become the bound its warning states, so three more rounds run them as
serving does: a full batch of one length, unpadded (batching), and full batches of natural
lengths padded to a middle bucket's edge and to the longest (padding), every row against its
run alone. A model whose rows change each other (int8) moves more on full batches of text than
on a few random rows.

From the two, the serving policy (`Invariance.policy`): length buckets when neither moves,
exact-length groups when only padding does, one sequence per run when batching does. Either
way every answer stays within the tolerance of the model run alone.

A third figure, the spread, says whether the model reads its input as it is fed at all: how
far apart the answers of different sequences of one length are, each alone. None (every
sequence answered alike) is a model that cannot be served as configured: a mask that points
the other way hides every real step (`builder` tries the other way round).

A model that runs only at multiples of some length (a detector's width at 32) has no
unpadded run: alone, a sequence runs padded up to the next multiple, its outputs cut back, and
that is the answer every batch must give.

`thread_difference` asks the same of a second session on more threads (the one a batch that
runs alone gets): its batches against the first session's runs of each sequence alone.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np

from bucketserve.core.bucketing import Invariance
from bucketserve.core.layout import Layout
from bucketserve.core.model import SequenceRules
from bucketserve.errors import ConfigError

log = logging.getLogger(__name__)

Run = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]  # feeds -> every output
# the lengths asked, and a seed -> a valid sequence of each length, like the traffic's
Sequences = Callable[[Sequence[int], int], list[np.ndarray]]
# feeds of (rows, length) -> every output, as serving runs them (bound buffers of that shape)
BatchRun = Callable[[Mapping[str, np.ndarray], int, int], dict[str, np.ndarray]]

ROWS = (2, 3, 4)  # one short round of the check per entry: that many sequences of one length
SHORT = 24  # short rounds' lengths lie within this many steps of the shortest
SCALES = (1.0, 1e-3, 50.0, 0.05)  # row i of a features batch is scaled by SCALES[i % 4]
IGNORED = 1e-6  # a spread no wider: different sequences answered alike, the input not read
TRAFFIC_ROWS = 32  # the most rows a traffic-like round runs (a full batch, within the check's time)


@dataclass(frozen=True)
class Traffic:
    """What the check's traffic-like rounds run: `sequences` like the traffic's (a text
    model's tokenised texts, a pair classifier's pairs), `rows` a full batch holds at a
    length (the config's batch limits)."""

    sequences: Sequences
    rows: Callable[[int], int]


def random_sequences(
    rules: SequenceRules, lengths: Sequence[int], seed: int = 0, scaled: bool = False
) -> list[np.ndarray]:
    """Random valid sequences for a model, one per length (token ids avoid reserved ids);
    `scaled`: features rows of very different magnitude (`SCALES`)."""
    rng = np.random.default_rng(seed)
    if rules.vocab_size is None:
        # Integer features (16-bit audio samples) at the levels real ones have: a tenth of
        # the type's range, clipped to it (a standard normal would be near silence, +-3)
        dtype = np.dtype(rules.dtype)
        level = np.iinfo(dtype).max / 10 if dtype.kind in "iu" else 1.0
        low, high = (
            (np.iinfo(dtype).min, np.iinfo(dtype).max) if dtype.kind in "iu" else (None, None)
        )
        return [
            np.clip(
                rng.standard_normal((n, *rules.step_shape))
                * level
                * (SCALES[i % 4] if scaled else 1),
                low,
                high,
            ).astype(dtype)
            for i, n in enumerate(lengths)
        ]
    allowed = np.setdiff1d(np.arange(rules.vocab_size), rules.reserved_ids)
    return [rng.choice(allowed, n).astype(rules.dtype) for n in lengths]


def difference(together: np.ndarray, alone: np.ndarray) -> float:
    """max |together - alone| / (1 + |alone|): absolute near zero, relative for large values
    (np.allclose with rtol = atol). Two NaNs agree; a NaN and a number do not."""
    a, b = alone.astype(np.float64), together.astype(np.float64)
    if a.shape != b.shape:
        return float("inf")
    # (at least 1-d: one value a row, a [batch] output, is a 0-d array per sequence, and
    # numpy's arithmetic on 0-d arrays gives scalars, which take no assignment)
    gap = np.atleast_1d(np.abs(b - a) / (1 + np.abs(a)))
    a, b = np.atleast_1d(a), np.atleast_1d(b)
    gap[np.isnan(a) & np.isnan(b)] = 0.0
    return float(np.nan_to_num(gap, nan=np.inf).max(initial=0.0))


class OutsideServing(Exception):
    """A load-time run of a shape serving never runs (more rows or steps than the batch
    tokens or the memory budget allow): refused, so that it is never run."""


Allows = Callable[[int, int], bool]  # (rows, length) -> whether serving may run it
# (rows, length) -> a block during which the run's memory is held in the budget
Holding = Callable[[int, int], AbstractContextManager[None]]


def guarded(
    name: str, run: Run, inputs: Layout, allows: Allows, holding: Holding | None = None
) -> Run:
    """`run`, every shape it is asked logged (at debug: "load runs R x T") and refused when
    serving would not run it; `holding`: each run's memory held in the budget meanwhile (a
    model loaded beside those serving)."""
    tensor = inputs.sequence.tensor

    def checked(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        shape = feeds[tensor.name].shape
        rows = 1 if tensor.batch_axis is None else shape[tensor.batch_axis]
        length = 1 if tensor.time_axis is None else shape[tensor.time_axis]
        _allowed(name, allows, rows, length)
        with (holding or _nothing_held)(rows, length):
            return run(feeds)

    return checked


def guarded_batches(
    name: str, together: BatchRun, allows: Allows, holding: Holding | None = None
) -> BatchRun:
    """`together`, as `guarded`."""

    def checked(feeds: Mapping[str, np.ndarray], rows: int, length: int) -> dict[str, np.ndarray]:
        _allowed(name, allows, rows, length)
        with (holding or _nothing_held)(rows, length):
            return together(feeds, rows, length)

    return checked


def _nothing_held(rows: int, length: int) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


def _allowed(name: str, allows: Allows, rows: int, length: int) -> None:
    log.debug("model %s: load runs %d x %d", name, rows, length)
    if not allows(rows, length):
        log.error("model %s: load asked for %d x %d, which serving never runs", name, rows, length)
        raise OutsideServing(f"{rows} x {length} is a batch serving never runs")


def plainly(run: Run) -> BatchRun:
    """`run` as a BatchRun (it needs no shape)."""
    return lambda feeds, rows, length: run(feeds)


class _Runs:
    """The model's runs for the check: each sequence alone (a plain run) once, remembered.
    Batches run on `together`."""

    def __init__(
        self, name: str, run: Run, layout: Layout, rules: SequenceRules, together: BatchRun
    ) -> None:
        self.name, self.run, self.layout, self.together = name, run, layout, together
        self.rules = rules
        self.failures: list[str] = []
        self._alone: dict[int, tuple[np.ndarray, dict[str, np.ndarray]]] = {}

    def batch(
        self, sequences: list[np.ndarray], rows: int, length: int, run: BatchRun | None = None
    ) -> list[dict[str, np.ndarray]]:
        feeds = self.layout.collate(sequences, rows, length)
        outputs = (run or self.together)(feeds, rows, length)
        return self.layout.split(outputs, [len(s) for s in sequences])

    def alone(self, sequence: np.ndarray) -> dict[str, np.ndarray]:
        key = id(sequence)
        if key in self._alone:
            return self._alone[key][1]
        try:
            length = self.rules.run_length(len(sequence))
            (answer,) = self.batch([sequence], 1, length, plainly(self.run))
        except Exception as exc:  # ONNX Runtime raises its own types
            raise ConfigError(
                f"model {self.name}: fails on one random valid sequence of length "
                f"{len(sequence)} ({exc}): check the config's vocab_size and input roles"
            ) from None
        self._alone[key] = (sequence, answer)  # the sequence kept alive: its id stays its own
        return answer

    def apart(self, sequences: list[np.ndarray]) -> float:
        """How far the answers of different `sequences` (of one length) are from the first's,
        each run alone: the most any output of any of them differs."""
        first = self.alone(sequences[0])
        return max(
            difference(self.alone(seq)[name], first[name])
            for seq in sequences[1:]
            for name in first
        )

    def worst(self, sequences: list[np.ndarray], rows: int, length: int, what: str) -> float:
        """The worst difference of `sequences` run together, padded to `length` (up to the
        length the model runs at), from each run alone."""
        length = self.rules.run_length(length)
        try:
            together = self.batch(sequences, rows, length)
        except Exception as exc:  # a batch the model cannot run is one it cannot be served
            # (the runtime's own words to the log; the config route gets the server's)
            log.warning("model %s: %s (%d x %d) failed: %s", self.name, what, rows, length, exc)
            self.failures.append(f"{what} ({rows} x {length}) {failed_because(exc)}")
            return float("inf")
        return max(
            difference(t[name], a[name])
            for seq, t in zip(sequences, together, strict=True)
            for a in [self.alone(seq)]
            for name in a
        )


def failed_because(exc: Exception) -> str:
    """How a run failed, as the server says it: for memory, with the bytes the runtime asked
    for (its own words stay in the log)."""
    asked = re.search(r"allocate[^0-9]*?(\d{6,})", str(exc))
    if asked is not None:
        return f"failed for memory: the runtime could not allocate {int(asked[1]) / 2**30:.2f} GiB"
    if "alloc" in str(exc).lower():
        return "failed for memory: the runtime could not allocate what it asked for"
    return "failed in the runtime"


def measure(
    name: str,
    run: Run,
    together: BatchRun,
    layout: Layout,
    rules: SequenceRules,
    edges: Sequence[int],
    tolerance: float,
    batched: bool = True,
    traffic: Traffic | None = None,
    full: bool = False,
    rows_at: Callable[[int], int] | None = None,
) -> tuple[Invariance, list[str]]:
    """What padding and batching do to the model, and any batch it could not run at all
    (`batched` False: a model that runs one sequence at a time, only run alone; `traffic`:
    sequences like the traffic's, in place of random ones; `full`: its full batches too;
    `rows_at`: the most rows a batch of each length may hold, as serving runs them, within
    the batch tokens and the memory budget: no round runs more).

    Each round's sequences, of one length, are run alone, together unpadded (batching), and
    together padded to their bucket's edge or further with a pad row (padding): three short
    rounds and one at the longest bucket. One sequence of every round then makes a padded
    batch of mixed lengths, the shortest padded to the longest bucket. Every sequence is also
    run alone the way serving runs it: a model that answers otherwise there cannot be served
    (ConfigError). 21 runs in all (a model that runs one sequence at a time runs a second
    sequence of each round alone too: the spread is between two). A round whose batch would
    be more rows than `rows_at` allows there runs what it allows (a batch of one measures
    nothing of batching: then only its sequences alone).
    """
    runs = _Runs(name, run, layout, rules, together)
    rng = np.random.default_rng(0)
    lo, hi = rules.min_length, rules.max_length
    short = min(hi, lo + SHORT - 1)
    allowed = rows_at or (lambda length: 1 << 30)

    def padded_to(length: int) -> int:
        edge = edges[int(np.searchsorted(edges, length))] if length <= edges[-1] else hi
        return max(min(edge, hi), min(hi, length + max(8, length // 4)))

    padding = batching = spread = 0.0
    mixed: list[np.ndarray] = []
    rounds = [(rows, int(rng.integers(lo, short + 1))) for rows in ROWS] + [(2, hi)]
    if rules.run_length(rounds[0][1]) <= hi:  # (the one length whose run alone is unpadded,
        rounds[0] = (ROWS[0], rules.run_length(rounds[0][1]))  # for a model with a multiple)
    for seed, (rows, length) in enumerate(rounds):
        sequences = (
            traffic.sequences([length] * rows, seed)
            if traffic is not None
            else random_sequences(rules, [length] * rows, seed, scaled=True)
        )
        served = runs.worst(sequences[:1], 1, length, "a sequence alone")
        if not served <= tolerance:
            raise ConfigError(_unserved(name, length, served, runs.failures))
        spread = max(spread, runs.apart(sequences[:2]))
        if not batched:
            continue
        fits = min(rows, allowed(rules.run_length(length)))
        if fits >= 2:
            batching = max(
                batching, runs.worst(sequences[:fits], fits, length, "an unpadded batch")
            )
        longer = rules.run_length(padded_to(length))
        fits = min(rows, allowed(longer) - 1)
        if longer > rules.run_length(length) and fits >= 1:
            padding = max(padding, runs.worst(sequences[:fits], fits + 1, longer, "a padded batch"))
        mixed.append(sequences[0] if length < hi else sequences[1])
    if not batched:
        return Invariance(float("inf"), float("inf"), tolerance, spread), runs.failures
    mixed = sorted(mixed, key=len)
    # (padded to the longest length its rows may run at: the longest bucket where they fit)
    reach = max(
        (n for n in (*edges, hi) if len(mixed[-1]) <= n <= hi and allowed(n) > len(mixed)),
        default=0,
    )
    if len(mixed[0]) < reach:
        padding = max(padding, runs.worst(mixed, len(mixed) + 1, reach, "a padded batch"))
    if traffic is not None and full:
        moved = _traffic_rounds(runs, traffic, [e for e in edges if e <= hi], rng, allowed)
        batching, padding = max(batching, moved[0]), max(padding, moved[1])
    return Invariance(padding, batching, tolerance, spread), runs.failures


def _unserved(name: str, length: int, served: float, failures: list[str]) -> str:
    """Why a model whose sequence alone, run as serving runs it, answers otherwise (or not at
    all) cannot be served: a runtime's failure for memory says memory."""
    if np.isfinite(served):
        how = f"otherwise than a plain run (by {served:.3g})"
        cause = "its declared outputs cannot hold what it computes"
    elif "for memory" in failures[-1]:
        how = f"not at all ({failures[-1]})"
        cause = (
            "serve it at a shorter length (a smaller max_length, or `long_inputs = "
            '"windows"`), or give it more memory'
        )
    else:
        how = f"not at all ({failures[-1]})"
        cause = "the log says what the runtime refused"
    return (
        f"model {name}: run the way the server runs it (into buffers bound at its shape), a "
        f"sequence of {length} steps alone answers {how}: {cause}"
    )


def _traffic_rounds(
    runs: _Runs,
    traffic: Traffic,
    edges: Sequence[int],
    rng: np.random.Generator,
    allowed: Callable[[int], int],
) -> tuple[float, float]:
    """(batching, padding): a full batch of traffic-like sequences of one length at a middle
    bucket's edge, unpadded; and full batches of natural lengths (each within its bucket,
    from its previous edge) padded to that edge and to the longest."""
    rules = runs.rules
    middle = edges[(len(edges) - 1) // 2]

    def rows(edge: int) -> int:
        return min(max(2, min(TRAFFIC_ROWS, traffic.rows(edge))), allowed(edge))

    length = rules.run_length(max(rules.min_length, middle))
    same = traffic.sequences([length] * rows(length), 21)
    batching = runs.worst(same, len(same), length, "a full batch of traffic")
    padding = 0.0
    for seed, edge in enumerate(dict.fromkeys((middle, edges[-1])), 22):
        below = next((e for e in reversed(edges) if e < edge), rules.min_length - 1)
        low = max(rules.min_length, below + 1)
        lengths = sorted(int(n) for n in rng.integers(low, edge + 1, rows(edge)))
        natural = traffic.sequences(lengths, seed)
        padded = runs.worst(natural, len(natural), edge, "a padded full batch of traffic")
        padding = max(padding, padded)
    return batching, padding


def thread_difference(
    name: str, run: Run, other: Run, layout: Layout, rules: SequenceRules
) -> float:
    """The worst difference of `other` (the same graph in another session) from `run`, each
    sequence alone: on sequences alone, in batches of one length, and in batches padded past
    their longest with a pad row. Infinite when `other` fails on one."""
    runs = _Runs(name, run, layout, rules, plainly(other))
    rng = np.random.default_rng(1)
    lo, hi = rules.min_length, rules.max_length
    worst = 0.0
    for seed, rows in enumerate((1, *ROWS)):
        length = int(rng.integers(lo, min(hi, lo + SHORT - 1) + 1))
        sequences = random_sequences(rules, [length] * rows, seed)
        padded = min(hi, length + 8)
        worst = max(
            worst,
            runs.worst(sequences, rows, length, "a batch"),
            runs.worst(sequences, rows + 1, padded, "a padded batch"),
        )
    return worst

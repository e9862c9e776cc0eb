"""The invariance check, run at load: what do padding and batching do to a model's answers?

Two measurements, each over a few random batches of sequences that avoid reserved ids, each
the worst difference from the model run on every sequence alone, unpadded:

- padding: sequences of different lengths in one batch, padded to a longer length, with a pad
  row (what a bucket does). An unmasked pooling or an RNN without `sequence_lens` moves here.
- batching: sequences of one length in one batch, no padding at all. A model whose rows
  change each other (int8 dynamic quantisation takes its scale from the whole batch) moves.

From the two, the serving policy (`Invariance.policy`): length buckets when neither moves,
exact-length groups when only padding does, one sequence per run when batching does. Either
way every answer stays within the tolerance of the model run alone.

`thread_difference` asks the same of a second session on more threads (the one a batch that
runs alone gets): its batches against the first session's runs of each sequence alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from serve.core.bucketing import Invariance
from serve.core.layout import Layout
from serve.core.model import SequenceRules
from serve.errors import ConfigError

Run = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]  # feeds -> every output

ROWS = (2, 3, 4)  # one round of the check per entry: that many sequences of one length
LONGEST_PROBE = 24  # probe sequences are short: the check costs little at load


def random_sequences(
    rules: SequenceRules, lengths: Sequence[int], seed: int = 0
) -> list[np.ndarray]:
    """Random valid sequences for a model, one per length (token ids avoid reserved ids)."""
    rng = np.random.default_rng(seed)
    if rules.vocab_size is None:
        assert rules.feature_dim is not None
        return [rng.standard_normal((n, rules.feature_dim)).astype(rules.dtype) for n in lengths]
    allowed = np.setdiff1d(np.arange(rules.vocab_size), rules.reserved_ids)
    return [rng.choice(allowed, n).astype(rules.dtype) for n in lengths]


def difference(together: np.ndarray, alone: np.ndarray) -> float:
    """max |together - alone| / (1 + |alone|): absolute near zero, relative for large values
    (np.allclose with rtol = atol). Two NaNs agree; a NaN and a number do not."""
    a, b = alone.astype(np.float64), together.astype(np.float64)
    if a.shape != b.shape:
        return float("inf")
    gap = np.abs(b - a) / (1 + np.abs(a))
    gap[np.isnan(a) & np.isnan(b)] = 0.0
    return float(np.nan_to_num(gap, nan=np.inf).max(initial=0.0))


class _Runs:
    """The model's runs for the check: each sequence alone is run once and remembered.
    Batches run on `together` (by default the same `run`)."""

    def __init__(self, name: str, run: Run, layout: Layout, together: Run | None = None) -> None:
        self.name, self.run, self.layout = name, run, layout
        self.together = together or run
        self.failures: list[str] = []
        self._alone: dict[int, tuple[np.ndarray, dict[str, np.ndarray]]] = {}

    def batch(
        self, sequences: list[np.ndarray], rows: int, length: int, run: Run | None = None
    ) -> list[dict[str, np.ndarray]]:
        outputs = (run or self.together)(self.layout.collate(sequences, rows, length))
        return self.layout.split(outputs, [len(s) for s in sequences])

    def alone(self, sequence: np.ndarray) -> dict[str, np.ndarray]:
        key = id(sequence)
        if key in self._alone:
            return self._alone[key][1]
        try:
            (answer,) = self.batch([sequence], 1, len(sequence), self.run)
        except Exception as exc:  # ONNX Runtime raises its own types
            raise ConfigError(
                f"model {self.name}: fails on one random valid sequence of length "
                f"{len(sequence)} ({exc}): check the config's vocab_size and input roles"
            ) from None
        self._alone[key] = (sequence, answer)  # the sequence kept alive: its id stays its own
        return answer

    def worst(self, sequences: list[np.ndarray], rows: int, length: int, what: str) -> float:
        """The worst difference of `sequences` run together from each run alone."""
        try:
            together = self.batch(sequences, rows, length)
        except Exception as exc:  # a batch the model cannot run is one it cannot be served
            self.failures.append(f"{what} ({rows} x {length}) failed: {exc}")
            return float("inf")
        return max(
            difference(t[name], a[name])
            for seq, t in zip(sequences, together, strict=True)
            for a in [self.alone(seq)]
            for name in a
        )


def measure(
    name: str,
    run: Run,
    layout: Layout,
    rules: SequenceRules,
    edges: Sequence[int],
    tolerance: float,
) -> tuple[Invariance, list[str]]:
    """What padding and batching do to the model, and any batch it could not run at all.

    Each round's sequences, of one length, are run alone, together unpadded (batching), and
    together padded to their bucket's edge or further with a pad row (padding); one sequence
    of every round then makes a padded batch of mixed lengths. 16 runs in all.
    """
    runs = _Runs(name, run, layout)
    rng = np.random.default_rng(0)
    longest = max(1, min(rules.max_length - 1, LONGEST_PROBE))

    def padded_to(length: int) -> int:
        edge = edges[int(np.searchsorted(edges, length))]
        return max(edge, min(rules.max_length, length + 8))

    padding = batching = 0.0
    mixed: list[np.ndarray] = []
    for seed, rows in enumerate(ROWS):
        length = int(rng.integers(1, longest + 1))
        sequences = random_sequences(rules, [length] * rows, seed)
        batching = max(batching, runs.worst(sequences, rows, length, "an unpadded batch"))
        if padded_to(length) > length:
            padding = max(
                padding, runs.worst(sequences, rows + 1, padded_to(length), "a padded batch")
            )
        mixed.append(sequences[0])
    longest_mixed = max(len(s) for s in mixed)
    if padded_to(longest_mixed) > min(len(s) for s in mixed):
        padding = max(
            padding,
            runs.worst(mixed, len(mixed) + 1, padded_to(longest_mixed), "a padded batch"),
        )
    return Invariance(padding, batching, tolerance), runs.failures


def thread_difference(
    name: str, run: Run, other: Run, layout: Layout, rules: SequenceRules
) -> float:
    """The worst difference of `other` (the same graph in another session) from `run`, each
    sequence alone: on sequences alone, in batches of one length, and in batches padded past
    their longest with a pad row. Infinite when `other` fails on one."""
    runs = _Runs(name, run, layout, together=other)
    rng = np.random.default_rng(1)
    longest = max(1, min(rules.max_length - 1, LONGEST_PROBE))
    worst = 0.0
    for seed, rows in enumerate((1, *ROWS)):
        length = int(rng.integers(1, longest + 1))
        sequences = random_sequences(rules, [length] * rows, seed)
        padded = min(rules.max_length, length + 8)
        worst = max(
            worst,
            runs.worst(sequences, rows, length, "a batch"),
            runs.worst(sequences, rows + 1, padded, "a padded batch"),
        )
    return worst

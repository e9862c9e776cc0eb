"""Pad-safety self-check, run at load: does padding change a model's valid outputs?

A few random sequences are run alone, unpadded, and again together in one batch padded to a
longer length with a pad row. A model whose valid outputs move (an unmasked pooling, an RNN
without `sequence_lens`) is pad-sensitive: it is then served by grouping sequences of exactly
equal length, so its answers stay exact.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from serve.layout import Layout
from serve.model import SequenceRules

log = logging.getLogger(__name__)

TOLERANCE = 1e-4  # masked models differ by ~1e-7 (reduction order); pad leaks are far larger

Run = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]  # feeds -> every output


def random_sequences(
    rules: SequenceRules, lengths: Sequence[int], seed: int = 0
) -> list[np.ndarray]:
    """Random valid sequences for a model, one per length."""
    rng = np.random.default_rng(seed)
    if rules.vocab_size is not None:
        return [rng.integers(0, rules.vocab_size, n).astype(rules.dtype) for n in lengths]
    assert rules.feature_dim is not None
    return [rng.standard_normal((n, rules.feature_dim)).astype(rules.dtype) for n in lengths]


def is_pad_sensitive(name: str, run_model: Run, layout: Layout, rules: SequenceRules) -> bool:
    max_length = rules.max_length
    lengths = sorted({min(n, max_length) for n in (1, 3, 5, 8)})
    padded_length = min(max_length, max(lengths) + 8)
    if padded_length == max(lengths) and len(set(lengths)) == 1:
        return False  # a model whose only length is 1 is never padded
    names = layout.output_names
    sequences = random_sequences(rules, lengths)

    def run(seqs: list[np.ndarray], rows: int, length: int) -> list[dict[str, np.ndarray]]:
        return layout.split(run_model(layout.collate(seqs, rows, length)), [len(s) for s in seqs])

    batched = run(sequences, len(sequences) + 1, padded_length)
    for seq, together in zip(sequences, batched, strict=True):
        (alone,) = run([seq], 1, len(seq))
        for output in names:
            if not np.allclose(alone[output], together[output], rtol=TOLERANCE, atol=TOLERANCE):
                log.warning("model %s: output %s changes with padding: pad-sensitive", name, output)
                return True
    return False

"""Pad-safety self-check, run at load: does padding change a model's valid outputs?

A few random sequences are run alone, unpadded, and again together in one batch padded to a
longer length with a pad row. A model whose valid outputs move (an unmasked pooling, an RNN
without `sequence_lens`) is pad-sensitive: it is then served by grouping sequences of exactly
equal length, so its answers stay exact.
"""

from __future__ import annotations

import logging

import numpy as np

from serve.bucketing import Layout, split
from serve.config import InputRole
from serve.repository import ModelSpec
from serve.runtime.sessions import create_session
from serve.runtime.weights import SharedWeights

log = logging.getLogger(__name__)

TOLERANCE = 1e-4  # masked models differ by ~1e-7 (reduction order); pad leaks are far larger


def random_sequences(spec: ModelSpec, lengths: list[int], seed: int = 0) -> list[np.ndarray]:
    """Random valid sequences for `spec`'s sequence input, one per length."""
    rng = np.random.default_rng(seed)
    name = spec.config.sequence_input
    cfg, tensor = spec.config.inputs[name], spec.signature.inputs[name]
    if cfg.role is InputRole.TOKENS:
        assert cfg.vocab_size is not None
        return [rng.integers(0, cfg.vocab_size, n).astype(tensor.dtype) for n in lengths]
    dim = tensor.dims[2]
    assert isinstance(dim, int)
    return [rng.standard_normal((n, dim)).astype(tensor.dtype) for n in lengths]


def is_pad_sensitive(spec: ModelSpec, layout: Layout) -> bool:
    max_length = spec.config.batching.longest
    lengths = sorted({min(n, max_length) for n in (1, 3, 5, 8)})
    padded_length = min(max_length, max(lengths) + 8)
    if padded_length == max(lengths) and len(set(lengths)) == 1:
        return False  # a model whose only length is 1 is never padded
    # Weights from the memmap, so that the check costs no private copy of them.
    session = create_session(
        spec.onnx_path, spec.config.providers, weights=SharedWeights(spec.onnx_path)
    )
    names = list(spec.config.outputs)
    sequences = random_sequences(spec, lengths)

    def run(seqs: list[np.ndarray], rows: int, length: int) -> list[dict[str, np.ndarray]]:
        outs = session.run(names, layout.collate(seqs, rows, length))
        return split(dict(zip(names, outs, strict=True)), [len(s) for s in seqs], layout.per_step)

    batched = run(sequences, len(sequences) + 1, padded_length)
    for seq, together in zip(sequences, batched, strict=True):
        (alone,) = run([seq], 1, len(seq))
        for name in names:
            if not np.allclose(alone[name], together[name], rtol=TOLERANCE, atol=TOLERANCE):
                log.warning(
                    "model %s: output %s changes with padding: pad-sensitive", spec.name, name
                )
                return True
    return False

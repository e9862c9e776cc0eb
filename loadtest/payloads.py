"""What clients send: words for text models (a text of n words is about n tokens of a
WordPiece vocabulary), shared by the locust users and the reliability run."""

from __future__ import annotations

import numpy as np

WORDS = (
    "the",
    "a",
    "model",
    "server",
    "batch",
    "length",
    "bucket",
    "token",
    "sequence",
    "fast",
    "exact",
    "padding",
    "request",
    "queue",
    "worker",
    "latency",
    "throughput",
    "memory",
    "replica",
    "signal",
    "answer",
    "text",
    "word",
    "short",
    "long",
)


def texts(lengths: list[int], seed: int = 0) -> list[str]:
    """One text per length, of that many words."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, n)) for n in lengths]

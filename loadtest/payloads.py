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


def natural_texts(tokenizer_file: str, lengths: list[int], seed: int = 0) -> list[str]:
    """Texts that tokenise to about `lengths` tokens each, with the spread of word frequencies
    of natural text: token ranks drawn from a Zipf law over the vocabulary's words and word
    pieces (so frequent words dominate, rare ones split into pieces), a comma or full stop now
    and then, decoded to text. A list of 25 common words tokenises faster than real text."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_file)
    vocab = tokenizer.get_vocab()
    first_word = vocab.get("the", 0)  # a WordPiece vocabulary lists specials and characters first
    words = np.arange(first_word, tokenizer.get_vocab_size())
    marks = [vocab[m] for m in (",", ".") if m in vocab]
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        ranks = rng.zipf(1.15, 4 * n + 8)
        ids = words[ranks[ranks <= len(words)][: max(1, n - 2)] - 1]
        if marks:
            ids = np.where(rng.random(len(ids)) < 0.08, rng.choice(marks, len(ids)), ids)
        out.append(tokenizer.decode(ids.tolist()))
    return out

"""Sequences like a model's traffic, for the load-time check's full-batch rounds (`check`): a
text model's are texts tokenised by its own tokenizer, special tokens and all (a pair
classifier's, query and document pairs with their segments); any other model's are random
valid sequences. Texts are words drawn as natural text draws them (a Zipf law over the
vocabulary's entries, frequent ones often, rare ones seldom), decoded, then tokenised and cut
to each length asked, as a long text would be.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from tokenizers import Tokenizer

from bucketserve.core.layout import segmented
from bucketserve.core.model import SequenceRules
from bucketserve.loading.check import Traffic, random_sequences
from bucketserve.loading.config import BatchingConfig

ZIPF = 1.15  # the exponent of word frequencies in natural text


def traffic(
    rules: SequenceRules,
    batching: BatchingConfig,
    tokenizer: Tokenizer | None,
    pairs: bool,
    rows_at: Callable[[int], int] | None = None,
) -> Traffic:
    """What the check's traffic-like rounds run for a model: texts through `tokenizer` (pairs
    when `pairs`), else random valid sequences; a full batch's rows from the config, and no
    more than `rows_at` (the memory budget) allows."""

    def rows(length: int) -> int:
        most = min(batching.max_batch_size, batching.max_batch_tokens // length)
        return max(1, most if rows_at is None else min(most, rows_at(length)))

    if tokenizer is None:
        return Traffic(lambda lengths, seed: random_sequences(rules, lengths, seed), rows)
    return Traffic(Texts(tokenizer, rules, pairs), rows)


class Texts:
    """Tokenised texts (or pairs: a short query and a document) of exactly the lengths asked,
    special tokens included, each drawn long enough to be cut to its length. A length too
    short for the tokenizer's frame (or ids past the vocabulary as configured) gets a random
    valid sequence."""

    def __init__(self, tokenizer: Tokenizer, rules: SequenceRules, pairs: bool) -> None:
        self.rules, self.pairs = rules, pairs
        self.decoder = tokenizer
        self.cutting = Tokenizer.from_str(tokenizer.to_str())  # (its truncation set per length)
        special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
        self.words = np.array([i for i in range(tokenizer.get_vocab_size()) if i not in special])
        self.frame = tokenizer.num_special_tokens_to_add(pairs) + (2 if pairs else 1)

    def __call__(self, lengths: Sequence[int], seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [self._one(length, rng) for length in lengths]

    def _text(self, count: int, rng: np.random.Generator) -> str:
        ranks = rng.zipf(ZIPF, 4 * count + 16)
        ids = self.words[ranks[ranks <= len(self.words)][:count] - 1]
        return str(self.decoder.decode(ids.tolist()))

    def _one(self, length: int, rng: np.random.Generator) -> np.ndarray:
        rules = self.rules
        if length < self.frame:
            return random_sequences(rules, [length], int(rng.integers(1 << 30)))[0]
        self.cutting.enable_truncation(length)
        document = self._text(length + length // 2 + 8, rng)  # (enough to be cut)
        if self.pairs:
            encoding = self.cutting.encode(self._text(int(rng.integers(3, 12)), rng), document)
        else:
            encoding = self.cutting.encode(document)
        ids = np.asarray(encoding.ids, rules.dtype)
        if len(ids) != length or (rules.vocab_size is not None and ids.max() >= rules.vocab_size):
            return random_sequences(rules, [length], int(rng.integers(1 << 30)))[0]
        return segmented(ids, encoding.type_ids) if self.pairs else ids

"""Per-token outputs turned into what hybrid and late-interaction search index: a sparse
vector over the vocabulary (`SparseRule`) and one vector per token (`MultiVector`). Read from
the config's `[sparse]` and `[multi_vector]` at load (the rules of `Task.EMBED_SPARSE` and
`Task.EMBED_ALL`); applied by the `Sparse` and `EmbedAll` heads, here, to each sequence's
outputs, already cut to its own tokens: the mask is respected because the padding is gone.
Imports the heads' protocol and the model.

- SPLADE (a masked-LM head, logits [T, V]): each vocabulary entry's weight is the largest
  log(1 + relu(logit)) over the text's tokens.
- Token weights (BGE-M3's sparse head, [T] or [T, 1]): each token's relu(weight), and for a
  token id that occurs more than once the largest.

Either way the special tokens' entries ([CLS], [SEP], padding) are dropped, and only entries
of a positive weight are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from bucketserve.core.heads import owned, rule_of
from bucketserve.core.layout import Outputs, token_ids
from bucketserve.core.model import Model
from bucketserve.core.task import Task

NORM_FLOOR = 1e-12
INDICES, VALUES = "indices", "values"  # what `Sparse` answers: the entries, and their weights
VECTORS = "vectors"  # what `EmbedAll` answers: [T, width]


class SparsePooling(StrEnum):
    SPLADE = "splade"
    TOKEN_WEIGHTS = "token_weights"


@dataclass(frozen=True)
class SparseRule:
    output: str
    pooling: SparsePooling
    special_ids: tuple[int, ...]  # vocabulary entries never answered

    def weights(
        self, output: np.ndarray, ids: np.ndarray, top_k: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """One text's (indices, weights), by index, the `top_k` largest if asked."""
        steps = np.asarray(output, np.float32)
        if self.pooling is SparsePooling.SPLADE:
            dense = np.log1p(np.maximum(steps, 0)).max(axis=0, initial=0.0)
        else:
            weight = np.maximum(steps.reshape(len(ids)), 0)
            dense = np.zeros(int(ids.max(initial=0)) + 1, np.float32)
            np.maximum.at(dense, ids, weight)
        dense[[i for i in self.special_ids if i < len(dense)]] = 0
        indices = np.flatnonzero(dense > 0)
        if top_k is not None and top_k < len(indices):
            largest = np.argsort(-dense[indices], kind="stable")[:top_k]
            indices = np.sort(indices[largest])
        return indices.astype(np.int64), dense[indices].astype(np.float32)


@dataclass(frozen=True)
class MultiVector:
    """Which per-token output is one vector per token, and whether each is L2-normalised."""

    output: str
    normalize: bool

    def vectors(self, output: np.ndarray) -> np.ndarray:
        steps = np.asarray(output, np.float32)
        if not self.normalize:
            return steps
        norms = np.linalg.norm(steps, axis=-1, keepdims=True)
        normalised: np.ndarray = steps / np.maximum(norms, np.float32(NORM_FLOOR))
        return normalised


@dataclass(frozen=True)
class Sparse:
    """A text's sparse weights, by the model's `[sparse]` rule; `top_k`: only the largest."""

    top_k: int | None = None
    task = Task.EMBED_SPARSE

    def outputs(self, model: Model) -> tuple[str, ...]:
        return (sparse_rule(model).output,)

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        rule = sparse_rule(model)
        indices, values = rule.weights(outputs[rule.output], token_ids(sequence), self.top_k)
        return {INDICES: indices, VALUES: values}

    def per_window(self) -> Sparse:
        """Each window of a text taken whole: every weight (`merged` keeps the top_k)."""
        return Sparse()

    def merged(
        self,
        model: Model,
        windows: list[Outputs],
        lengths: list[int],
        spans: list[tuple[int, int] | None],
    ) -> Outputs:
        """A text's sparse weights from its windows': each entry's largest, as SPLADE's max
        over a text's tokens takes it (and BGE-M3's over a token id's), then the top_k."""
        indices = np.concatenate([w[INDICES] for w in windows])
        values = np.concatenate([w[VALUES] for w in windows])
        merged = np.zeros(int(indices.max(initial=-1)) + 1, np.float32)
        np.maximum.at(merged, indices, values)
        kept = np.flatnonzero(merged > 0)
        if self.top_k is not None and self.top_k < len(kept):
            kept = np.sort(kept[np.argsort(-merged[kept], kind="stable")[: self.top_k]])
        return {INDICES: kept.astype(np.int64), VALUES: merged[kept].astype(np.float32)}


@dataclass(frozen=True)
class EmbedAll:
    """One vector per token of a text."""

    task = Task.EMBED_ALL

    def outputs(self, model: Model) -> tuple[str, ...]:
        return (multi_vector_rule(model).output,)

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        rule = multi_vector_rule(model)
        return {VECTORS: owned(rule.vectors(outputs[rule.output]))}

    def per_window(self) -> EmbedAll:
        return self

    def merged(
        self,
        model: Model,
        windows: list[Outputs],
        lengths: list[int],
        spans: list[tuple[int, int] | None],
    ) -> Outputs:
        """A text's vectors from its windows': theirs one after another, each window's own
        (its special tokens' and the tokens it shares with the one before included)."""
        return {VECTORS: np.concatenate([w[VECTORS] for w in windows])}


def sparse_rule(model: Model) -> SparseRule:
    rule: SparseRule = rule_of(
        model, Task.EMBED_SPARSE, "does not give sparse weights: its config has no [sparse]"
    )
    return rule


def multi_vector_rule(model: Model) -> MultiVector:
    rule: MultiVector = rule_of(
        model,
        Task.EMBED_ALL,
        "gives no vector per token: its config has no [multi_vector] nor a per-token [embedding]",
    )
    return rule

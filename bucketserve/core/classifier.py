"""What a model's classification head is: which output holds one row of logits per sequence,
the labels' names, how logits become scores, and which label's score is a pair's relevance
for a cross-encoder that reranks. Read from the config's `[classifier]` at load; applied by
the `Classify` and `Rerank` heads (`heads`) inside the core call. Imports only the errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np


class Activation(StrEnum):
    SOFTMAX = "softmax"  # one label of several (transformers' single_label_classification)
    SIGMOID = "sigmoid"  # each label on its own: one-label heads, multi_label_classification
    NONE = "none"  # the logits are the scores (a regression head)


@dataclass(frozen=True)
class Classifier:
    """One model's classification rule. `rerank_label`: the label whose score is the relevance
    of a (query, document) pair; None when the model does not rerank."""

    output: str
    labels: tuple[str, ...]
    activation: Activation
    rerank_label: int | None = None

    def scores(self, logits: np.ndarray, raw: bool = False) -> np.ndarray:
        """One sequence's logits -> its scores, float32 (`raw`: the logits as they are)."""
        row = np.asarray(logits, np.float32).reshape(-1)
        if raw or self.activation is Activation.NONE:
            return row
        if self.activation is Activation.SIGMOID:
            return np.asarray(1 / (1 + np.exp(-row.astype(np.float64))), np.float32)
        shifted = np.exp(row.astype(np.float64) - row.max())
        return np.asarray(shifted / shifted.sum(), np.float32)

    def relevance(self, logits: np.ndarray, raw: bool = False) -> float:
        """A pair's relevance: its rerank label's score (the logit, `raw`)."""
        assert self.rerank_label is not None, "relevance of a model that does not rerank"
        return float(self.scores(logits, raw)[self.rerank_label])

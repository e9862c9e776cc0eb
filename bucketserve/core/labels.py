"""A model's logits over labels, as a classification head gives them: which output holds one
row of logits per sequence (or, for a token classifier, per token), the labels' names, how
logits become scores, and which label's score is a pair's relevance for a cross-encoder that
reranks. The rule of three tasks: classify and rerank (`classifier`), classify_tokens
(`entities`), read from the config's `[classifier]` and `[token_classifier]` at load.
Imports nothing of the server's.
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

    def scores(
        self, logits: np.ndarray, raw: bool = False, activation: Activation | None = None
    ) -> np.ndarray:
        """Logits over the labels (the last axis: one row of a sequence, or one per token) ->
        scores, float32 (`raw`: the logits as they are; `activation`: the request's, where
        it names one: Hugging Face's `function_to_apply`)."""
        rows = np.asarray(logits, np.float32)
        rows = rows.reshape(-1) if rows.ndim < 2 else rows
        applied = activation or self.activation
        if raw or applied is Activation.NONE:
            return rows
        wide = rows.astype(np.float64)
        if applied is Activation.SIGMOID:
            return np.asarray(1 / (1 + np.exp(-wide)), np.float32)
        shifted = np.exp(wide - wide.max(axis=-1, keepdims=True))
        return np.asarray(shifted / shifted.sum(axis=-1, keepdims=True), np.float32)

    def relevance(self, logits: np.ndarray, raw: bool = False) -> float:
        """A pair's relevance: its rerank label's score (the logit, `raw`)."""
        assert self.rerank_label is not None, "relevance of a model that does not rerank"
        return float(self.scores(logits, raw)[self.rerank_label])

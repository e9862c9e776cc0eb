"""What a model's classification head is: which output holds one row of logits per sequence
(or, for a token classifier, per token), the labels' names, how logits become scores, and
which label's score is a pair's relevance for a cross-encoder that reranks. Read from the
config's `[classifier]` and `[token_classifier]` at load (the rules of `Task.CLASSIFY`,
`Task.RERANK` and `Task.CLASSIFY_TOKENS`); applied by the `Classify` and `Rerank` heads,
here, inside the core call. Imports the heads' protocol and the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from bucketserve.core.heads import not_served, owned, rule_of
from bucketserve.core.layout import Outputs
from bucketserve.core.model import Model
from bucketserve.core.task import Task

SCORES = "scores"  # what `Classify` answers: a score for each label, in the labels' order
RELEVANCE = "relevance"  # what `Rerank` answers: a pair's relevance, one number


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
        """Logits over the labels (the last axis: one row of a sequence, or one per token) ->
        scores, float32 (`raw`: the logits as they are)."""
        rows = np.asarray(logits, np.float32)
        rows = rows.reshape(-1) if rows.ndim < 2 else rows
        if raw or self.activation is Activation.NONE:
            return rows
        wide = rows.astype(np.float64)
        if self.activation is Activation.SIGMOID:
            return np.asarray(1 / (1 + np.exp(-wide)), np.float32)
        shifted = np.exp(wide - wide.max(axis=-1, keepdims=True))
        return np.asarray(shifted / shifted.sum(axis=-1, keepdims=True), np.float32)

    def relevance(self, logits: np.ndarray, raw: bool = False) -> float:
        """A pair's relevance: its rerank label's score (the logit, `raw`)."""
        assert self.rerank_label is not None, "relevance of a model that does not rerank"
        return float(self.scores(logits, raw)[self.rerank_label])


@dataclass(frozen=True)
class Classify:
    """Each label's score for a text (or a pair), by the model's classifier; `tokens`: for
    each of its tokens, by its token classifier; `raw`: the logits."""

    raw: bool = False
    tokens: bool = False

    @property
    def task(self) -> Task:
        return Task.CLASSIFY_TOKENS if self.tokens else Task.CLASSIFY

    def rule(self, model: Model) -> Classifier:
        return token_classifier_rule(model) if self.tokens else classifier_rule(model)

    def outputs(self, model: Model) -> tuple[str, ...]:
        return (self.rule(model).output,)

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        rule = self.rule(model)
        return {SCORES: owned(rule.scores(outputs[rule.output], self.raw))}


@dataclass(frozen=True)
class Rerank:
    """A (query, document) pair's relevance, by the model's rerank label; `raw`: its logit."""

    raw: bool = False
    task = Task.RERANK

    def outputs(self, model: Model) -> tuple[str, ...]:
        rule = classifier_rule(model)
        if rule.rerank_label is None:
            raise not_served(model, "does not rerank: its [classifier] names no rerank_label")
        return (rule.output,)

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        rule = classifier_rule(model)
        return {RELEVANCE: np.asarray(rule.relevance(outputs[rule.output], self.raw), np.float32)}


def classifier_rule(model: Model) -> Classifier:
    rule: Classifier = rule_of(
        model, Task.CLASSIFY, "does not classify: its config has no [classifier]"
    )
    return rule


def token_classifier_rule(model: Model) -> Classifier:
    rule: Classifier = rule_of(
        model,
        Task.CLASSIFY_TOKENS,
        "does not classify tokens: its config has no [token_classifier]",
    )
    return rule

"""Classify and rerank: a text's (or a pair's) score for each label (`Classify`), and a
(query, document) pair's relevance, its rerank label's score (`Rerank`), by the model's
`[classifier]` (a `labels.Classifier`: the rule of `Task.CLASSIFY` and `Task.RERANK`), inside
the core call. Imports the heads' protocol, the labels' rule and the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bucketserve.core.heads import not_served, owned, rule_of
from bucketserve.core.labels import Activation, Classifier
from bucketserve.core.layout import Outputs
from bucketserve.core.model import Model
from bucketserve.core.task import Task

SCORES = "scores"  # what `Classify` answers: a score for each label, in the labels' order
RELEVANCE = "relevance"  # what `Rerank` answers: a pair's relevance, one number
WINDOW = "window"  # and for a document in windows: the characters of its best (start, end)


@dataclass(frozen=True)
class Classify:
    """Each label's score for a text (or a pair), by the model's classifier; `raw`: the
    logits; `activation`: the one the request names (None: the model's)."""

    raw: bool = False
    activation: Activation | None = None
    task = Task.CLASSIFY

    def outputs(self, model: Model) -> tuple[str, ...]:
        return (classifier_rule(model).output,)

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        rule = classifier_rule(model)
        return {SCORES: owned(rule.scores(outputs[rule.output], self.raw, self.activation))}

    def per_window(self) -> Classify:
        """Each window of a pair's second text taken whole (the first whole in each)."""
        return self

    def merged(
        self,
        model: Model,
        windows: list[Outputs],
        lengths: list[int],
        spans: list[tuple[int, int] | None],
    ) -> Outputs:
        """A pair's labels from its windows': those of the window whose best label scores
        highest (as a long document's best window is its rerank score), and its characters."""
        return best_window(windows, spans, lambda w: float(np.max(w[SCORES])))


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

    def per_window(self) -> Rerank:
        """Each window of a document taken whole (the query whole in each) is scored alone."""
        return self

    def merged(
        self,
        model: Model,
        windows: list[Outputs],
        lengths: list[int],
        spans: list[tuple[int, int] | None],
    ) -> Outputs:
        """A document's relevance: its best window's, and which characters that window holds
        (`WINDOW`: start, end)."""
        return best_window(windows, spans, lambda w: float(w[RELEVANCE]))


def best_window(
    windows: list[Outputs], spans: list[tuple[int, int] | None], score: Callable[[Outputs], float]
) -> Outputs:
    """A pair's answer in windows: the window `score` ranks highest (the first of equals), and
    the characters of the second text it holds (`WINDOW`: start, end)."""
    best = int(np.argmax([score(w) for w in windows]))
    return {**windows[best], WINDOW: np.asarray(spans[best] or (0, 0), np.int64)}


def classifier_rule(model: Model) -> Classifier:
    rule: Classifier = rule_of(
        model, Task.CLASSIFY, "does not classify: its config has no [classifier]"
    )
    return rule

"""Task heads: what turns a model's outputs for one sequence into a task's answer, applied by the
engine inside the one core call, so that no route post-processes what the core returned. A
route asks for a head in its `Call`; the head says which outputs it reads (and refuses a model
that cannot do its task) before anything is admitted, then answers each sequence from its
outputs, already cut to the sequence's own length. Imports the model and its rules.

- `Embed`: pooling, normalising and cutting to `dimensions`, by the model's `[embedding]`.
- `Classify`: each label's score, by its `[classifier]` (or, for each token, by its
  `[token_classifier]`); `Rerank`: a (query, document) pair's relevance, that classifier's
  `rerank_label`'s score.
- `Sparse`: a text's weight for each vocabulary entry it touches, by its `[sparse]`.
- `EmbedAll`: one vector per token, by its `[multi_vector]` (or its per-token embedding
  output, as it is).
- `Picked`: the outputs a call asked for by name, as the model gives them (no task).

A head answers in the worker thread that ran the sequence's batch, as the batch finishes
(`Scheduler`): a request holds its answers, never the batch's raw outputs (a sparse model's
logits are the vocabulary's width at every token), and the result cache keeps answers too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from bucketserve.core.classifier import Classifier
from bucketserve.core.embedding import Embedding
from bucketserve.core.layout import Outputs, token_ids
from bucketserve.core.model import Model
from bucketserve.core.sparse import MultiVector, SparseRule
from bucketserve.errors import TaskNotServed

R = TypeVar("R")

EMBEDDING = "embedding"  # the name of what `Embed` answers for each sequence
SCORES = "scores"  # what `Classify` answers: a score for each label, in the labels' order
RELEVANCE = "relevance"  # what `Rerank` answers: a pair's relevance, one number
INDICES, VALUES = "indices", "values"  # what `Sparse` answers: the entries, and their weights
VECTORS = "vectors"  # what `EmbedAll` answers: [T, width]


class Head(Protocol):
    def outputs(self, model: Model) -> tuple[str, ...]:
        """The model outputs this head reads, or InvalidInput when the model cannot do the
        task (with the request's field at fault)."""

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        """One sequence's answer from its outputs (those `outputs` named) and its steps (the
        token ids a sparse vector is indexed by)."""


def answer_key(head: Head) -> bytes:
    """What tells heads' answers apart: identical sequences share a run, and the cache keeps
    an answer, only under the same head (a frozen dataclass: its fields are its answer)."""
    return repr(head).encode()


def owned(array: np.ndarray) -> np.ndarray:
    """`array`, or a copy where it is a view of a batch's output: an answer keeps nothing of
    its batch alive."""
    return array.copy() if isinstance(array, np.ndarray) and array.base is not None else array


@dataclass(frozen=True)
class Picked:
    """The outputs asked for by name, each as the model gives it, cut to the sequence."""

    names: tuple[str, ...]

    def outputs(self, model: Model) -> tuple[str, ...]:
        return self.names

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        return {name: owned(outputs[name]) for name in self.names}


@dataclass(frozen=True)
class Embed:
    """A sequence's embedding, cut to `dimensions` where the model allows it (None: whole)."""

    dimensions: int | None = None

    def outputs(self, model: Model) -> tuple[str, ...]:
        rule = embedding_rule(model)
        rule.check_dimensions(self.dimensions)
        return (rule.output,)

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        rule = embedding_rule(model)
        return {EMBEDDING: owned(rule.vector(outputs[rule.output], self.dimensions))}


def not_served(model: Model, why: str) -> TaskNotServed:
    """The error of a task `model` does not serve (`why`), naming those it does."""
    return TaskNotServed(
        f"model {model.name} {why} (it serves {', '.join(model.info.tasks)})", param="model"
    )


def served(model: Model, rule: R | None, why: str) -> R:
    """`rule`, the model's rule for a task, or the error saying `why` it has none."""
    if rule is None:
        raise not_served(model, why)
    return rule


def embedding_rule(model: Model) -> Embedding:
    return served(model, model.info.embedding, "does not embed: its config has no [embedding]")


@dataclass(frozen=True)
class Classify:
    """Each label's score for a text (or a pair), by the model's classifier; `tokens`: for
    each of its tokens, by its token classifier; `raw`: the logits."""

    raw: bool = False
    tokens: bool = False

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

    def outputs(self, model: Model) -> tuple[str, ...]:
        rule = classifier_rule(model)
        if rule.rerank_label is None:
            raise not_served(model, "does not rerank: its [classifier] names no rerank_label")
        return (rule.output,)

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        rule = classifier_rule(model)
        return {RELEVANCE: np.asarray(rule.relevance(outputs[rule.output], self.raw), np.float32)}


def classifier_rule(model: Model) -> Classifier:
    return served(model, model.info.classifier, "does not classify: its config has no [classifier]")


@dataclass(frozen=True)
class Sparse:
    """A text's sparse weights, by the model's `[sparse]` rule; `top_k`: only the largest."""

    top_k: int | None = None

    def outputs(self, model: Model) -> tuple[str, ...]:
        return (sparse_rule(model).output,)

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        rule = sparse_rule(model)
        indices, values = rule.weights(outputs[rule.output], token_ids(sequence), self.top_k)
        return {INDICES: indices, VALUES: values}


@dataclass(frozen=True)
class EmbedAll:
    """One vector per token of a text."""

    def outputs(self, model: Model) -> tuple[str, ...]:
        return (multi_vector_rule(model).output,)

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        rule = multi_vector_rule(model)
        return {VECTORS: owned(rule.vectors(outputs[rule.output]))}


def sparse_rule(model: Model) -> SparseRule:
    return served(
        model, model.info.sparse, "does not give sparse weights: its config has no [sparse]"
    )


def multi_vector_rule(model: Model) -> MultiVector:
    return served(
        model,
        model.info.multi_vector,
        "gives no vector per token: its config has no [multi_vector] nor a per-token [embedding]",
    )


def token_classifier_rule(model: Model) -> Classifier:
    return served(
        model,
        model.info.token_classifier,
        "does not classify tokens: its config has no [token_classifier]",
    )

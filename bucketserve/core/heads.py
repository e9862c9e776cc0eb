"""Task heads: what turns a model's outputs for one sequence into a task's answer, applied by the
engine inside the one core call, so that no route post-processes what the core returned. A
route asks for a head in its `Call`; the head says which outputs it reads (and refuses a model
that cannot do its task) before anything is admitted, then answers each sequence from its
outputs, already cut to the sequence's own length. Imports the model and its embedding rule.

`Embed`: pooling, normalising and cutting to `dimensions`, by the model's `[embedding]` rule.
The heads to come (rerank scores, class probabilities, sparse weights) take the same place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bucketserve.core.embedding import Embedding
from bucketserve.core.layout import Outputs
from bucketserve.core.model import Model
from bucketserve.errors import InvalidInput

EMBEDDING = "embedding"  # the name of what `Embed` answers for each sequence


class Head(Protocol):
    def outputs(self, model: Model) -> tuple[str, ...]:
        """The model outputs this head reads, or InvalidInput when the model cannot do the
        task (with the request's field at fault)."""

    def answer(self, model: Model, outputs: Outputs) -> Outputs:
        """One sequence's answer from its outputs (those `outputs` named)."""


@dataclass(frozen=True)
class Embed:
    """A sequence's embedding, cut to `dimensions` where the model allows it (None: whole)."""

    dimensions: int | None = None

    def outputs(self, model: Model) -> tuple[str, ...]:
        rule = embedding_rule(model)
        rule.check_dimensions(self.dimensions)
        return (rule.output,)

    def answer(self, model: Model, outputs: Outputs) -> Outputs:
        rule = embedding_rule(model)
        return {EMBEDDING: rule.vector(outputs[rule.output], self.dimensions)}


def embedding_rule(model: Model) -> Embedding:
    if model.info.embedding is None:
        raise InvalidInput(
            f"model {model.name} does not embed: its config has no [embedding]", param="model"
        )
    return model.info.embedding

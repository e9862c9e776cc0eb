"""What a model's embedding is: which output, how its steps are pooled into one vector, whether
the vector is L2-normalised, and the widths it may be cut to. Read from the config's
`[embedding]` at load (`Task.EMBED`'s rule); applied by the `Embed` head, here, inside the
core call, to each sequence's outputs, which are already cut to the sequence's own length: a
mean over them is the mean over the mask. Imports the heads' protocol and the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from bucketserve.core.heads import owned, rule_of
from bucketserve.core.layout import Outputs
from bucketserve.core.model import Model
from bucketserve.core.quantize import Calibration, EmbeddingType
from bucketserve.core.task import Task
from bucketserve.errors import InvalidInput

EMBEDDING = "embedding"  # the name of what `Embed` answers for each sequence

NORM_FLOOR = 1e-12  # torch's `normalize` eps: a zero vector stays zero
DIMENSIONS = "dimensions"  # the request's field that asks for a cut (OpenAI's name)


class Pooling(StrEnum):
    NONE = "none"  # the output is the embedding already (pooled in the graph)
    MEAN = "mean"
    CLS = "cls"  # the first step
    LAST = "last"  # the last real step (decoder-style embedders)
    MAX = "max"
    MEAN_SQRT_LEN = "mean_sqrt_len"  # the sum over steps / sqrt(steps)


@dataclass(frozen=True)
class Embedding:
    """One model's embedding rule. `dimensions`: the widths it may be cut to (each at most its
    own), "any" for any width (Matryoshka training), () when it may not be cut."""

    output: str
    pooling: Pooling
    normalize: bool
    width: int | None  # None: the graph leaves it free
    dimensions: tuple[int, ...] | str = ()
    calibration: Calibration | None = None  # each dimension's range, for int8 and uint8
    answer_type: EmbeddingType = EmbeddingType.FLOAT  # what OpenAI's form answers

    def check_dimensions(self, wanted: int | None) -> None:
        """InvalidInput unless the embedding may be cut to `wanted` (None: not cut)."""
        if wanted is None or wanted == self.width:
            return
        if self.dimensions == ():
            raise InvalidInput(
                f"this model's embeddings cannot be shortened (its config allows no "
                f"dimensions); leave dimensions out{self._native}",
                param=DIMENSIONS,
            )
        if self.width is not None and wanted > self.width:
            raise InvalidInput(
                f"dimensions {wanted} is more than the embedding's {self.width}", param=DIMENSIONS
            )
        if self.dimensions != "any" and wanted not in self.dimensions:
            raise InvalidInput(
                f"dimensions {wanted}: this model may be cut to {list(self.dimensions)}",
                param=DIMENSIONS,
            )

    @property
    def _native(self) -> str:
        return "" if self.width is None else f" or send {self.width}"

    def vector(
        self, output: np.ndarray, dimensions: int | None = None, normalize: bool | None = None
    ) -> np.ndarray:
        """One sequence's output (its own steps only) -> its embedding, float32, cut to
        `dimensions` (already checked) and normalised again after the cut; `normalize`: the
        request's say (text-embeddings-inference's), None for the model's rule."""
        return self.finished(
            _pooled(np.asarray(output, np.float32), self.pooling), dimensions, normalize
        )

    def finished(
        self, pooled: np.ndarray, dimensions: int | None = None, normalize: bool | None = None
    ) -> np.ndarray:
        """A pooled vector normalised and cut as `vector` says."""
        if self.normalize if normalize is None else normalize:
            pooled = _normalised(pooled)
        if dimensions is not None and dimensions != len(pooled):
            if dimensions > len(pooled):  # (a width the graph left free, found only now)
                raise InvalidInput(
                    f"dimensions {dimensions} is more than the embedding's {len(pooled)}",
                    param=DIMENSIONS,
                )
            pooled = pooled[:dimensions] if normalize is False else _normalised(pooled[:dimensions])
        return pooled


def _pooled(output: np.ndarray, pooling: Pooling) -> np.ndarray:
    pooled: np.ndarray
    if pooling is Pooling.NONE:
        pooled = output
    elif pooling is Pooling.CLS:
        pooled = output[0]
    elif pooling is Pooling.LAST:
        pooled = output[-1]
    elif pooling is Pooling.MAX:
        pooled = output.max(axis=0)
    else:
        scale = len(output) if pooling is Pooling.MEAN else np.sqrt(len(output))
        pooled = output.sum(axis=0, dtype=np.float32) / np.float32(scale)
    return pooled


def _normalised(vector: np.ndarray) -> np.ndarray:
    norm = np.float32(np.linalg.norm(vector))
    normalised: np.ndarray = vector / max(norm, np.float32(NORM_FLOOR))
    return normalised


@dataclass(frozen=True)
class Embed:
    """A sequence's embedding, cut to `dimensions` where the model allows it (None: whole),
    L2-normalised as `normalize` says (None: as the model's rule says)."""

    dimensions: int | None = None
    normalize: bool | None = None
    task = Task.EMBED

    def outputs(self, model: Model) -> tuple[str, ...]:
        rule = embedding_rule(model)
        rule.check_dimensions(self.dimensions)
        return (rule.output,)

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        rule = embedding_rule(model)
        vector = rule.vector(outputs[rule.output], self.dimensions, self.normalize)
        return {EMBEDDING: owned(vector)}

    def per_window(self) -> Embed:
        """What each window of a text embedded in windows answers: its pooled vector, whole
        and not normalised (`merged` makes the text's)."""
        return Embed(None, False)

    def merged(
        self,
        model: Model,
        windows: list[Outputs],
        lengths: list[int],
        spans: list[tuple[int, int] | None],
    ) -> Outputs:
        """A text's embedding from its windows': the mean of their pooled vectors, each
        weighted by its tokens, then normalised and cut as one sequence's would be."""
        weights = np.asarray(lengths, np.float32)[:, None]
        pooled = (weights * np.stack([w[EMBEDDING] for w in windows])).sum(axis=0) / weights.sum()
        vector = embedding_rule(model).finished(pooled, self.dimensions, self.normalize)
        return {EMBEDDING: owned(np.asarray(vector, np.float32))}


def embedding_rule(model: Model) -> Embedding:
    rule: Embedding = rule_of(model, Task.EMBED, "does not embed: its config has no [embedding]")
    return rule


@dataclass(frozen=True)
class LateChunked:
    """Each text of a late-chunked sequence (`calls.LateChunks`): the mean of the model's
    per-token output over the text's own tokens, normalised and cut as the model's
    embedding says; one row per text. Needs an embedding pooled by mean from per-token
    states (a graph that pools itself has nothing per token to pool)."""

    dimensions: int | None = None
    task = Task.EMBED
    reads_text = True  # (each token's text, from the tokenisation that made the sequence)

    def outputs(self, model: Model) -> tuple[str, ...]:
        rule = embedding_rule(model)
        if rule.pooling is not Pooling.MEAN:
            raise InvalidInput(
                f"late_chunking pools each text's own tokens by their mean: model "
                f"{model.name}'s embedding is pooled {rule.pooling.value}"
                + (" in its graph" if rule.pooling is Pooling.NONE else ""),
                param="late_chunking",
            )
        rule.check_dimensions(self.dimensions)
        return (rule.output,)

    def answer(
        self,
        model: Model,
        outputs: Outputs,
        sequence: np.ndarray,
        tokens: Sequence[dict[str, Any]] = (),
    ) -> Outputs:
        rule = embedding_rule(model)
        states = np.asarray(outputs[rule.output], np.float32)
        chunks = np.asarray([-1 if t["chunk"] is None else t["chunk"] for t in tokens])
        rows = [
            rule.finished(states[chunks == i].mean(axis=0), self.dimensions)
            for i in range(int(chunks.max()) + 1)
        ]
        return {EMBEDDING: owned(np.stack(rows))}

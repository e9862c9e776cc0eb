"""vLLM's and Infinity's pooling routes, in the shapes their clients send:

- `POST /score` and `/v1/score` (vLLM's): each `text_1` against each `text_2` (or `queries`
  against `documents`), one against many or pairwise: a cross-encoder's relevance by the
  `Rerank` head, or an embedding model's cosine similarity by the `Embed` head, as vLLM
  scores with either kind of model.
- `POST /classify` with `input` (the table, `routes`, tells it from ours, which has `inputs`):
  vLLM's (`{data: [{index, label, probs, num_classes}]}`), or Infinity's when the body has its
  `raw_scores` (`{data: [[{score, label}]]}`, best first), as infinity_client sends it.

A body becomes the core's one call, as every route's (their codecs; the table serves them).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import numpy as np
from fastapi import Request
from pydantic import Field, StrictBool

from bucketserve.core.calls import Answer, Call, TextPairs, Texts
from bucketserve.core.model import Model
from bucketserve.core.task import Task
from bucketserve.core.tasks.classifier import RELEVANCE, SCORES, Classify, Rerank, classifier_rule
from bucketserve.core.tasks.embedding import EMBEDDING, Embed
from bucketserve.edges.http.bodies import (
    LONG_INPUTS,
    LongInputs,
    TextOptions,
    ranked,
    refuse_prompt_for_pairs,
    window_of,
)
from bucketserve.edges.http.codec import Codec, reading
from bucketserve.edges.http.common import engine_of, request_id
from bucketserve.edges.http.schemas import Text
from bucketserve.errors import InvalidInput, TaskNotServed

TAG = "vLLM and Infinity"

OneOrMany = Text | Annotated[list[Text], Field(min_length=1)]


class ScoreBody(TextOptions):
    """vLLM's /score: `text_1` and `text_2` (or its newer names, `queries` and `documents`),
    each a text or a list; one text against each of the others, or list against list, pair
    by pair."""

    text_1: OneOrMany | None = Field(None, description="the query, or queries (or: queries)")
    text_2: OneOrMany | None = Field(None, description="what each is scored with (or: documents)")
    queries: OneOrMany | None = None
    documents: OneOrMany | None = None
    long_inputs: LongInputs | None = LONG_INPUTS

    def pairs(self) -> list[tuple[str, str]]:
        """The (text_1, text_2) pairs scored, in vLLM's order."""
        first, second = as_list(self.text_1 or self.queries), as_list(self.text_2 or self.documents)
        if not first or not second:
            raise InvalidInput("send text_1 and text_2 (or queries and documents)")
        if len(first) == 1:
            return [(first[0], text) for text in second]
        if len(first) != len(second):
            raise InvalidInput(
                f"text_1 has {len(first)} texts and text_2 {len(second)}: send one text_1, or "
                "as many as text_2 (scored pair by pair)",
                param="text_1",
            )
        return list(zip(first, second, strict=True))


def as_list(given: str | list[str] | None) -> list[str]:
    return [] if given is None else [given] if isinstance(given, str) else list(given)


class InputBody(TextOptions):
    """vLLM's and Infinity's /classify: `input`, a text or texts; Infinity's `raw_scores`."""

    input: OneOrMany
    raw_scores: StrictBool | None = Field(None, description="Infinity's: the logits")
    use_activation: StrictBool | None = Field(
        None, description="vLLM's: false answers the logits (default: the model's activation)"
    )

    @property
    def raw(self) -> bool:
        return bool(self.raw_scores) or self.use_activation is False


def score_call(request: Request, body: ScoreBody) -> Call:
    """vLLM's score: a cross-encoder's relevance of each pair, or an embedding model's
    cosine similarity."""
    pairs = body.pairs()
    model = scorer(request, body.model)
    if reranks(model):
        refuse_prompt_for_pairs(body.prompt_name)
        scored = TextPairs(pairs, body.truncation, body.long_inputs)
        return Call(scored, model.name, head=Rerank())
    texts = distinct(pairs)  # (each distinct text embedded once, in one call)
    embedded = Texts(texts, body.truncation, body.prompt_name, long_inputs=body.long_inputs)
    return Call(embedded, model.name, head=Embed(normalize=True))


def score_json(request: Request, body: ScoreBody, answer: Answer) -> Any:
    pairs = body.pairs()
    if reranks(answer.model):
        scores = [float(out[RELEVANCE]) for out in answer.outputs]
        windows = [window_of(out) for out in answer.outputs]
    else:
        embedded = (out[EMBEDDING] for out in answer.outputs)
        vectors = dict(zip(distinct(pairs), embedded, strict=True))
        scores = [float(np.dot(vectors[a], vectors[b])) for a, b in pairs]
        windows = [{} for _ in pairs]
    data = [{"index": i, "object": "score", "score": s} | windows[i] for i, s in enumerate(scores)]
    return listed(request, answer, data)


def reranks(model: Model) -> bool:
    """Whether `model` scores a pair as a cross-encoder (else: the cosine of its vectors)."""
    return Task.RERANK.value in model.info.tasks


def distinct(pairs: list[tuple[str, str]]) -> list[str]:
    return list(dict.fromkeys(text for pair in pairs for text in pair))


def scorer(request: Request, name: str | None) -> Model:
    """The model that scores: the one named (or that stands in), else the one that reranks,
    else the one that embeds."""
    registry = engine_of(request).registry
    try:
        model = registry.resolve(name, task=Task.RERANK)
    except TaskNotServed:  # (no name, and no model reranks)
        model = registry.resolve(name, task=Task.EMBED)
    if not {Task.RERANK.value, Task.EMBED.value} & set(model.info.tasks):
        raise TaskNotServed(
            f"model {model.name} neither reranks nor embeds; it serves "
            f"{', '.join(model.info.tasks)}",
            param="model",
        )
    return model


def classify_call(request: Request, body: InputBody) -> Call:
    """vLLM's classify, or Infinity's (its body has `raw_scores`)."""
    texts = Texts(as_list(body.input), body.truncation, body.prompt_name)
    return Call(texts, body.model, head=Classify(body.raw))


def classify_json(request: Request, body: InputBody, answer: Answer) -> Any:
    """vLLM's answer."""
    labels = classifier_rule(answer.model).labels
    scored = [out[SCORES] for out in answer.outputs]
    data = [
        {"index": n, "label": labels[int(np.argmax(s))], "probs": s, "num_classes": len(labels)}
        for n, s in enumerate(scored)
    ]
    return listed(request, answer, data)


def infinity_classify_json(request: Request, body: InputBody, answer: Answer) -> Any:
    """Infinity's answer: each text's labels, best first."""
    labels = classifier_rule(answer.model).labels
    scored = [out[SCORES] for out in answer.outputs]
    data = [[{"score": float(s[i]), "label": labels[i]} for i in ranked(s, None)] for s in scored]
    return listed(request, answer, data) | {"object": "classify"}


def listed(request: Request, answer: Answer, data: Any) -> dict[str, Any]:
    """An answer in the OpenAI-like list vLLM and Infinity answer in."""
    tokens = sum(answer.lengths)
    return {
        "id": request_id(request),
        "object": "list",
        "created": int(time.time()),
        "model": answer.model.name,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }


SCORE = Codec(
    TAG, "score", ScoreBody, reading(ScoreBody), score_call, score_json,
    about="vLLM's score: a cross-encoder's relevance of each pair, or an embedding model's\n"
    "cosine similarity.",
)  # fmt: skip
CLASSIFY = Codec(TAG, "classify", InputBody, reading(InputBody), classify_call, classify_json)
# The same body with Infinity's `raw_scores` (`routes.infinity`), answered as Infinity answers
INFINITY_CLASSIFY = Codec(
    TAG, "classify", InputBody, reading(InputBody), classify_call, infinity_classify_json
)

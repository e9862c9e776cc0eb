"""vLLM's and Infinity's pooling routes, in the shapes their clients send:

- `POST /score` and `/v1/score` (vLLM's): each `text_1` against each `text_2` (or `queries`
  against `documents`), one against many or pairwise: a cross-encoder's relevance by the
  `Rerank` head, or an embedding model's cosine similarity by the `Embed` head, as vLLM
  scores with either kind of model.
- `POST /classify` with `input` (`shapes` tells it from ours, which has `inputs`): vLLM's
  (`{data: [{index, label, probs, num_classes}]}`), or Infinity's when the body has its
  `raw_scores` (`{data: [[{score, label}]]}`, best first), as infinity_client sends it.

A body becomes the core's one call, as every route's.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import Field, StrictBool

from bucketserve.core.calls import Answer, TextPairs, Texts
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
from bucketserve.edges.http.common import engine_of, json_response, request_id
from bucketserve.edges.http.schemas import Text
from bucketserve.edges.http.task_call import body_of, post, run
from bucketserve.errors import InvalidInput, TaskNotServed

router = APIRouter(tags=["vLLM and Infinity"])

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


@post(router, "/score", ScoreBody, "Scores of text pairs, as vLLM's /score answers them")
async def score(request: Request) -> Response:
    """vLLM's score: a cross-encoder's relevance of each pair, or an embedding model's
    cosine similarity."""
    body: ScoreBody = await body_of(request, ScoreBody)
    pairs = body.pairs()
    model = scorer(request, body.model)
    if Task.RERANK.value in model.info.tasks:
        refuse_prompt_for_pairs(body.prompt_name)
        scored = TextPairs(pairs, body.truncation, body.long_inputs)
        answer = await run(request, scored, model.name, Rerank())
        scores = [float(out[RELEVANCE]) for out in answer.outputs]
        windows = [window_of(out) for out in answer.outputs]
    else:  # (each distinct text embedded once, in one call)
        texts = list(dict.fromkeys(text for pair in pairs for text in pair))
        embedded = Texts(texts, body.truncation, body.prompt_name, long_inputs=body.long_inputs)
        answer = await run(request, embedded, model.name, Embed(normalize=True))
        vectors = dict(zip(texts, (out[EMBEDDING] for out in answer.outputs), strict=True))
        scores = [float(np.dot(vectors[a], vectors[b])) for a, b in pairs]
        windows = [{} for _ in pairs]
    data = [{"index": i, "object": "score", "score": s} | windows[i] for i, s in enumerate(scores)]
    return json_response(listed(request, answer, data))


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


async def classify(request: Request) -> Response:
    """vLLM's classify, or Infinity's (its body has `raw_scores`)."""
    body: InputBody = await body_of(request, InputBody)
    texts = Texts(as_list(body.input), body.truncation, body.prompt_name)
    answer = await run(request, texts, body.model, Classify(body.raw))
    labels = classifier_rule(answer.model).labels
    scored = [out[SCORES] for out in answer.outputs]
    if body.raw_scores is not None:  # Infinity's
        data: Any = [
            [{"score": float(s[i]), "label": labels[i]} for i in ranked(s, None)] for s in scored
        ]
        return json_response(listed(request, answer, data) | {"object": "classify"})
    data = [
        {"index": n, "label": labels[int(np.argmax(s))], "probs": s, "num_classes": len(labels)}
        for n, s in enumerate(scored)
    ]
    return json_response(listed(request, answer, data))


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


post(router, "/v1/score", ScoreBody, "As /score")(score)

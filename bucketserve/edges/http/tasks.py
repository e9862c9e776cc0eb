"""Our task routes beside the other servers' (`tei_api`, `cohere_api`, `openai_api`), in the
shapes Hugging Face's pipelines answer:

- `POST /classify` (text-embeddings-inference's `/predict` body): a text, a pair, or a batch
  of them; each label's score by the `Classify` head, best first.
- `POST /classify_tokens`: each text's entities (a tagger's, NER's) by the `Classify` head
  for each token, as Hugging Face's token-classification pipeline gives them
  (`core.entities`).
- `POST /fill_mask`: each mask token's likeliest tokens, as the fill-mask pipeline gives them.

A body becomes the core's one call (`Texts` or `TextPairs`, with the task's head): admission,
deadlines, the token budget, batching by length and the API key are the core's and the app's,
as for every route. A route without a `model` goes to the default model when it serves the
task, else to the one model that does. Errors come in the one error form.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Request, Response
from pydantic import Field, StrictBool, StrictStr

from bucketserve.core.calls import Inputs, TextPairs, Texts
from bucketserve.core.tasks.classifier import SCORES, Classify, classifier_rule
from bucketserve.core.tasks.entities import ENTITIES, TagTokens
from bucketserve.core.tasks.fill_mask import GUESSES, FillMask
from bucketserve.edges.http.bodies import (
    Text,
    TextOptions,
    TextsBody,
    ranked,
    refuse_prompt_for_pairs,
)
from bucketserve.edges.http.common import json_response
from bucketserve.edges.http.schemas import Positive
from bucketserve.edges.http.task_call import body_of, post, run
from bucketserve.errors import InvalidInput

router = APIRouter(tags=["Tasks"])


Item = Text | Annotated[list[Text], Field(min_length=1, max_length=2)]


class ClassifyBody(TextOptions):
    """text-embeddings-inference's /predict body, read as TEI reads it: a text; a pair [a, b]
    (two strings are one pair); or a batch: a list of one or three or more texts, of pairs
    [[a, b], ...], or of texts each in a list of one [[a], [b]]."""

    inputs: Item | Annotated[list[Item], Field(min_length=1)]
    raw_scores: StrictBool = Field(False, description="the logits, not their scores")
    top_k: Positive | None = Field(None, description="the best this many labels (default: all)")

    @property
    def single(self) -> bool:
        """Whether the body is one text or one pair (answered unnested), not a batch."""
        given = self.inputs
        pair = len(given) == 2 and all(isinstance(x, str) for x in given)
        return isinstance(given, str) or pair

    @property
    def items(self) -> list[list[str]]:
        """Each item of the batch (one, when `single`): a text as [text], a pair as [a, b]."""
        given = self.inputs
        if isinstance(given, str):
            return [[given]]
        if self.single:
            return [list(given)]  # type: ignore[arg-type]
        return [[item] if isinstance(item, str) else list(item) for item in given]


class TokensBody(TextsBody):
    aggregation: Literal["none", "simple", "first", "average", "max"] = Field(
        "none",
        description="none: each token; simple: neighbouring tokens of one entity as one; "
        "first, average, max: a word's pieces first made one, scored by its first piece, their "
        "mean or the best of them (Hugging Face's aggregation strategies)",
    )
    ignore_labels: list[StrictStr] = Field(["O"], description="entities never answered")


class FillMaskBody(TextsBody):
    top_k: Positive = Field(5, description="the likeliest this many tokens for each mask")


@post(
    router,
    "/classify",
    ClassifyBody,
    "Each label's score for a text or a text pair, or a batch of them",
)
async def classify(request: Request) -> Response:
    body: ClassifyBody = await body_of(request, ClassifyBody)
    texts = body.items
    if any(len(t) == 2 for t in texts) and any(len(t) == 1 for t in texts):
        raise InvalidInput("inputs: send texts, or pairs, not both in one batch")
    inputs: Inputs
    if len(texts[0]) == 2:
        refuse_prompt_for_pairs(body.prompt_name)
        inputs = TextPairs([(a, b) for a, b in texts], body.truncation)
    else:
        inputs = Texts([t[0] for t in texts], body.truncation, body.prompt_name)
    answer = await run(request, inputs, body.model, Classify(body.raw_scores))
    labels = classifier_rule(answer.model).labels
    results = [
        [{"label": labels[i], "score": float(scores[i])} for i in ranked(scores, body.top_k)]
        for scores in (out[SCORES] for out in answer.outputs)
    ]
    return json_response(results[0] if body.single else results)


@post(
    router,
    "/classify_tokens",
    TokensBody,
    "Each text's entities: labels, scores and character spans of its tokens",
)
async def classify_tokens(request: Request) -> Response:
    body: TokensBody = await body_of(request, TokensBody)
    if body.prompt_name is not None:  # (each entity's span is in the text as sent)
        raise InvalidInput("prompt_name: a tagger reads the texts as sent", param="prompt_name")
    head = TagTokens(body.aggregation, tuple(body.ignore_labels))
    answer = await run(request, body.inputs_of_texts, body.model, head)
    found = [out[ENTITIES].tolist() for out in answer.outputs]
    return json_response(found[0] if isinstance(body.inputs, str) else found)


@post(
    router,
    "/fill_mask",
    FillMaskBody,
    "Each mask token's likeliest tokens, as Hugging Face's fill-mask pipeline gives them",
)
async def fill_mask(request: Request) -> Response:
    body: FillMaskBody = await body_of(request, FillMaskBody)
    answer = await run(request, body.inputs_of_texts, body.model, FillMask(body.top_k))
    per_text = [out[GUESSES].tolist() for out in answer.outputs]  # (a text's masks' guesses)
    found = [masks[0] if len(masks) == 1 else masks for masks in per_text]
    return json_response(found[0] if isinstance(body.inputs, str) else found)

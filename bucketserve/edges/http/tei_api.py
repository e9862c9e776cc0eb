"""text-embeddings-inference's routes, as its clients send them:

- `POST /rerank` (`query`, `texts`): each (query, text) pair one sequence, as the model's
  tokenizer pairs them, scored by the `Rerank` head; answered sorted by relevance.
- `POST /embed_sparse` and `POST /embed_all`: a text's sparse weights by the `Sparse` head, its
  vector per token by the `EmbedAll` head.
- `POST /tokenize` and `POST /decode`: the model's own tokenizer, with no model run.

A body becomes the core's one call, as every route's; a route without a `model` goes to the
default model when it serves the task, else to the one model that does.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request, Response
from pydantic import Field, StrictBool, StrictStr

from bucketserve.core.calls import TextPairs, Texts
from bucketserve.core.tasks.classifier import RELEVANCE, Rerank
from bucketserve.core.tasks.sparse import INDICES, VALUES, VECTORS, EmbedAll, Sparse
from bucketserve.core.tasks.tokenize import TEXT, TOKENS, Decode, IdRows, Tokenize
from bucketserve.edges.http.bodies import (
    Text,
    TextOptions,
    TextsBody,
    ranked,
    refuse_prompt_for_pairs,
)
from bucketserve.edges.http.common import json_response
from bucketserve.edges.http.schemas import Integer, Lenient, Positive
from bucketserve.edges.http.task_call import READ, body_of, post, run

router = APIRouter(tags=["text-embeddings-inference"])


class TeiRerankBody(TextOptions):
    """text-embeddings-inference's /rerank."""

    query: Text
    texts: list[Text] = Field(min_length=1, description="the documents")
    raw_scores: StrictBool = Field(False, description="the logits, not their sigmoid")
    return_text: StrictBool = Field(False, description="each document's text beside its score")


class SparseBody(TextsBody):
    top_k: Positive | None = Field(None, description="the largest this many weights of each")


class TokenizeBody(Lenient):
    model: StrictStr | None = Field(None, min_length=1)
    inputs: Text | Annotated[list[Text], Field(min_length=1)]
    add_special_tokens: StrictBool = True


class DecodeBody(Lenient):
    model: StrictStr | None = Field(None, min_length=1)
    ids: list[Integer] | Annotated[list[list[Integer]], Field(min_length=1)]
    skip_special_tokens: StrictBool = True


@post(
    router,
    "/rerank",
    TeiRerankBody,
    "Rerank texts against a query (text-embeddings-inference's shape)",
)
async def rerank_tei(request: Request) -> Response:
    body: TeiRerankBody = await body_of(request, TeiRerankBody)
    refuse_prompt_for_pairs(body.prompt_name)
    pairs = TextPairs([(body.query, text) for text in body.texts], body.truncation)
    answer = await run(request, pairs, body.model, Rerank(body.raw_scores))
    scores = [float(out[RELEVANCE]) for out in answer.outputs]
    return json_response(
        [
            {"index": i, "score": scores[i]} | ({"text": body.texts[i]} if body.return_text else {})
            for i in ranked(scores, None)
        ]
    )


@post(
    router,
    "/embed_sparse",
    SparseBody,
    "Each text's sparse weights over the vocabulary: [{index, value}]",
)
async def embed_sparse(request: Request) -> Response:
    body: SparseBody = await body_of(request, SparseBody)
    answer = await run(request, body.inputs_of_texts, body.model, Sparse(body.top_k))
    return json_response(
        [
            [
                {"index": i, "value": v}  # (tolist: Python numbers in one call, not each)
                for i, v in zip(out[INDICES].tolist(), out[VALUES].tolist(), strict=True)
            ]
            for out in answer.outputs
        ]
    )


@post(router, "/embed_all", TextsBody, "One vector per token of each text")
async def embed_all(request: Request) -> Response:
    body: TextsBody = await body_of(request, TextsBody)
    answer = await run(request, body.inputs_of_texts, body.model, EmbedAll())
    return json_response([out[VECTORS] for out in answer.outputs])


@post(
    router,
    "/tokenize",
    TokenizeBody,
    "Tokens of each text, by the model's own tokenizer: ids, pieces, offsets",
    READ,
)
async def tokenize(request: Request) -> Response:
    body: TokenizeBody = await body_of(request, TokenizeBody)
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    answer = await run(request, Texts(texts), body.model, Tokenize(body.add_special_tokens))
    return json_response([out[TOKENS].tolist() for out in answer.outputs])


@post(router, "/decode", DecodeBody, "Texts of token id lists, by the model's own tokenizer", READ)
async def decode(request: Request) -> Response:
    body: DecodeBody = await body_of(request, DecodeBody)
    rows: Any = [body.ids] if not body.ids or isinstance(body.ids[0], int) else body.ids
    answer = await run(request, IdRows(rows), body.model, Decode(body.skip_special_tokens))
    return json_response([out[TEXT].item() for out in answer.outputs])

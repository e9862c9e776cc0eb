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

import time
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import Field, StrictBool, StrictStr

from bucketserve.about import VERSION
from bucketserve.core.calls import TextPairs, Texts
from bucketserve.core.model import Model
from bucketserve.core.task import Task
from bucketserve.core.tasks.classifier import RELEVANCE, Rerank
from bucketserve.core.tasks.embedding import EMBEDDING, Embed
from bucketserve.core.tasks.sparse import INDICES, VALUES, VECTORS, EmbedAll, Sparse
from bucketserve.core.tasks.tokenize import TEXT, TOKENS, Decode, IdRows, Tokenize
from bucketserve.edges.http.bodies import (
    LONG_INPUTS,
    InputsBody,
    LongInputs,
    TextCut,
    TextOptions,
    ranked,
    refuse_prompt_for_pairs,
    window_of,
)
from bucketserve.edges.http.common import engine_of, json_response, limits_of
from bucketserve.edges.http.schemas import ErrorBody, Integer, Lenient, Positive, Text
from bucketserve.edges.http.task_call import READ, body_of, post, run

router = APIRouter(tags=["text-embeddings-inference"])

STARTING = {"error": "the server is starting or draining", "error_type": "Unhealthy"}


class TeiRerankBody(TextOptions):
    """text-embeddings-inference's /rerank."""

    query: Text
    texts: list[Text] = Field(min_length=1, description="the documents")
    raw_scores: StrictBool = Field(False, description="the logits, not their sigmoid")
    return_text: StrictBool = Field(False, description="each document's text beside its score")
    long_inputs: LongInputs | None = LONG_INPUTS


class EmbedBody(InputsBody):
    """text-embeddings-inference's /embed."""

    normalize: StrictBool = Field(True, description="L2-normalise each vector")
    dimensions: Positive | None = Field(
        None, description="cut to this width, for a model whose config allows it"
    )


class SimilarityInputs(Lenient):
    source_sentence: Text
    sentences: list[Text] = Field(min_length=1, description="compared with source_sentence")


class SimilarityBody(Lenient):
    """text-embeddings-inference's /similarity (Hugging Face's sentence-similarity task)."""

    model: StrictStr | None = Field(None, min_length=1)
    inputs: SimilarityInputs
    parameters: TextCut | None = None


class SparseBody(InputsBody):
    top_k: Positive | None = Field(None, description="the largest this many weights of each")


class TokenizeBody(Lenient):
    model: StrictStr | None = Field(None, min_length=1)
    inputs: Text | Annotated[list[Text], Field(min_length=1)]
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = Field(
        None,
        description="the model's prompt put before each text: offsets are in the prompted text",
    )


class DecodeBody(Lenient):
    model: StrictStr | None = Field(None, min_length=1)
    ids: list[Integer] | Annotated[list[list[Integer]], Field(min_length=1)]
    skip_special_tokens: StrictBool = True


async def rerank_tei(request: Request) -> Response:
    """POST /rerank in text-embeddings-inference's shape (`shapes` tells it from Cohere's)."""
    body: TeiRerankBody = await body_of(request, TeiRerankBody)
    refuse_prompt_for_pairs(body.prompt_name)
    pairs = [(body.query, text) for text in body.texts]
    inputs = TextPairs(pairs, body.truncation, body.long_inputs)
    answer = await run(request, inputs, body.model, Rerank(body.raw_scores))
    scores = [float(out[RELEVANCE]) for out in answer.outputs]
    return json_response(
        [
            {"index": i, "score": scores[i]}
            | ({"text": body.texts[i]} if body.return_text else {})
            | window_of(answer.outputs[i])
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
    inputs = body.inputs_of(request.state.body_bytes)
    answer = await run(request, inputs, body.model, Sparse(body.top_k))
    return json_response(
        [
            [
                {"index": i, "value": v}  # (tolist: Python numbers in one call, not each)
                for i, v in zip(out[INDICES].tolist(), out[VALUES].tolist(), strict=True)
            ]
            for out in answer.outputs
        ]
    )


@post(router, "/embed_all", InputsBody, "One vector per token of each text")
async def embed_all(request: Request) -> Response:
    body: InputsBody = await body_of(request, InputsBody)
    inputs = body.inputs_of(request.state.body_bytes)
    answer = await run(request, inputs, body.model, EmbedAll())
    return json_response([out[VECTORS] for out in answer.outputs])


@post(router, "/embed", EmbedBody, "One vector per text, pooled as the model's config says")
async def embed(request: Request) -> Response:
    body: EmbedBody = await body_of(request, EmbedBody)
    inputs = body.inputs_of(request.state.body_bytes)
    head = Embed(body.dimensions, body.normalize)
    answer = await run(request, inputs, body.model, head)
    return json_response([out[EMBEDDING] for out in answer.outputs])


@post(
    router,
    "/similarity",
    SimilarityBody,
    "The cosine similarity of a sentence to each of others (sentence-similarity)",
)
async def similarity(request: Request) -> Response:
    body: SimilarityBody = await body_of(request, SimilarityBody)
    given = body.inputs
    given_options = body.parameters or TextCut.model_validate({})
    options = given_options.with_defaults(limits_of(request).auto_truncate)
    sentences = [given.source_sentence, *given.sentences]
    texts = Texts(sentences, options.truncation, options.prompt_name)
    answer = await run(request, texts, body.model, Embed(normalize=True))
    source, *others = (out[EMBEDDING] for out in answer.outputs)
    return json_response([float(np.dot(source, other)) for other in others])


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
    answer = await run(
        request,
        Texts(texts, prompt_name=body.prompt_name),
        body.model,
        Tokenize(body.add_special_tokens),
    )
    return json_response([out[TOKENS].tolist() for out in answer.outputs])


@post(router, "/decode", DecodeBody, "Texts of token id lists, by the model's own tokenizer", READ)
async def decode(request: Request) -> Response:
    body: DecodeBody = await body_of(request, DecodeBody)
    rows: Any = [body.ids] if not body.ids or isinstance(body.ids[0], int) else body.ids
    answer = await run(request, IdRows(rows), body.model, Decode(body.skip_special_tokens))
    return json_response([out[TEXT].item() for out in answer.outputs])


UNHEALTHY: dict[int | str, dict[str, Any]] = {
    503: {"model": ErrorBody, "description": "starting, or draining"}
}


@router.get(
    "/health",
    summary="Whether the server takes requests: 200, or 503 starting or draining",
    response_class=Response,
    responses={200: {"description": "it takes requests: {unix}, the server's clock"}, **UNHEALTHY},
)
async def health(request: Request) -> Response:
    """text-embeddings-inference's health (also at GET / and /ping, as it serves it), with
    Infinity's body (TEI's clients read the status alone; infinity_client reads `unix`)."""
    if engine_of(request).ready:
        return json_response({"unix": time.time()})
    return json_response(STARTING | {"code": "unavailable"}, 503)


for path in ("/", "/ping"):
    router.get(path, summary="As /health", response_class=Response, responses=UNHEALTHY)(health)


@router.get("/info", summary="The default model, as text-embeddings-inference describes it")
async def info(request: Request) -> Response:
    model = engine_of(request).registry.resolve()
    limits = limits_of(request)
    return json_response(
        {
            "model_id": model.name,
            "model_sha": model.info.fingerprint,
            "model_dtype": "float32",
            "model_type": model_type(model),
            "max_concurrent_requests": model.info.queue_capacity,
            "max_input_length": model.info.rules.max_length,
            "max_batch_tokens": limits.max_request_tokens,
            "max_batch_requests": None,
            "max_client_batch_size": limits.max_sequences,
            "auto_truncate": limits.auto_truncate,
            "tokenization_workers": 1,
            "version": VERSION,
            "sha": None,
            "docker_label": None,
            "served_model_name": model.name,
        }
    )


def model_type(model: Model) -> dict[str, Any]:
    """What text-embeddings-inference says a model is: a reranker, a classifier (its labels),
    or an embedding model (its pooling; splade for sparse weights)."""
    classifier = model.info.rule(Task.CLASSIFY)
    if classifier is not None:
        labels = {"id2label": dict(enumerate(classifier.labels))}
        labels["label2id"] = {label: i for i, label in enumerate(classifier.labels)}
        return {"reranker" if model.info.rule(Task.RERANK) else "classifier": labels}
    embedding = model.info.rule(Task.EMBED)
    pooling = embedding.pooling.value if embedding is not None else "splade"
    return {"embedding": {"pooling": pooling}}

"""text-embeddings-inference's routes, as its clients send them (their codecs and pages; the
table, `routes`, serves them):

- `POST /rerank` (`query`, `texts`): each (query, text) pair one sequence, as the model's
  tokenizer pairs them, scored by the `Rerank` head; answered sorted by relevance.
- `POST /embed_sparse` and `POST /embed_all`: a text's sparse weights by the `Sparse` head, its
  vector per token by the `EmbedAll` head.
- `POST /tokenize` and `POST /decode`: the model's own tokenizer, with no model run.

A body becomes the core's one call, as every route's; a call without a `model` goes to the
default model when it serves the task, else to the one model that does. `GET /health` (at
`/` and `/ping` too) and `GET /info` are pages: what the server holds, no call.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import numpy as np
from fastapi import Request, Response
from pydantic import Field, StrictBool, StrictStr

from bucketserve.about import VERSION
from bucketserve.core.calls import Answer, Call, TextPairs, Texts
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
from bucketserve.edges.http.codec import READ, Codec, Page, reading
from bucketserve.edges.http.common import engine_of, json_response, limits_of
from bucketserve.edges.http.schemas import ErrorBody, Integer, Lenient, Positive, Text

TAG = "text-embeddings-inference"

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


def rerank_call(request: Request, body: TeiRerankBody) -> Call:
    """/rerank in text-embeddings-inference's shape."""
    refuse_prompt_for_pairs(body.prompt_name)
    pairs = [(body.query, text) for text in body.texts]
    inputs = TextPairs(pairs, body.truncation, body.long_inputs)
    return Call(inputs, body.model, head=Rerank(body.raw_scores))


def rerank_json(request: Request, body: TeiRerankBody, answer: Answer) -> Any:
    scores = [float(out[RELEVANCE]) for out in answer.outputs]
    return [
        {"index": i, "score": scores[i]}
        | ({"text": body.texts[i]} if body.return_text else {})
        | window_of(answer.outputs[i])
        for i in ranked(scores, None)
    ]


def embed_sparse_call(request: Request, body: SparseBody) -> Call:
    inputs = body.inputs_of(request.state.body_bytes)
    return Call(inputs, body.model, head=Sparse(body.top_k))


def embed_sparse_json(request: Request, body: SparseBody, answer: Answer) -> Any:
    return [
        [
            {"index": i, "value": v}  # (tolist: Python numbers in one call, not each)
            for i, v in zip(out[INDICES].tolist(), out[VALUES].tolist(), strict=True)
        ]
        for out in answer.outputs
    ]


def embed_all_call(request: Request, body: InputsBody) -> Call:
    return Call(body.inputs_of(request.state.body_bytes), body.model, head=EmbedAll())


def embed_all_json(request: Request, body: InputsBody, answer: Answer) -> Any:
    return [out[VECTORS] for out in answer.outputs]


def embed_call(request: Request, body: EmbedBody) -> Call:
    inputs = body.inputs_of(request.state.body_bytes)
    return Call(inputs, body.model, head=Embed(body.dimensions, body.normalize))


def embed_json(request: Request, body: EmbedBody, answer: Answer) -> Any:
    return [out[EMBEDDING] for out in answer.outputs]


def similarity_call(request: Request, body: SimilarityBody) -> Call:
    given = body.inputs
    given_options = body.parameters or TextCut.model_validate({})
    options = given_options.with_defaults(limits_of(request).auto_truncate)
    sentences = [given.source_sentence, *given.sentences]
    texts = Texts(sentences, options.truncation, options.prompt_name)
    return Call(texts, body.model, head=Embed(normalize=True))


def similarity_json(request: Request, body: SimilarityBody, answer: Answer) -> Any:
    source, *others = (out[EMBEDDING] for out in answer.outputs)
    return [float(np.dot(source, other)) for other in others]


def tokenize_call(request: Request, body: TokenizeBody) -> Call:
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    inputs = Texts(texts, prompt_name=body.prompt_name)
    return Call(inputs, body.model, head=Tokenize(body.add_special_tokens))


def tokenize_json(request: Request, body: TokenizeBody, answer: Answer) -> Any:
    return [out[TOKENS].tolist() for out in answer.outputs]


def decode_call(request: Request, body: DecodeBody) -> Call:
    rows: Any = [body.ids] if not body.ids or isinstance(body.ids[0], int) else body.ids
    return Call(IdRows(rows), body.model, head=Decode(body.skip_special_tokens))


def decode_json(request: Request, body: DecodeBody, answer: Answer) -> Any:
    return [out[TEXT].item() for out in answer.outputs]


RERANK = Codec(TAG, "rerank", TeiRerankBody, reading(TeiRerankBody), rerank_call, rerank_json)
EMBED_SPARSE = Codec(
    TAG, "embed_sparse", SparseBody, reading(SparseBody), embed_sparse_call, embed_sparse_json
)
EMBED_ALL = Codec(TAG, "embed_all", InputsBody, reading(InputsBody), embed_all_call, embed_all_json)
EMBED = Codec(TAG, "embed", EmbedBody, reading(EmbedBody), embed_call, embed_json)
SIMILARITY = Codec(
    TAG, "similarity", SimilarityBody, reading(SimilarityBody), similarity_call, similarity_json
)
TOKENIZE = Codec(
    TAG, "tokenize", TokenizeBody, reading(TokenizeBody), tokenize_call, tokenize_json, READ
)
DECODE = Codec(TAG, "decode", DecodeBody, reading(DecodeBody), decode_call, decode_json, READ)


UNHEALTHY: dict[int | str, dict[str, Any]] = {
    503: {"model": ErrorBody, "description": "starting, or draining"}
}


async def health(request: Request) -> Response:
    """text-embeddings-inference's health (also at GET / and /ping, as it serves it), with
    Infinity's body (TEI's clients read the status alone; infinity_client reads `unix`)."""
    if engine_of(request).ready:
        return json_response({"unix": time.time()})
    return json_response(STARTING | {"code": "unavailable"}, 503)


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
        # (JSON's keys are strings, as transformers' config.json writes id2label)
        labels = {"id2label": {str(i): label for i, label in enumerate(classifier.labels)}}
        labels["label2id"] = {label: i for i, label in enumerate(classifier.labels)}
        return {"reranker" if model.info.rule(Task.RERANK) else "classifier": labels}
    embedding = model.info.rule(Task.EMBED)
    pooling = embedding.pooling.value if embedding is not None else "splade"
    return {"embedding": {"pooling": pooling}}


HEALTH = Page(
    TAG,
    health,
    "Whether the server takes requests: 200, or 503 starting or draining",
    options={
        "response_class": Response,
        "responses": {
            200: {"description": "it takes requests: {unix}, the server's clock"},
            **UNHEALTHY,
        },
    },
)
HEALTH_TOO = Page(  # (at GET / and /ping, as TEI serves it)
    TAG, health, "As /health", options={"response_class": Response, "responses": UNHEALTHY}
)
INFO = Page(TAG, info, "The default model, as text-embeddings-inference describes it")

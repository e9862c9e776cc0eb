"""The tasks a retrieval pipeline calls beside embeddings, in the shapes its clients send:

- `POST /rerank` (text-embeddings-inference's: `query`, `texts`) and `POST /v1/rerank`,
  `POST /v2/rerank` (Cohere's and Jina's: `query`, `documents`, `top_n`): each (query,
  document) pair one sequence, as the model's tokenizer pairs them, scored by the `Rerank`
  head; answered sorted by relevance.
- `POST /classify` (text-embeddings-inference's `/predict` body): a text, a pair, or a batch
  of them; each label's score by the `Classify` head, best first.
- `POST /classify_tokens`: each text's entities (a tagger's, NER's) by the `Classify` head
  for each token, as Hugging Face's token-classification pipeline gives them
  (`core.entities`).
- `POST /embed_sparse` and `POST /embed_all` (text-embeddings-inference's): a text's sparse
  weights by the `Sparse` head, its vector per token by the `EmbedAll` head.
- `POST /tokenize` and `POST /decode`: the model's own tokenizer, with no model run.

A body becomes the core's one call (`Texts` or `TextPairs`, with the task's head): admission,
deadlines, the token budget, batching by length and the API key are the core's and the app's,
as for every route. A route without a `model` goes to the default model when it serves the
task, else to the one model that does. Errors come in the one error form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import Field, StrictBool, StrictStr

from bucketserve.core.calls import Inputs, TextPairs, Texts
from bucketserve.core.model import Truncation
from bucketserve.core.tasks.classifier import RELEVANCE, SCORES, Classify, Rerank, classifier_rule
from bucketserve.core.tasks.entities import ENTITIES, TagTokens
from bucketserve.core.tasks.fill_mask import GUESSES, FillMask
from bucketserve.core.tasks.sparse import INDICES, VALUES, VECTORS, EmbedAll, Sparse
from bucketserve.core.tasks.tokenize import TEXT, TOKENS, Decode, IdRows, Tokenize
from bucketserve.edges.http.common import (
    json_response,
    request_id,
)
from bucketserve.edges.http.schemas import Integer, Positive, Strict
from bucketserve.edges.http.task_call import READ, body_of, post, run
from bucketserve.errors import InvalidInput, quoted

router = APIRouter(tags=["Tasks"])

Text = Annotated[StrictStr, Field(min_length=1)]


class _TextOptions(Strict):
    model: StrictStr | None = Field(
        None, min_length=1, description="default: the default model, or the one that does this"
    )
    truncate: StrictBool = Field(
        False, description="cut a text longer than the model takes (else it is refused)"
    )
    truncation_direction: Literal["right", "left", "Right", "Left"] = Field(
        "right", description="where a text is cut: its end (right) or its start (left)"
    )
    prompt_name: StrictStr | None = Field(
        None, description="the model's prompt put before each text (its config's [prompts])"
    )

    @property
    def truncation(self) -> Truncation:
        return Truncation(self.truncate, self.truncation_direction.lower() == "left")


class TeiRerankBody(_TextOptions):
    """text-embeddings-inference's /rerank."""

    query: Text
    texts: list[Text] = Field(min_length=1, description="the documents")
    raw_scores: StrictBool = Field(False, description="the logits, not their sigmoid")
    return_text: StrictBool = Field(False, description="each document's text beside its score")


Document = Annotated[dict[str, Any], Field(min_length=1)]  # Cohere's: fields beside its text


class RerankBody(Strict):
    """Cohere's and Jina's rerank (their SDKs' fields; the ones they also send and that do not
    apply here are accepted and ignored)."""

    model: StrictStr | None = Field(None, min_length=1)
    query: Text
    documents: list[Text | Document] = Field(min_length=1)
    top_n: Positive | None = Field(None, description="the best this many (default: all)")
    return_documents: StrictBool = Field(False, description="each document beside its score")
    truncate: StrictBool = Field(True, description="cut a pair longer than the model takes")
    rank_fields: Annotated[list[StrictStr], Field(min_length=1)] | None = Field(
        None,
        description="the fields of a document object it is ranked by, in order (default: "
        "text); two or more are read as one text of `field: value` lines",
    )
    max_chunks_per_doc: Integer | None = Field(None, description="accepted and ignored")
    max_tokens_per_doc: Integer | None = Field(None, description="accepted and ignored")
    relevant_spans: dict[str, Any] | None = Field(None, description="accepted and ignored")
    priority: Integer | None = Field(
        None, description="the server's priority level: 1 first; 0 or none, the default"
    )


Item = Text | Annotated[list[Text], Field(min_length=1, max_length=2)]


class ClassifyBody(_TextOptions):
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


class TextsBody(_TextOptions):
    """A text or texts, as text-embeddings-inference's embed routes take them."""

    inputs: Text | Annotated[list[Text], Field(min_length=1)]

    @property
    def texts(self) -> list[str]:
        return [self.inputs] if isinstance(self.inputs, str) else list(self.inputs)

    @property
    def inputs_of_texts(self) -> Texts:
        """The texts as the core's inputs, cut and prompted as the body says."""
        return Texts(self.texts, self.truncation, self.prompt_name)


class TokensBody(TextsBody):
    aggregation: Literal["none", "simple", "first", "average", "max"] = Field(
        "none",
        description="none: each token; simple: neighbouring tokens of one entity as one; "
        "first, average, max: a word's pieces first made one, scored by its first piece, their "
        "mean or the best of them (Hugging Face's aggregation strategies)",
    )
    ignore_labels: list[StrictStr] = Field(["O"], description="entities never answered")


class SparseBody(TextsBody):
    top_k: Positive | None = Field(None, description="the largest this many weights of each")


class FillMaskBody(TextsBody):
    top_k: Positive = Field(5, description="the likeliest this many tokens for each mask")


class TokenizeBody(Strict):
    model: StrictStr | None = Field(None, min_length=1)
    inputs: Text | Annotated[list[Text], Field(min_length=1)]
    add_special_tokens: StrictBool = True


class DecodeBody(Strict):
    model: StrictStr | None = Field(None, min_length=1)
    ids: list[Integer] | Annotated[list[list[Integer]], Field(min_length=1)]
    skip_special_tokens: StrictBool = True


def ranked(scores: Sequence[float] | np.ndarray, top: int | None) -> list[int]:
    """Indices by score, best first (ties in order), cut to `top`."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return order if top is None else order[:top]


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


async def rerank(request: Request) -> Response:
    """Cohere's and Jina's rerank, at both their paths."""
    body: RerankBody = await body_of(request, RerankBody)
    documents = [document_text(d, i, body.rank_fields) for i, d in enumerate(body.documents)]
    if body.top_n is not None and body.top_n > len(documents):
        raise InvalidInput(
            f"top_n {body.top_n} is more than the {len(documents)} documents", param="top_n"
        )
    pairs = TextPairs([(body.query, d) for d in documents], Truncation(body.truncate))
    answer = await run(request, pairs, body.model, Rerank(), body.priority)
    scores = [float(out[RELEVANCE]) for out in answer.outputs]
    results = [
        {"index": i, "relevance_score": scores[i]}
        | ({"document": as_sent(body.documents[i])} if body.return_documents else {})
        for i in ranked(scores, body.top_n)
    ]
    tokens = sum(answer.lengths)
    return json_response(
        {
            "id": request_id(request),
            "results": results,
            "model": answer.model.name,
            "usage": {"total_tokens": tokens},
            "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
        }
    )


def document_text(document: str | dict[str, Any], index: int, fields: list[str] | None) -> str:
    """The text a document is ranked by: itself, or (an object, as Cohere takes them) its
    `text`, or the one field `rank_fields` names, or the fields it names as `field: value`
    lines, in its order."""
    if isinstance(document, str):
        return document
    named = fields or ["text"]
    missing = next((f for f in named if not isinstance(document.get(f), (str, int, float))), None)
    if missing is not None:
        raise InvalidInput(
            f"documents.{index}: no field {quoted(missing)} of text to rank it by (a document "
            f"object is ranked by {', '.join(named)}: rank_fields names them)",
            param="documents",
        )
    values = [str(document[f]) for f in named]
    text = (
        values[0]
        if len(named) == 1
        else "\n".join(f"{f}: {v}" for f, v in zip(named, values, strict=True))
    )
    if not text:
        raise InvalidInput(f"documents.{index}: its text is empty", param="documents")
    return text


def as_sent(document: str | dict[str, Any]) -> dict[str, Any]:
    """A document as an answer returns it: an object as sent, a text as {text}."""
    return {"text": document} if isinstance(document, str) else document


for path in ("/v1/rerank", "/v2/rerank"):
    shape = f"Rerank documents against a query (Cohere's and Jina's shape), at {path}"
    post(router, path, RerankBody, shape)(rerank)


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


def refuse_prompt_for_pairs(prompt_name: str | None) -> None:
    """A prompt goes before a text that is embedded or classified alone; a pair (a query and
    a document) is scored as sent, so a prompt named for one is refused, not ignored."""
    if prompt_name is not None:
        raise InvalidInput(
            "prompt_name: a text pair is scored as sent; a model's prompts go before single "
            "texts (embed or classify texts, not pairs, to use one)",
            param="prompt_name",
        )


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

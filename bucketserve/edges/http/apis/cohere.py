"""Cohere's embed and rerank APIs, as its SDKs (and LangChain's CohereEmbeddings and
CohereRerank) send them: `POST /v1/embed`, `POST /v2/embed`, and `POST /v1/rerank`, `POST
/v2/rerank`, where Jina's clients send theirs too (`query`, `documents`, `top_n`: each (query,
document) pair one sequence, scored by the `Rerank` head, answered sorted by relevance); the
same body with Infinity's `raw_scores` is answered as Infinity answers (`INFINITY_RERANK`).
Their codecs; the table, `routes`, serves them.

A body becomes the core's one call (`Texts`, with the `Embed` head), as OpenAI's does: its
`input_type` chooses the model's prompt (`ModelInfo.prompt_of_type`: e5's `query: ` for
`search_query`), its `truncate` how a long text is cut (`END`, `START`, or `NONE`: refused),
`output_dimension` cuts the vector where the model's config allows it; `embedding_types`
asks for floats, int8, uint8, binary, ubinary or base64 (`core.quantize`).
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import Request
from pydantic import Field, StrictBool, StrictStr

from bucketserve.core.calls import Answer, Call, TextPairs, Texts
from bucketserve.core.model import Truncation
from bucketserve.core.quantize import Calibration, EmbeddingType, quantized
from bucketserve.core.tasks.classifier import RELEVANCE, Rerank
from bucketserve.core.tasks.embedding import EMBEDDING, Embed, embedding_rule
from bucketserve.edges.http.bodies import (
    LONG_INPUTS,
    PROMPT_CUT,
    LongInputs,
    PromptCut,
    ranked,
    window_of,
)
from bucketserve.edges.http.codec import Codec, reading
from bucketserve.edges.http.common import request_id
from bucketserve.edges.http.schemas import Integer, Lenient, Positive, Text
from bucketserve.errors import InvalidInput, quoted

TAG = "Cohere"

CUTS = {"END": Truncation(), "START": Truncation(left=True), "NONE": Truncation(allowed=False)}


Kind = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


class EmbedBody(Lenient):
    """Cohere's embed (its SDKs' fields; the fields that do not apply here are ignored and
    said)."""

    model: StrictStr | None = Field(None, min_length=1)
    texts: list[Text] = Field(min_length=1)
    input_type: StrictStr | None = Field(
        None, description="search_query, search_document...: the model's prompt for it, if any"
    )
    embedding_types: Annotated[list[Kind], Field(min_length=1)] | None = Field(
        None,
        description="float, int8, uint8 (scaled over the model's calibrated ranges), binary, "
        "ubinary (the signs, eight to a byte), base64 (float32's bytes); default: float",
    )
    truncate: Literal["NONE", "START", "END"] = Field("END", description="how a long text is cut")
    output_dimension: Positive | None = Field(None, description="cut the vector to this width")
    priority: Integer | None = Field(
        None, description="the server's priority level: 1 first; 0 or none, the default"
    )


def embed_call(request: Request, body: EmbedBody) -> Call:
    texts = Texts(body.texts, CUTS[body.truncate], input_type=body.input_type)
    return Call(texts, body.model, head=Embed(body.output_dimension), priority=body.priority)


def embed_json(request: Request, body: EmbedBody, answer: Answer, version: int) -> Any:
    vectors = np.stack([out[EMBEDDING] for out in answer.outputs])
    by_type = version == 2 or body.embedding_types is not None
    kinds = list(dict.fromkeys(body.embedding_types or ["float"]))
    calibration = embedding_rule(answer.model).calibration
    typed = {kind: typed_as(vectors, kind, calibration) for kind in kinds}
    reply: dict[str, Any] = {
        "id": request_id(request),
        "texts": body.texts,
        "embeddings": typed if by_type else typed["float"],
        "response_type": "embeddings_by_type" if by_type else "embeddings_floats",
        "meta": {
            "api_version": {"version": str(version)},
            "billed_units": {"input_tokens": sum(answer.lengths)},
        },
    }
    return reply


def typed_as(vectors: np.ndarray, kind: str, calibration: Calibration | None) -> Any:
    """The vectors as Cohere answers `kind`: numbers, or base64 of float32's bytes."""
    if kind == "base64":
        return [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in vectors]
    return quantized(vectors, EmbeddingType(kind), calibration)


def embed_v1_json(request: Request, body: EmbedBody, answer: Answer) -> Any:
    return embed_json(request, body, answer, 1)


def embed_v2_json(request: Request, body: EmbedBody, answer: Answer) -> Any:
    return embed_json(request, body, answer, 2)


EMBED_V1 = Codec(
    TAG,
    "embed_v1",
    EmbedBody,
    reading(EmbedBody),
    embed_call,
    embed_v1_json,
    about="Embeddings, as Cohere's API v1 answers them: floats, or by type when types are named.",
)
EMBED_V2 = Codec(
    TAG,
    "embed_v2",
    EmbedBody,
    reading(EmbedBody),
    embed_call,
    embed_v2_json,
    about="Embeddings, as Cohere's API v2 answers them: by type.",
)


JSON_KINDS = {bool: "a boolean", int: "a number", float: "a number", dict: "an object",
              list: "an array", type(None): "null"}  # fmt: skip
Document = Annotated[dict[str, Any], Field(min_length=1)]  # Cohere's: fields beside its text


class RerankBody(Lenient):
    """Cohere's and Jina's rerank (their SDKs' fields; the ones they also send and that do not
    apply here, `max_tokens_per_doc` among them, are ignored and said)."""

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
    priority: Integer | None = Field(
        None, description="the server's priority level: 1 first; 0 or none, the default"
    )
    truncate_prompt_tokens: PromptCut = PROMPT_CUT
    long_inputs: LongInputs | None = LONG_INPUTS
    raw_scores: StrictBool | None = Field(
        None,
        description="Infinity's: the logits, not their sigmoid; a body that has it is answered "
        "as Infinity answers (each document a text)",
    )


def rerank_call(request: Request, body: RerankBody) -> Call:
    """Cohere's and Jina's rerank, at both their paths."""
    documents = [document_text(d, i, body.rank_fields) for i, d in enumerate(body.documents)]
    pairs = TextPairs(
        [(body.query, d) for d in documents], Truncation(body.truncate), body.long_inputs
    )
    return Call(pairs, body.model, head=Rerank(bool(body.raw_scores)), priority=body.priority)


def rerank_json(request: Request, body: RerankBody, answer: Answer, infinity: bool) -> Any:
    """The answer as Cohere's and Jina's rerank answer; as Infinity answers (`infinity`), each
    document a text as sent."""
    scores = [float(out[RELEVANCE]) for out in answer.outputs]
    results = [
        {"index": i, "relevance_score": scores[i]}
        | ({"document": sent(body.documents[i], infinity)} if body.return_documents else {})
        | window_of(answer.outputs[i])
        for i in ranked(scores, body.top_n)
    ]
    tokens = sum(answer.lengths)
    return {
        "id": request_id(request),
        "results": results,
        "model": answer.model.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
    }


def document_text(document: str | dict[str, Any], index: int, fields: list[str] | None) -> str:
    """The text a document is ranked by: itself, or (an object, as Cohere takes them) its
    `text`, or the one field `rank_fields` names, or the fields it names as `field: value`
    lines, in its order."""
    if isinstance(document, str):
        return document
    named = fields or ["text"]
    missing = next((f for f in named if f not in document), None)
    if missing is not None:
        raise InvalidInput(
            f"documents.{index}: no field {quoted(missing)} of text to rank it by (a document "
            f"object is ranked by {', '.join(named)}: rank_fields names them)",
            param="documents",
        )
    # (a number or an object is no text: ranked by its spelling, it would be answered for
    # what the client never sent)
    other = next((f for f in named if not isinstance(document[f], str)), None)
    if other is not None:
        raise InvalidInput(
            f"documents.{index}.{other[:64]}: a document's text must be a string, not "
            f"{JSON_KINDS.get(type(document[other]), 'that')}",
            param="documents",
        )
    values = [document[f] for f in named]
    text = (
        values[0]
        if len(named) == 1
        else "\n".join(f"{f}: {v}" for f, v in zip(named, values, strict=True))
    )
    if not text:
        raise InvalidInput(f"documents.{index}: its text is empty", param="documents")
    return text


def sent(document: str | dict[str, Any], infinity: bool) -> str | dict[str, Any]:
    """A document as an answer returns it: an object as sent; a text as {text}, or (as
    Infinity answers) as it is."""
    return {"text": document} if isinstance(document, str) and not infinity else document


def cohere_rerank_json(request: Request, body: RerankBody, answer: Answer) -> Any:
    return rerank_json(request, body, answer, infinity=False)


def infinity_rerank_json(request: Request, body: RerankBody, answer: Answer) -> Any:
    return rerank_json(request, body, answer, infinity=True)


RERANK_ABOUT = "Cohere's and Jina's rerank, at both their paths."
RERANK = Codec(
    TAG, "rerank", RerankBody, reading(RerankBody), rerank_call, cohere_rerank_json,
    about=RERANK_ABOUT,
)  # fmt: skip
# The same body with Infinity's `raw_scores` (`routes.infinity`), answered as Infinity answers
INFINITY_RERANK = Codec(
    TAG, "rerank", RerankBody, reading(RerankBody), rerank_call, infinity_rerank_json,
    about=RERANK_ABOUT,
)  # fmt: skip

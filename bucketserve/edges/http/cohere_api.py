"""Cohere's embed API, as its SDKs (and LangChain's CohereEmbeddings) send it: `POST
/v1/embed` and `POST /v2/embed`. (Its rerank is in `tasks`, beside Jina's and TEI's.)

A body becomes the core's one call (`Texts`, with the `Embed` head), as OpenAI's does: its
`input_type` chooses the model's prompt (`ModelInfo.prompt_of_type`: e5's `query: ` for
`search_query`), its `truncate` how a long text is cut (`END`, `START`, or `NONE`: refused),
`output_dimension` cuts the vector where the model's config allows it. Floats are the one
embedding type served; another is refused naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request, Response
from pydantic import Field, StrictStr

from bucketserve.core.calls import Texts
from bucketserve.core.model import Truncation
from bucketserve.core.tasks.embedding import EMBEDDING, Embed
from bucketserve.edges.http.common import (
    json_response,
    request_id,
)
from bucketserve.edges.http.schemas import Integer, Positive, Strict
from bucketserve.edges.http.task_call import body_of, post, run

router = APIRouter(tags=["Cohere"])

CUTS = {"END": Truncation(), "START": Truncation(left=True), "NONE": Truncation(allowed=False)}


class EmbedBody(Strict):
    """Cohere's embed (its SDKs' fields; those that do not apply to text are refused)."""

    model: StrictStr | None = Field(None, min_length=1)
    texts: list[Annotated[StrictStr, Field(min_length=1)]] = Field(min_length=1)
    input_type: StrictStr | None = Field(
        None, description="search_query, search_document...: the model's prompt for it, if any"
    )
    embedding_types: list[Literal["float"]] | None = Field(
        None, description="float (the one type served)"
    )
    truncate: Literal["NONE", "START", "END"] = Field("END", description="how a long text is cut")
    output_dimension: Positive | None = Field(None, description="cut the vector to this width")
    max_tokens: Integer | None = Field(None, description="accepted and ignored")
    priority: Integer | None = Field(
        None, description="the server's priority level: 1 first; 0 or none, the default"
    )


async def embed(request: Request, version: int) -> Response:
    body: EmbedBody = await body_of(request, EmbedBody)
    texts = Texts(body.texts, CUTS[body.truncate], input_type=body.input_type)
    answer = await run(request, texts, body.model, Embed(body.output_dimension), body.priority)
    vectors = [out[EMBEDDING] for out in answer.outputs]
    by_type = version == 2 or body.embedding_types is not None
    reply: dict[str, Any] = {
        "id": request_id(request),
        "texts": body.texts,
        "embeddings": {"float": vectors} if by_type else vectors,
        "response_type": "embeddings_by_type" if by_type else "embeddings_floats",
        "meta": {
            "api_version": {"version": str(version)},
            "billed_units": {"input_tokens": sum(answer.lengths)},
        },
    }
    return json_response(reply)


@post(router, "/v1/embed", EmbedBody, "Embeddings (v1)")
async def embed_v1(request: Request) -> Response:
    """Embeddings, as Cohere's API v1 answers them: floats, or by type when types are named."""
    return await embed(request, 1)


@post(router, "/v2/embed", EmbedBody, "Embeddings (v2)")
async def embed_v2(request: Request) -> Response:
    """Embeddings, as Cohere's API v2 answers them: by type."""
    return await embed(request, 2)

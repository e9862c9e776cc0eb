"""OpenAI's embeddings API, as its SDKs (and LangChain, LlamaIndex, LiteLLM) send it:
`POST /v1/embeddings` and `GET /v1/models` (and at the root, as TEI's and Infinity's copies):
its codec and pages; the table, `routes`, serves them.

A body becomes the core's one call (`Texts`, or `Sequences` for token ids) with the `Embed`
head (`bucketserve.core.heads`): the core pools and normalises each sequence's outputs by the
model's embedding rule, and the route sends the vectors as floats or as base64 of
little-endian float32 (the SDKs' default). Errors come in OpenAI's form (`dialects.Form.HOSTED`),
with the server's statuses.
"""

from __future__ import annotations

import base64
import time
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import Request, Response
from pydantic import BaseModel, Field, StrictBool, StrictStr, ValidationError

from bucketserve.core.calls import Answer, Call, Inputs, LateChunks, Sequences, Texts
from bucketserve.core.heads import Head, not_served
from bucketserve.core.model import Model, Truncation
from bucketserve.core.quantize import quantized
from bucketserve.core.task import Task
from bucketserve.core.tasks.embedding import (
    EMBEDDING,
    Embed,
    Embedding,
    LateChunked,
    embedding_rule,
)
from bucketserve.edges.http.bodies import LONG_INPUTS, PROMPT_CUT, LongInputs, PromptCut
from bucketserve.edges.http.codec import Codec, Page, said_ignored
from bucketserve.edges.http.common import (
    engine_of,
    json_response,
    limits_of,
    options_of,
    read_json,
)
from bucketserve.edges.http.schemas import Count, Integer, Lenient, is_integer
from bucketserve.errors import InvalidInput, MalformedRequest

TAG = "OpenAI"

STARTED = int(time.time())  # `created` of every model: when this server loaded it

Ids = Annotated[list[Integer], Field(min_length=1)]


class EmbeddingsBody(Lenient):
    """The request, as OpenAI documents it (strict: no number where a string goes; the fields
    of the servers that copy it that do not apply here are ignored and said)."""

    input: (
        StrictStr
        | Annotated[list[StrictStr], Field(min_length=1)]
        | Ids
        | Annotated[list[Ids], Field(min_length=1)]
    ) = Field(description="a text, texts, one token id list, or token id lists")
    model: StrictStr | None = Field(
        None,
        min_length=1,
        description="a model that embeds (GET /v1/models lists them); default: the default "
        "model, or the one that embeds. A name none answers to goes to the one model that "
        "embeds, as text-embeddings-inference ignores it (said in X-Model-Substituted)",
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float",
        description="base64: the vectors' bytes (little-endian float32, or the model's "
        "answer_type: a byte a number)",
    )
    dimensions: Count | None = Field(
        None,
        description="cut to this width, for a model whose config allows it (0, Infinity's "
        "default: the whole vector)",
    )
    modality: Literal["text"] = Field("text", description="Infinity's: text, the one served")
    user: StrictStr | None = Field(None, description="accepted and ignored")
    prompt_name: StrictStr | None = Field(
        None, description="the model's prompt put before each text (its config's [prompts])"
    )
    truncate: StrictBool = Field(
        True, description="cut a text longer than the model takes (false: refuse it, 422)"
    )
    truncation_direction: Literal["right", "left"] = Field(
        "right", description="where a text is cut: its end (right) or its start (left)"
    )
    truncate_prompt_tokens: PromptCut = PROMPT_CUT
    long_inputs: LongInputs | None = LONG_INPUTS
    late_chunking: StrictBool = Field(
        False,
        description="Jina's: the texts embedded as one sequence, each pooled over its own "
        "tokens (for a model pooled by mean from per-token states)",
    )


class EmbeddingItem(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | list[int] | str = Field(
        description="floats (integers where the model's answer_type says), or base64 of their bytes"
    )


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[EmbeddingItem]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    tasks: list[str] = Field(description="what it serves: predict, embed, rerank, classify...")
    fingerprint: str = Field(description="the digest of what makes its answers")


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


INPUT_FORMS = "a string, a list of strings, a list of token ids, or a list of such lists"


def check_input(given: Any) -> None:
    """`input`'s form, checked by hand before the schema's union sees it: at a cost bounded by
    its size, stopping at the first element out of place. (Refusing a list of 200,000 nulls,
    the union would describe every element against every form: seconds of a core and
    hundreds of MiB.) MalformedRequest names what is wrong, and where."""
    if isinstance(given, str):
        return
    if not isinstance(given, list) or not given:
        raise MalformedRequest(f"input: expected {INPUT_FORMS}", param="input")
    first = given[0]
    if isinstance(first, str):
        kind, fits = "a string", _string
    elif is_integer(first):
        kind, fits = "a token id", is_integer
    elif isinstance(first, list):
        kind, fits = "a non-empty list of token ids", _ids
    else:
        raise MalformedRequest(f"input[0]: expected {INPUT_FORMS}", param="input")
    wrong = next((i for i, item in enumerate(given) if not fits(item)), None)
    if wrong is not None:
        like = f" (as input[0] is {kind})" if wrong else ""
        raise MalformedRequest(f"input[{wrong}]: expected {kind}{like}", param="input")


def _string(value: Any) -> bool:
    return isinstance(value, str)


def _ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(map(is_integer, value))


def read_embeddings(body: Any, wire_bytes: int = 0) -> EmbeddingsBody:
    """The body, every mistake of its form a 400 naming the field (`param`)."""
    if isinstance(body, dict) and "input" in body:
        check_input(body["input"])
    try:
        return EmbeddingsBody.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0])[:32] if first["loc"] else None
        raise MalformedRequest(f"{field or 'body'}: {first['msg']}", param=field) from None


def call_parts(body: EmbeddingsBody, wire_bytes: int, own_ids: bool) -> tuple[Inputs, Head]:
    """The call's inputs and head: each text embedded, or (`late_chunking`) the texts as one
    sequence, each pooled over its own tokens (one row each)."""
    if not body.late_chunking:
        return inputs_of(body, wire_bytes, own_ids), Embed(body.dimensions or None)
    given = [body.input] if isinstance(body.input, str) else body.input
    if not all(isinstance(text, str) for text in given) or body.prompt_name is not None:
        raise InvalidInput(
            "late_chunking takes texts, as sent (no token ids, no prompt_name)",
            param="late_chunking",
        )
    return LateChunks([str(text) for text in given]), LateChunked(body.dimensions or None)


def inputs_of(body: EmbeddingsBody, wire_bytes: int, own_ids: bool) -> Inputs:
    """The body's `input` as the core's inputs: texts (after the prompt named, cut as it
    says), or token id sequences (`own_ids`: whether the server was told a client's ids are
    the model's own, not OpenAI's)."""
    given = body.input
    cut = Truncation(body.truncate, body.truncation_direction == "left")
    if isinstance(given, str):
        return Texts([given], cut, body.prompt_name, long_inputs=body.long_inputs)
    if isinstance(given[0], str):
        return Texts(given, cut, body.prompt_name, long_inputs=body.long_inputs)
    if body.prompt_name is not None:
        raise InvalidInput("prompt_name is put before texts: send texts", param="prompt_name")
    if isinstance(given[0], int):
        return Sequences([given], wire_bytes, own_ids)
    return Sequences(given, wire_bytes, own_ids)


def answered(rows: list[np.ndarray], rule: Embedding, encoding: str) -> list[Any]:
    """The vectors as the model's `answer_type` (Infinity's `--embedding-dtype`) and the
    request's `encoding_format`: numbers, or base64 of their bytes (float32 little-endian, or
    one byte a number, or the packed signs)."""
    typed = quantized(np.stack(rows), rule.answer_type, rule.calibration, param="dimensions")
    if encoding == "base64":
        little = typed.astype("<f4") if typed.dtype == np.float32 else typed
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in little]
    return list(typed)


async def embeddings_read(request: Request) -> EmbeddingsBody:
    body: EmbeddingsBody = await read_json(request, limits_of(request).json(), read_embeddings)
    if body.ignored:
        said_ignored(request, body.ignored)
    return body


def embeddings_call(request: Request, body: EmbeddingsBody) -> Call:
    own_ids = options_of(request).openai_token_ids
    inputs, head = call_parts(body, request.state.body_bytes, own_ids)
    return Call(inputs, body.model, head=head)


def embeddings_json(request: Request, body: EmbeddingsBody, answer: Answer) -> Any:
    rows = [row for out in answer.outputs for row in np.atleast_2d(out[EMBEDDING])]
    vectors = answered(rows, embedding_rule(answer.model), body.encoding_format)
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    tokens = sum(answer.lengths)
    return {
        "object": "list",
        "data": data,
        "model": answer.model.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


EMBEDDINGS = Codec(
    TAG,
    "embeddings",
    EmbeddingsBody,
    embeddings_read,
    embeddings_call,
    embeddings_json,
    answers=EmbeddingsResponse,
    blames="input",  # (a client's error from the engine, unless it names its own field)
)


# the tasks a model is listed here for: every one a retrieval pipeline calls
RETRIEVAL = tuple(t.value for t in Task if t not in (Task.PREDICT, Task.TOKENIZE))


def card(model: Model) -> dict[str, Any]:
    return {
        "id": model.name,
        "object": "model",
        "created": STARTED,
        "owned_by": "bucketserve",
        "tasks": model.info.tasks,
        "fingerprint": model.info.fingerprint,
    }


async def models(request: Request) -> Response:
    served = engine_of(request).registry.models
    listed = [served[n] for n in sorted(served) if set(RETRIEVAL) & set(served[n].info.tasks)]
    return json_response({"object": "list", "data": [card(model) for model in listed]})


async def model(request: Request, name: str) -> Response:
    found = engine_of(request).model(name)
    if not set(RETRIEVAL) & set(found.info.tasks):
        raise not_served(found, f"serves none of {', '.join(RETRIEVAL)}")
    return json_response(card(found))


MODELS = Page(
    TAG,
    models,
    "The models that embed, rerank or classify (their tasks listed)",
    options={"response_model": ModelList},
)
MODEL = Page(
    TAG,
    model,
    "One model that embeds, reranks or classifies",
    (400, 404, 422, 503),
    {"response_model": ModelCard},
)

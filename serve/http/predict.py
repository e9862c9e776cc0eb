"""`POST /predict`: the simple API. Sequences (or texts) in, one output dict per sequence out."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from serve.errors import InvalidInput, MalformedRequest
from serve.http.common import (
    JSON,
    TIMEOUT_PARAMETER,
    engine_of,
    json_response,
    off_loop,
    parse_json,
    read_body,
    request_timeout_ms,
    unless_client_leaves,
)
from serve.http.schemas import errors
from serve.model import Model

router = APIRouter()

FIELDS = {"model", "sequences", "text", "outputs"}
# A hop to a worker thread and back costs what tokenising ~300 characters does (measured:
# 139 us against 0.46 us a character); up to 2,000 characters (under a millisecond of the
# loop) the event loop tokenises a request itself: most requests are a sentence or two.
INLINE_TEXT_CHARS = 2000


class PredictRequest(BaseModel):
    """Documented shape of the body (parsing is done by hand, for speed and exact error codes)."""

    model: str | None = Field(None, description="may be omitted when the repository has a default")
    sequences: list[list[Any]] | None = Field(
        None, description="token id lists, or lists of per-step feature vectors (time first)"
    )
    text: list[str] | None = Field(None, description="for models whose config names a tokenizer")
    outputs: list[str] | None = Field(
        None, description="names of the outputs to return (default: all of the model's outputs)"
    )


class PredictResponse(BaseModel):
    model: str
    outputs: list[dict[str, Any]] = Field(description="one per input sequence, in order")


@dataclass(frozen=True)
class Parsed:
    model: Model
    wanted: list[str]
    sequences: list[np.ndarray] | None  # validated ('sequences')
    texts: list[str] | None  # to tokenise ('text')


def parse_predict(
    raw: bytes, model_of: Callable[[str | None], Model], max_sequences: int
) -> Parsed:
    """The body's model, outputs and items, every mistake named before anything queues."""
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise MalformedRequest("body must be a JSON object")
    unknown = set(body) - FIELDS
    if unknown:
        shown = sorted(str(u)[:64] for u in unknown)[:5]
        raise InvalidInput(f"unknown field(s) {shown}; expected {sorted(FIELDS)}")
    name = body.get("model")
    if name is not None and not isinstance(name, str):
        raise InvalidInput("'model' must be a string")
    model = model_of(name)
    if ("sequences" in body) == ("text" in body):
        raise InvalidInput("send exactly one of 'sequences' or 'text'")
    field = "sequences" if "sequences" in body else "text"
    items = body[field]
    if not isinstance(items, list):
        raise InvalidInput(f"'{field}' must be a list")
    if not items:
        raise InvalidInput(f"'{field}' is empty")
    if len(items) > max_sequences:
        raise InvalidInput(f"too many sequences: {len(items)} > {max_sequences}")
    wanted = _wanted_outputs(body.get("outputs"), model)
    if field == "text":
        if not all(isinstance(t, str) for t in items):
            raise InvalidInput("'text' must be a list of strings")
        return Parsed(model, wanted, None, items)
    return Parsed(model, wanted, [model.validate(item, i) for i, item in enumerate(items)], None)


def encode_texts(model: Model, texts: list[str]) -> list[np.ndarray]:
    """Texts tokenised (each cut by characters first, then by tokens) and validated."""
    return [model.validate(seq, i) for i, seq in enumerate(model.encode(texts))]


async def tokenised(model: Model, texts: list[str]) -> list[np.ndarray]:
    """`encode_texts` on the event loop for a short request, in a worker thread otherwise, so
    that a large one never holds the loop up."""
    if sum(len(t) for t in texts) <= INLINE_TEXT_CHARS:
        return encode_texts(model, texts)
    return await asyncio.to_thread(encode_texts, model, texts)


def _wanted_outputs(names: Any, model: Model) -> list[str]:
    """The outputs to send back: all by default. Asking for fewer saves encoding and bytes
    (a per-token hidden state is hundreds of floats per token)."""
    known = model.info.layout.output_names
    if names is None:
        return known
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise InvalidInput("'outputs' must be a non-empty list of output names")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InvalidInput(f"model {model.name} has no output(s) {unknown}; it has {known}")
    return list(dict.fromkeys(names))


@router.post(
    "/predict",
    response_model=PredictResponse,
    responses=errors(400, 404, 413, 415, 422, 503, 504),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {JSON: {"schema": PredictRequest.model_json_schema()}},
        },
        "parameters": [TIMEOUT_PARAMETER],
    },
    summary="Run a model on variable-length sequences",
)
async def predict(request: Request) -> Response:
    engine = engine_of(request)
    settings = engine.settings
    raw = await read_body(request, settings.max_body_bytes)
    parsed = await off_loop(parse_predict, raw, engine.model, settings.max_sequences)
    sequences = parsed.sequences
    if sequences is None:
        assert parsed.texts is not None
        engine.refuse_now(parsed.model, len(parsed.texts))  # not tokenised only to be refused
        sequences = await tokenised(parsed.model, parsed.texts)
    engine.within_token_budget(sequences)
    deadline = engine.deadline(request_timeout_ms(request))
    model = parsed.model
    outputs = await unless_client_leaves(request, engine.infer(model, sequences, deadline))
    wanted = parsed.wanted
    return json_response(
        {"model": model.name, "outputs": [{n: out[n] for n in wanted} for out in outputs]}
    )

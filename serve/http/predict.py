"""`POST /predict`: the simple API. Sequences (or texts) in, one output dict per sequence out."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from serve.errors import InvalidInput, MalformedRequest
from serve.http.common import (
    engine_of,
    json_response,
    parse_json,
    read_body,
    request_timeout_ms,
    unless_client_leaves,
)
from serve.model import Model

router = APIRouter()

FIELDS = {"model", "sequences", "text", "outputs"}


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


async def parse_items(
    body: Any, model_of: Callable[[str | None], Model], max_sequences: int
) -> tuple[Model, list[np.ndarray], list[str]]:
    """The body's model and its validated sequences; every mistake named, before queueing."""
    if not isinstance(body, dict):
        raise MalformedRequest("body must be a JSON object")
    unknown = set(body) - FIELDS
    if unknown:
        raise InvalidInput(f"unknown field(s) {sorted(unknown)}; expected {sorted(FIELDS)}")
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
        items = await asyncio.to_thread(model.encode, items)  # tokenising off the event loop
    return model, [model.validate(item, i) for i, item in enumerate(items)], wanted


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
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": PredictRequest.model_json_schema()}},
        }
    },
    summary="Run a model on variable-length sequences",
)
async def predict(request: Request) -> Response:
    engine = engine_of(request)
    body = parse_json(await read_body(request, engine.settings.max_body_bytes))
    model, sequences, wanted = await parse_items(body, engine.model, engine.settings.max_sequences)
    deadline = engine.deadline(request_timeout_ms(request))
    outputs = await unless_client_leaves(request, engine.infer(model, sequences, deadline))
    return json_response(
        {"model": model.name, "outputs": [{n: out[n] for n in wanted} for out in outputs]}
    )

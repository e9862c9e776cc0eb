"""`POST /predict`: the simple API. Sequences (or texts) in, one output dict per sequence out
(`PREDICT`: its codec; the table, `routes`, serves it at its path)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from bucketserve.core.calls import Answer, Call, Inputs, Sequences, Texts
from bucketserve.core.model import Truncation
from bucketserve.edges.http.codec import Codec
from bucketserve.edges.http.common import engine_of, limits_of, read_json
from bucketserve.edges.http.schemas import inlined
from bucketserve.edges.limits import Budget
from bucketserve.errors import InvalidInput, MalformedRequest

FIELDS = {"model", "sequences", "text", "outputs", "truncate", "truncation_direction", "priority"}
DIRECTIONS = ("right", "left")


class _PredictBody(BaseModel):
    """The documented shape of a body, in one of two forms (parsing is done by hand, for speed
    and exact error codes; `contract` adds the server's own limits)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description="may be omitted when the repository has a default")
    outputs: list[str] | None = Field(
        None,
        min_length=1,
        description="names of the outputs to return (default: all of the model's outputs)",
    )
    priority: int | None = Field(
        None,
        ge=0,
        description="its priority level: 1 first, up to the server's levels; 0 or none: the "
        "default (X-Priority says the same for any route)",
    )


class SequencesBody(_PredictBody):
    sequences: list[Annotated[list[Any], Field(min_length=1)]] = Field(
        min_length=1,
        description="token id lists, or lists of per-step feature vectors (time first)",
    )


class TextBody(_PredictBody):
    text: list[str] = Field(min_length=1, description="for models whose config names a tokenizer")
    truncate: bool = Field(True, description="cut a text longer than the model takes (else 422)")
    truncation_direction: Literal["right", "left"] = Field(
        "right", description="where a text is cut: its end (right) or its start (left)"
    )


PREDICT_BODY = {"oneOf": [inlined(SequencesBody), inlined(TextBody)]}  # exactly one of the two


class PredictResponse(BaseModel):
    model: str
    outputs: list[dict[str, Any]] = Field(description="one per input sequence, in order")


@dataclass(frozen=True)
class Predict:
    """A /predict body, read."""

    model: str | None
    inputs: Inputs
    outputs: tuple[str, ...] | None
    priority: int | None


def read_predict(body: Any, wire_bytes: int) -> Predict:
    """The body's model, inputs, outputs and priority, every mistake of its form named before
    the core takes it (what the model makes of them, the core decides). `wire_bytes`: the
    body's size (what decoding its inputs will cost)."""
    if not isinstance(body, dict):
        raise MalformedRequest("body must be a JSON object")
    unknown = set(body) - FIELDS
    if unknown:
        shown = sorted(str(u)[:64] for u in unknown)[:5]
        raise InvalidInput(f"unknown field(s) {shown}; expected {sorted(FIELDS)}")
    name = body.get("model")
    if name is not None and not isinstance(name, str):
        raise InvalidInput("'model' must be a string")
    if ("sequences" in body) == ("text" in body):
        raise InvalidInput("send exactly one of 'sequences' or 'text'")
    field = "sequences" if "sequences" in body else "text"
    items = body[field]
    if not isinstance(items, list):
        raise InvalidInput(f"'{field}' must be a list")
    if not items:
        raise InvalidInput(f"'{field}' is empty")
    outputs = body.get("outputs")
    if outputs is not None and (
        not isinstance(outputs, list) or not outputs or not all(isinstance(n, str) for n in outputs)
    ):
        raise InvalidInput("'outputs' must be a non-empty list of output names")
    wanted = None if outputs is None else tuple(outputs)
    priority = body.get("priority")
    if priority is not None and (type(priority) is not int or priority < 0):
        raise InvalidInput("'priority' must be a level: 1 (first), 2, ...; 0 is the default")
    truncate, direction = body.get("truncate", True), body.get("truncation_direction", "right")
    if not isinstance(truncate, bool) or direction not in DIRECTIONS:
        raise InvalidInput("'truncate' is true or false; 'truncation_direction' right or left")
    if field == "text":
        if not all(isinstance(t, str) for t in items):
            raise InvalidInput("'text' must be a list of strings")
        texts = Texts(items, Truncation(truncate, direction == "left"))
        return Predict(name, texts, wanted, priority)
    if {"truncate", "truncation_direction"} & set(body):
        raise InvalidInput("'truncate' and 'truncation_direction' apply to 'text'")
    return Predict(name, Sequences(items, wire_bytes), wanted, priority)


def budget(request: Request) -> Budget:
    """What a /predict body may hold: a step of the widest model's is that many numbers."""
    models = engine_of(request).registry.models.values()
    widest = max((math.prod(m.info.rules.step_shape) for m in models), default=1)
    return limits_of(request).json(widest)


async def predict_read(request: Request) -> Predict:
    """The body, read by hand within what /predict may hold (`budget`)."""
    body: Predict = await read_json(request, budget(request), read_predict)
    return body


def predict_call(request: Request, body: Predict) -> Call:
    return Call(body.inputs, body.model, outputs=body.outputs, priority=body.priority)


def predict_json(request: Request, body: Predict, answer: Answer) -> Any:
    return {"model": answer.model.name, "outputs": answer.outputs}


PREDICT = Codec(
    "bucketserve", "predict", PREDICT_BODY, predict_read, predict_call, predict_json, budget=budget
)

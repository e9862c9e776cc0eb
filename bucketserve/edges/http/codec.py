"""What a module of `apis` hands the table of dialects (`routes`): for each body it takes, a
`Codec` (its body read against its schema, the one `Call` it makes, and the answer's JSON),
and for each page it serves a `Page`. The table runs them (`table.answer`): a codec never
reads a header, resolves what it does not need, or calls the engine.

Also what every codec shares: a body read and validated within the request's limits
(`body_of`), and what an answer says of the request beside its body (the fields ignored, the
model that stood in).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from bucketserve.core.calls import Answer, Call
from bucketserve.edges.http.bodies import TextCut
from bucketserve.edges.http.common import (
    JSON,
    PRIORITY_PARAMETER,
    TIMEOUT_PARAMETER,
    limits_of,
    note,
    read_json,
)
from bucketserve.edges.http.dialects import Dialect, errors
from bucketserve.edges.http.schemas import Lenient, inlined, validate
from bucketserve.edges.limits import Budget
from bucketserve.logs import Throttled

log = logging.getLogger(__name__)
_throttled = Throttled(log)

IGNORED = "X-Ignored-Fields"
SUBSTITUTED = "X-Model-Substituted"
RUN = (400, 404, 413, 415, 422, 503, 504)  # what a route that runs a model may answer
READ = (400, 404, 413, 415, 422, 503)  # what one that only reads a model (its tokenizer) may

B = TypeVar("B")
S = TypeVar("S", bound=BaseModel)
Documented = type[BaseModel] | dict[str, Any]  # a body's schema: its class, or JSON schema


@dataclass(frozen=True)
class Codec(Generic[B]):
    """One body of one vendor's API: `read` it (every mistake of its form named), make it
    the `call` it asks for (the fields a body gives: inputs, model, head, priority, outputs;
    the table adds the request's own), and `answer` it in its JSON."""

    vendor: str  # whose shape it is: its operations' tag in the document
    name: str  # its operation's name (the document's operationId starts with it)
    body: Documented  # what the document says it takes
    read: Callable[[Request], Awaitable[B]]
    call: Callable[[Request, B], Call]
    answer: Callable[[Request, B, Answer], Any]
    statuses: tuple[int, ...] = RUN  # what it may answer (`RUN`, or `READ`)
    about: str | None = None  # its operation's description
    answers: type[BaseModel] | None = None  # the documented answer (a 200's schema)
    budget: Callable[[Request], Budget] | None = None  # its body's (None: `Limits.json`)
    # The field a client's error from the engine that names none is about (`about`)
    blames: str | None = None


@dataclass(frozen=True)
class Page:
    """A GET a vendor's API serves from what the server holds (no call): its endpoint, with
    its documentation (`statuses`: its errors, in its path's form; `options`: FastAPI's)."""

    vendor: str
    endpoint: Callable[..., Awaitable[Response]]
    summary: str
    statuses: tuple[int, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)


def reading(schema: type[S]) -> Callable[[Request], Awaitable[S]]:
    """A codec's `read` of a body validated against `schema` (`body_of`)."""

    async def read(request: Request) -> S:
        body: S = await body_of(request, schema)
        return body

    return read


async def body_of(request: Request, schema: type[BaseModel]) -> Any:
    """The body, read within the request's limits (`common.read_json`) and validated; the
    fields a body in another server's shape ignores are said (`said_ignored`)."""
    limits = limits_of(request)
    body = validate(schema, await read_json(request, limits.json()), "body")
    if isinstance(body, TextCut):
        body = body.with_defaults(limits.auto_truncate)
    if isinstance(body, Lenient) and body.ignored:
        said_ignored(request, body.ignored)
    return body


def said_stand_in(request: Request, answer: Answer) -> None:
    """An answer by a model the call did not name (a name the route's server ignores): said
    in its X-Model-Substituted (the name given, the model that answered)."""
    if answer.stood_in_for is not None:
        given, model = ascii(answer.stood_in_for[:64]), ascii(answer.model.name)
        note(request, SUBSTITUTED, f"{given} -> {model}")


def said_ignored(request: Request, fields: list[str]) -> None:
    """The fields a body sent that the server it stands in for ignores: ignored here too, in
    the answer's X-Ignored-Fields and the log (never silently)."""
    # (ascii: a header holds no newline and no character past latin-1, whatever was sent)
    shown = ", ".join(ascii(f[:32]) for f in fields[:8]) + (", ..." if len(fields) > 8 else "")
    note(request, IGNORED, shown)
    _throttled.log(logging.INFO, "ignored", "%s: ignored fields %s", request.url.path, shown)


R = TypeVar("R", bound=Callable[..., Any])


def post(
    router: APIRouter,
    path: str,
    dialect: Dialect,
    body: Documented,
    summary: str,
    statuses: tuple[int, ...] = RUN,
) -> Callable[[R], R]:
    """`router`'s POST `path` outside the table (the Batch API's), documented: its JSON
    `body`, its statuses in `dialect`'s form, and (for a route that runs a model) the
    request's own deadline header."""
    extra = documented_body(body if isinstance(body, dict) else inlined(body), statuses)
    responses = errors(dialect, *statuses)
    return router.post(path, responses=responses, openapi_extra=extra, summary=summary)


def documented_body(schema: dict[str, Any], statuses: tuple[int, ...]) -> dict[str, Any]:
    """A POST's `openapi_extra`: its JSON body's `schema`, and (for a route that runs a
    model) the request's own deadline and priority headers."""
    extra: dict[str, Any] = {
        "requestBody": {"required": True, "content": {JSON: {"schema": schema}}}
    }
    if 504 in statuses:
        extra["parameters"] = [TIMEOUT_PARAMETER, PRIORITY_PARAMETER]
    return extra

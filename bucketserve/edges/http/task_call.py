"""What every task route shares (`tasks`, `tei_api`, `cohere_api`): its place in the document,
its body read against its schema, and its call through the engine, as every route's (a call
without a model goes to one that serves its head's task: the registry decides).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request

from bucketserve.core.calls import Answer, Inputs
from bucketserve.core.heads import Head
from bucketserve.edges.http.bodies import TextCut
from bucketserve.edges.http.common import (
    JSON,
    PRIORITY_PARAMETER,
    TIMEOUT_PARAMETER,
    answer_of,
    call_of,
    limits_of,
    note,
    read_json,
)
from bucketserve.edges.http.dialects import dialect_of, errors, names_are_hints
from bucketserve.edges.http.schemas import Lenient, Strict, inlined, validate
from bucketserve.logs import Throttled

log = logging.getLogger(__name__)
_throttled = Throttled(log)

IGNORED = "X-Ignored-Fields"
SUBSTITUTED = "X-Model-Substituted"
RUN = (400, 404, 413, 415, 422, 503, 504)  # what a route that runs a model may answer
READ = (400, 404, 413, 415, 422, 503)  # what one that only reads a model (its tokenizer) may


Body = type[Strict | Lenient]
R = TypeVar("R", bound=Callable[..., Any])


def post(
    router: APIRouter,
    path: str,
    body: Body | tuple[Body | dict[str, Any], ...],
    summary: str,
    statuses: tuple[int, ...] = RUN,
) -> Callable[[R], R]:
    """`router`'s POST `path`, documented: its JSON `body` (or any of several bodies, each a
    schema class or a JSON schema), its statuses, and (for a route that runs a model) the
    request's own deadline header."""
    shapes = body if isinstance(body, tuple) else (body,)
    schemas = [s if isinstance(s, dict) else inlined(s) for s in shapes]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    extra: dict[str, Any] = {
        "requestBody": {"required": True, "content": {JSON: {"schema": schema}}}
    }
    if 504 in statuses:
        extra["parameters"] = [TIMEOUT_PARAMETER, PRIORITY_PARAMETER]
    responses = errors(dialect_of(path), *statuses)
    return router.post(path, responses=responses, openapi_extra=extra, summary=summary)


async def run(
    request: Request, inputs: Inputs, name: str | None, head: Head, priority: int | None = None
) -> Answer:
    """The task's call, through the engine like every other route's; `priority`: the body's.
    On a path whose servers ignore model names, an unknown one stands in (`names_are_hints`)."""
    stand_in = names_are_hints(request.url.path)
    call = call_of(request, inputs, name, head=head, priority=priority, stand_in=stand_in)
    answer = await answer_of(request, call)
    said_stand_in(request, answer)
    return answer


def said_stand_in(request: Request, answer: Answer) -> None:
    """An answer by a model the call did not name (a name the route's server ignores): said
    in its X-Model-Substituted (the name given, the model that answered)."""
    if answer.stood_in_for is not None:
        given, model = ascii(answer.stood_in_for[:64]), ascii(answer.model.name)
        note(request, SUBSTITUTED, f"{given} -> {model}")


async def body_of(request: Request, schema: type[Strict | Lenient]) -> Any:
    """The body, read within the request's limits (`common.read_json`) and validated; the
    fields a body in another server's shape ignores are said (`said_ignored`)."""
    limits = limits_of(request)
    body = validate(schema, await read_json(request, limits.json()), "body")
    if isinstance(body, TextCut):
        body = body.with_defaults(limits.auto_truncate)
    if isinstance(body, Lenient) and body.ignored:
        said_ignored(request, body.ignored)
    return body


def said_ignored(request: Request, fields: list[str]) -> None:
    """The fields a body sent that the server it stands in for ignores: ignored here too, in
    the answer's X-Ignored-Fields and the log (never silently)."""
    # (ascii: a header holds no newline and no character past latin-1, whatever was sent)
    shown = ", ".join(ascii(f[:32]) for f in fields[:8]) + (", ..." if len(fields) > 8 else "")
    note(request, IGNORED, shown)
    _throttled.log(logging.INFO, "ignored", "%s: ignored fields %s", request.url.path, shown)

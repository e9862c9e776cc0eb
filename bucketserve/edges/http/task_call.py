"""What every task route shares (`tasks`, `tei_api`, `cohere_api`): its place in the document,
its body read against its schema, and its call through the engine, as every route's (a call
without a model goes to one that serves its head's task: the registry decides).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request

from bucketserve.core.calls import Answer, Inputs
from bucketserve.core.heads import Head
from bucketserve.edges.http.common import (
    JSON,
    PRIORITY_PARAMETER,
    TIMEOUT_PARAMETER,
    call_of,
    engine_of,
    limits_of,
    note,
    read_json,
    unless_client_leaves,
)
from bucketserve.edges.http.dialects import dialect_of, errors
from bucketserve.edges.http.schemas import Lenient, Strict, inlined, validate
from bucketserve.logs import Throttled

log = logging.getLogger(__name__)
_throttled = Throttled(log)

IGNORED = "X-Ignored-Fields"
RUN = (400, 404, 413, 415, 422, 503, 504)  # what a route that runs a model may answer
READ = (400, 404, 413, 415, 422, 503)  # what one that only reads a model (its tokenizer) may


def post(
    router: APIRouter,
    path: str,
    body: type[Strict | Lenient],
    summary: str,
    statuses: tuple[int, ...] = RUN,
) -> Callable[[Any], Any]:
    """`router`'s POST `path`, documented: its JSON `body`, its statuses, and (for a route
    that runs a model) the request's own deadline header."""
    extra: dict[str, Any] = {
        "requestBody": {"required": True, "content": {JSON: {"schema": inlined(body)}}}
    }
    if 504 in statuses:
        extra["parameters"] = [TIMEOUT_PARAMETER, PRIORITY_PARAMETER]
    responses = errors(dialect_of(path), *statuses)
    return router.post(path, responses=responses, openapi_extra=extra, summary=summary)


async def run(
    request: Request, inputs: Inputs, name: str | None, head: Head, priority: int | None = None
) -> Answer:
    """The task's call, through the engine like every other route's; `priority`: the body's."""
    call = call_of(request, inputs, name, head=head, priority=priority)
    return await unless_client_leaves(request, engine_of(request).infer(call))


async def body_of(request: Request, schema: type[Strict | Lenient]) -> Any:
    """The body, read within the request's limits (`common.read_json`) and validated; the
    fields a body in another server's shape ignores are said (`said_ignored`)."""
    body = validate(schema, await read_json(request, limits_of(request).json()), "body")
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

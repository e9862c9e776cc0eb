"""What every route shares: reading a bounded body of an accepted type, JSON in and out, large
bodies decoded off the event loop, the request's own deadline header, its id, its priority
and tenant (`completed`: the call a body asks for, made the request's), disconnects."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import orjson
from fastapi import Request, Response
from starlette.requests import ClientDisconnect

from bucketserve.control import Control
from bucketserve.core.calls import OFF_LOOP_BYTES, Answer, Call
from bucketserve.core.engine import Engine
from bucketserve.edges import headers
from bucketserve.edges.auth import ApiKeys
from bucketserve.edges.http.context import BULK, NOTES
from bucketserve.edges.http.dialects import Form
from bucketserve.edges.limits import Budget, Limits
from bucketserve.edges.options import HttpOptions
from bucketserve.errors import (
    BucketserveError,
    MalformedRequest,
    PayloadTooLarge,
    Unavailable,
    UnsupportedMediaType,
)

T = TypeVar("T")

JSON = "application/json"
BINARY = "application/octet-stream"
# A scope's extension: the error the connection refused a request's body with (`connections`),
# after the application had the request.
REFUSED = "bucketserve.refused"
TIMEOUT_PARAMETER = {
    "name": "X-Request-Timeout-Ms",
    "in": "header",
    "required": False,
    "schema": {"type": "number", "exclusiveMinimum": 0},
    "description": "the request's deadline in ms; it can only shorten the server's",
}
PRIORITY_PARAMETER = {
    "name": "X-Priority",
    "in": "header",
    "required": False,
    "schema": {"type": "integer", "minimum": 0},
    "description": "the request's priority level: 1 first, up to the server's levels; 0 or "
    "none is the server's default (a body's `priority` takes precedence)",
}
LENGTH_PARAMETER = {
    "name": "Inference-Header-Content-Length",
    "in": "header",
    "required": False,
    "schema": {"type": "integer", "minimum": 0},
    "description": "binary tensors (a body that is not application/json): the JSON header's "
    "length, its tensors after it; a body sent as application/json is JSON whole",
}


class ClientGone(Exception):
    """The client closed the connection while its request waited; nothing is sent back."""


def engine_of(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


def options_of(request: Request) -> HttpOptions:
    """What the process told the HTTP edge (`edges.options`)."""
    options: HttpOptions = request.app.state.options
    return options


def limits_of(request: Request) -> Limits:
    return options_of(request).limits


def control_of(request: Request) -> Control:
    control: Control = request.app.state.control
    return control


def note(request: Request, header: str, value: str) -> None:
    """Say `value` in the answer's `header`, whatever the answer (`context` writes it)."""
    notes: dict[str, str] = request.scope.setdefault("state", {}).setdefault(NOTES, {})
    notes[header] = value


def request_id(request: Request) -> str:
    """The request's id: its X-Request-Id, or the one `context` made up."""
    return str(getattr(request.state, "request_id", ""))


def media_type(request: Request) -> str:
    """The body's media type, lower-case and without parameters ("" when none is given)."""
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


async def read_body(request: Request, limit: int, media_types: Sequence[str] = (JSON,)) -> bytes:
    """The whole body, refused with 413 as soon as it passes `limit` bytes, and with 415 when
    it says it is of a type the route does not take (a form or text/plain is what a web page
    can make a browser send to a server on localhost). A client that leaves mid-upload is
    `ClientGone`, not an error."""
    media = media_type(request)
    if media and media not in media_types:
        raise UnsupportedMediaType(f"Content-Type {media[:64]!r}: send {' or '.join(media_types)}")
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise MalformedRequest("Content-Length is not a number")
        if int(declared) > limit:
            raise PayloadTooLarge(f"body of {declared} bytes exceeds the limit of {limit}")
    if request.headers.get("content-encoding", "identity") != "identity":
        raise MalformedRequest("compressed request bodies are not supported")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise PayloadTooLarge(f"body exceeds the limit of {limit} bytes")
    except ClientDisconnect:
        raise ClientGone from None
    return bytes(body)


async def off_loop(decode: Callable[..., T], raw: bytes, *args: Any) -> T:
    """`decode(raw, *args)`: inline for a small body, in a worker thread for a large one."""
    if len(raw) < OFF_LOOP_BYTES:
        return decode(raw, *args)
    return await asyncio.to_thread(decode, raw, *args)


def parse_json(raw: bytes, steps: int = 0, values: int | None = None) -> Any:
    """The body's JSON, its cost bounded by its size. A large one is first counted: at most
    one list per 16 of its bytes, or two per step a request may hold (`steps`: a `[T, 1]`
    feature sequence is a list a step), so that 8 MiB of `[[1]]` (3.4 million lists, 200 MiB
    of objects) is refused before a list is made; and, where the route knows it (`values`),
    at most as many values as a request may hold (what commas separate outside strings), so
    that 8 MiB of floats where token ids go (2 million floats, 100 MiB of objects) is refused
    the same way. Then it is parsed with the garbage collector paused, which millions of small
    lists would set off again and again (0.55 s of 8 MiB of them with it, 0.14 s without) over
    objects that cannot hold a cycle."""
    if not raw:
        raise MalformedRequest("empty body: expected a JSON object")
    try:
        if len(raw) < OFF_LOOP_BYTES:
            return orjson.loads(raw)
        _within_budget(raw, b"[", "lists", max(len(raw) // 16, 2 * steps + 1024))
        if values is not None:
            _within_budget(raw, b",", "values", values + 1024)
        with _collector_paused():
            return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequest(f"body is not valid JSON: {exc}") from None


def _within_budget(raw: bytes, mark: bytes, what: str, most: int) -> None:
    """MalformedRequest if `raw` holds `mark` (an array's opening, a separator) more than
    `most` times outside its strings (inside them it is text: counted only when the quick
    count says it matters)."""
    if raw.count(mark) <= most:
        return
    count = outside_strings(raw, mark)
    if count > most:
        raise MalformedRequest(
            f"the body holds {count} {what}, more than the {most} that any request the "
            "server's limits allow needs"
        )


QUOTE, BACKSLASH = ord('"'), ord("\\")


def outside_strings(raw: bytes, mark: bytes) -> int:
    """How often the byte `mark` occurs in JSON text `raw` outside its strings, counted over
    arrays of the body's size (a few bytes a byte of body, whatever its shape: no object is
    made per string, as a regular expression's match would be)."""
    data = np.frombuffer(raw, np.uint8)
    quotes = data == QUOTE
    if BACKSLASH in data:  # (a quote after an odd run of backslashes is text, not an end)
        quotes[_escaped(data == BACKSLASH)] = False
    inside = np.logical_xor.accumulate(quotes, out=quotes)  # (an opening quote to its closing)
    marks = data == mark[0]
    every = np.count_nonzero(marks)
    return int(every - np.count_nonzero(np.logical_and(marks, inside, out=marks)))


def _escaped(backslash: np.ndarray) -> np.ndarray:
    """The positions that follow a run of an odd number of backslashes."""
    edges = np.flatnonzero(np.diff(backslash.astype(np.int8), prepend=0, append=0))
    starts, ends = edges[::2], edges[1::2]  # (each run: [start, end))
    after: np.ndarray = ends[(ends - starts) % 2 == 1]
    return after[after < len(backslash)]


_pausing = threading.Lock()
_paused = 0  # parses in progress with the collector paused


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while any large body is parsed, in any thread."""
    global _paused
    with _pausing:
        _paused += 1
        gc.disable()
    try:
        yield
    finally:
        with _pausing:
            _paused -= 1
            if not _paused:
                gc.enable()


async def read_json(
    request: Request, budget: Budget, read: Callable[[Any, int], T] = lambda body, _: body
) -> T:
    """The one way a route reads a JSON body: its bytes within the budget's (413 past them),
    parsed within its steps and values (`parse_json`) once a request (a path several
    servers' bodies share reads it to tell them apart, then hands it to the route of its
    shape), then `read(body, its bytes)` (what decoding its inputs will cost); both off the
    loop for a large body."""
    state = request.state
    if not hasattr(state, "body_json"):
        raw = await read_body(request, budget.bytes)
        state.body_bytes = len(raw)
        state.body_json = await off_loop(parse_json, raw, budget.steps, budget.values)
    if state.body_bytes < OFF_LOOP_BYTES:
        return read(state.body_json, state.body_bytes)
    return await asyncio.to_thread(read, state.body_json, state.body_bytes)


def json_response(
    content: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    body = orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(body, status, headers, media_type="application/json")


def error_response(error: BucketserveError, form: Form) -> Response:
    """An error answered in the form of the route it came in on (`routes.form_of`), with
    Retry-After when the client should retry."""
    headers = {"Retry-After": str(error.retry_after_s)} if isinstance(error, Unavailable) else None
    return json_response(form.body(error), error.status, headers)


def request_priority(request: Request, given: int | None = None) -> int | None:
    """The request's priority level: the body's (`given`), else X-Priority's, else None."""
    if given is not None:
        return given
    raw = request.headers.get(headers.PRIORITY)
    if raw is None:
        return None
    return headers.priority_level(raw, "X-Priority")


def bulk_job(request: Request) -> str | None:
    """The tenant of the bulk job the request is a line of (None: a client's request)."""
    tenant: str | None = request.scope.get("extensions", {}).get(BULK)
    return tenant


def request_tenant(request: Request) -> str:
    """The request's tenant, by its key or the header the operator names (`edges.auth`); a
    bulk job's line, its job's."""
    job = bulk_job(request)
    if job is not None:
        return job
    keys: ApiKeys = request.app.state.keys
    named = request.headers.getlist(keys.tenant_header) if keys.tenant_header else []
    return keys.tenant(request.headers.getlist("authorization"), named)


def completed(request: Request, call: Call, stand_in: bool) -> Call:
    """The call a body asks for (`call`: its inputs, model, head, outputs and priority), as
    the route hands it to the engine: with the request's deadline, id, priority (the body's,
    else its header's) and tenant; `stand_in`: whether the route's servers ignore names."""
    priority = request_priority(request, call.priority)
    return dataclasses.replace(
        call,
        timeout_ms=request_timeout_ms(request),
        request_id=request_id(request),
        priority=priority,
        tenant=request_tenant(request),
        bulk=bulk_job(request) is not None,
        stand_in=stand_in,
    )


def request_timeout_ms(request: Request) -> float | None:
    """The request's own deadline, its X-Request-Timeout-Ms (`headers.timeout_ms`)."""
    return headers.timeout_ms(request.headers.get(headers.TIMEOUT))


async def _disconnected(request: Request) -> None:
    # The body has been read, so the next message the server sends is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


FINGERPRINT = "X-Model-Fingerprint"


async def answer_of(request: Request, call: Call) -> Answer:
    """`call` run through the engine, unless the client goes away first; the answer says
    which model version's content answered (`fingerprinted`)."""
    answer = await unless_client_leaves(request, engine_of(request).infer(call))
    fingerprinted(request, answer)
    return answer


def fingerprinted(request: Request, answer: Answer) -> None:
    """The fingerprint of the model version that answered, in X-Model-Fingerprint: a user
    who keeps answers can tell when the content behind a name and version changed."""
    note(request, FINGERPRINT, answer.model.info.fingerprint)


async def unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and what it queued) if the client goes away first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientGone
    return task.result()

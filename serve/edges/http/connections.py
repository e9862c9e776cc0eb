"""Connections: uvicorn's httptools protocol (llhttp, a C parser) with limits on what one client
may hold, and with no connection ever closed under a client that may be sending on it.

- A request's headers must be complete within `header_timeout_s` of its first byte (of the
  connection's opening, for the first request); its body within `body_timeout_s` of its
  headers. Past either, the connection is closed: a slow or silent client holds no slot for
  long, and cannot hold a drain.
- A request's head (request line and headers) may hold at most `MAX_HEAD_BYTES`; one that
  grows past it is answered 431 in the error form, and the connection closed (the parser
  itself buffers a head without limit).
- Between requests a connection stays open for `keep_alive_s` (longer than client pools keep
  theirs idle, so that the client is the one to close).
- At most `max_connections` are open: a request on one more is answered 503 in the error form
  (Retry-After, Connection: close) without reaching the application.
- A request the parser refuses (a non-numeric Content-Length) is answered 400 in the error
  form, not in uvicorn's plain text.
- The drain (`serve.process.server`): an idle connection is not closed when the server stops
  accepting; its next request is answered with Connection: close, and what is still open at
  the drain timeout is closed then.
"""

from __future__ import annotations

import asyncio
import http
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serve.errors import (
    BucketserveError,
    HeadersTooLarge,
    MalformedRequest,
    Unavailable,
    error_form,
)
from serve.logs import Throttled

log = logging.getLogger(__name__)
throttled = Throttled(log)

MAX_HEAD_BYTES = 16 * 1024  # what h11 and Node allow a request's head


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int


async def _over_capacity(scope: Any, receive: Any, send: Any) -> None:
    """The answer on a connection past the cap: 503 in the error form, then closed."""
    body = orjson.dumps(error_form(Unavailable.code, "too many open connections; retry later"))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", b"1"),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _closing_answer(error: BucketserveError) -> bytes:
    """A whole response in the error form, with Connection: close, for a request that never
    reached the application."""
    body = orjson.dumps(error_form(error.code, error.message[:200]))
    head = (
        f"HTTP/1.1 {error.status} {http.HTTPStatus(error.status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


def guarded_protocol(
    limits: Limits, on_closed: Callable[[int], None] | None = None
) -> type[HttpToolsProtocol]:
    """The protocol class to hand uvicorn (`Config(http=...)`). `on_closed(open)` is told how
    many connections are still open each time one closes (the drain waits for none)."""

    class Guarded(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._deadline: asyncio.TimerHandle | None = None
            self._waiting_for: str | None = None  # "headers" or "body"
            # Where the parser is in the request it reads: None between requests.
            self._receiving: str | None = None
            self._head_bytes = 0  # received since the last head completed

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                self.app = _over_capacity  # this connection's request only
                throttled.log(
                    logging.WARNING,
                    "capacity",
                    "%d connections open: one more answered 503",
                    limits.max_connections,
                )
            self._watch()

        def data_received(self, data: bytes) -> None:
            if self._receiving != "body":
                self._head_bytes += len(data)
            super().data_received(data)
            if self.transport.is_closing():
                return
            if self._receiving == "headers" and self._head_bytes > MAX_HEAD_BYTES:
                self._refuse(HeadersTooLarge(f"a request's head may hold {MAX_HEAD_BYTES} bytes"))
                return
            self._watch()

        # (the parser's callbacks, in the order it makes them for one request)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._receiving = "headers"

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._receiving, self._head_bytes = "body", 0

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._receiving = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._watch()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop()
            super().connection_lost(exc)
            if on_closed is not None:
                on_closed(len(self.connections))

        def send_400_response(self, msg: str) -> None:
            """A request the parser refuses, answered in the error form."""
            self._refuse(MalformedRequest(msg))

        def _refuse(self, error: BucketserveError) -> None:
            self._stop()
            self.transport.write(_closing_answer(error))
            self.transport.close()

        # -- deadlines ------------------------------------------------------------------------

        def _watch(self) -> None:
            """Arm the deadline that fits where the request is: its headers (its first byte
            in, or none yet and no keep-alive wait running), its body, or none (it is in, or
            being answered)."""
            answering = self.cycle is not None and not self.cycle.response_complete
            if self._receiving == "body":
                self._arm("body", limits.body_timeout_s)
            elif self._receiving == "headers" or (
                not answering and self.timeout_keep_alive_task is None
            ):
                self._arm("headers", limits.header_timeout_s)
            else:
                self._stop()

        def _arm(self, waiting_for: str, seconds: float) -> None:
            if self._waiting_for == waiting_for:
                return  # the deadline counts from when this wait began
            self._stop()
            self._waiting_for = waiting_for
            self._deadline = self.loop.call_later(seconds, self._expired)

        def _stop(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline, self._waiting_for = None, None

        def _expired(self) -> None:
            what = self._waiting_for
            self._deadline = self._waiting_for = None
            if self.transport.is_closing():
                return
            throttled.log(
                logging.INFO, f"slow-{what}", "closed a connection: its %s were late", what
            )
            self.transport.close()  # the application, if it waits on the body, sees a disconnect

    return Guarded

"""Connections: uvicorn's httptools protocol (llhttp, a C parser) held to HTTP/1.1 as its RFCs
say (9110, 9112), with limits on what one client may hold, and no connection ever closed
under a client that may still be sending on it.

- A request's headers must be complete within `header_timeout_s` of its first byte (of the
  connection's opening, for the first request); its body within `body_timeout_s` of its
  headers. Past either, the connection is closed: a slow or silent client holds no slot for
  long, and cannot hold a drain.
- A request line longer than `MAX_URL_BYTES` is answered 414, a head (request line and
  headers) past `MAX_HEAD_BYTES` 431, however the bytes were split into reads (the parser
  itself buffers a head without limit).
- A request without exactly one valid `Host` is answered 400 (an HTTP/1.0 one may have none).
- An `Upgrade` (`h2c`, which Java's HTTP client sends by default; `websocket`) is ignored, as
  RFC 9110 lets a server: the request is served as HTTP/1.1, its body and the requests behind
  it included. (llhttp stops at an upgrade; the rest is fed to a fresh parser.)
- Pipelined requests are answered in order. A request the parser refuses is answered 400 in
  the error form only after the answers owed to the requests before it, then the connection
  is closed. That holds for a body that breaks its framing too (a malformed chunk, a trailer
  that is not a field line or that frames, a body cut short by the client's half-close): the
  application, which has that request already, is told the client left (`REFUSED` in the
  request's scope says why, so that it is counted as the 400 it was answered).
- A client that half-closes (shuts its sending side after a request, as `nc -N` and some
  proxies do) is answered what it is owed; then the connection is closed.
- Every refusal is a lingering close, as nginx makes it: the answer, then the connection's
  sending side shut, then what the client still sends read and dropped until it closes (or
  `LINGER_S` passes), so that the client reads its answer instead of a reset. The same holds
  when a route answers before reading a body it refuses (a 413) on a connection that closes.
- Between requests a connection stays open for `keep_alive_s` (longer than client pools keep
  theirs idle, so that the client is the one to close).
- At most `max_connections` are open: a request on one more is answered 503 in the error form
  (Retry-After, Connection: close) without reaching the application.
- The drain (`bucketserve.process.server`): an idle connection is not closed when the server stops
  accepting; its next request is answered with Connection: close, and what is still open at
  the drain timeout is closed then.
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from bucketserve.edges.http.common import REFUSED
from bucketserve.edges.http.routes import error_body
from bucketserve.errors import (
    BucketserveError,
    HeadersTooLarge,
    MalformedRequest,
    Unavailable,
    UriTooLong,
)
from bucketserve.logs import Throttled

log = logging.getLogger(__name__)
throttled = Throttled(log)

MAX_URL_BYTES = 8 * 1024  # nginx's default for a request line
MAX_HEAD_BYTES = 16 * 1024  # what h11 and Node allow a request's head
LINGER_S = 5.0  # the longest a refused client is read from after its answer
# RFC 9112 3.2: uri-host [ ":" port ], the host a reg-name, an IPv4 address or an IP literal.
HOST = re.compile(rb"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~%!$&'()*+,;=]*)(?::[0-9]*)?$")


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int


class _Refused(Exception):
    """Raised from a parser callback to stop the parser where a request is refused."""


async def _over_capacity(scope: Any, receive: Any, send: Any) -> None:
    """The answer on a connection past the cap: 503 in its route's error form, then closed."""
    refused = Unavailable("too many open connections; retry later")
    body = orjson.dumps(error_body(refused, scope["path"]))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", b"1"),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _head_too_large() -> HeadersTooLarge:
    return HeadersTooLarge(f"a request's head may hold {MAX_HEAD_BYTES} bytes")


def _closing_answer(error: BucketserveError, target: bytes) -> bytes:
    """A whole response in the error form of the route `target` names (as far as it was read:
    none, for a request line that did not parse), with Connection: close, for a request that
    never reached the application."""
    path = target.split(b"?", 1)[0].decode("latin-1")
    body = orjson.dumps(error_body(error, path))
    head = (
        f"HTTP/1.1 {error.status} {http.HTTPStatus(error.status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


class _LingeringTransport:
    """The connection's transport as uvicorn sees it: closing it while the client may still
    be sending (a body not yet read) lingers instead (`Guarded._linger`)."""

    def __init__(self, transport: asyncio.Transport, protocol: Any) -> None:
        self._transport = transport
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        if self._protocol.client_may_send():
            self._protocol.linger()
        else:
            self._transport.close()

    def is_closing(self) -> bool:
        return bool(self._protocol.lingering or self._transport.is_closing())


class Guarded(HttpToolsProtocol):
    """uvicorn's httptools protocol, guarded as the module says; the limits (and whom to tell
    when a connection closes) are the class's, set by `guarded_protocol`."""

    limits: Limits
    on_closed: Callable[[int], None] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: str | None = None  # "headers" or "body"
        # Where the parser is in the request it reads: None between requests.
        self._receiving: str | None = None
        self._head_bytes = 0  # read since the last head completed
        self._parsed_head = 0  # of this request's head, what the parser has handed over
        self._refusal: BucketserveError | None = None  # answered once the others are
        self._upgrade_framing: bytes | None = None  # an ignored upgrade's body framing
        self._muted = False  # while that framing is replayed to a fresh parser
        self.lingering = False
        self._linger_timer: asyncio.TimerHandle | None = None
        self._answering: Any = None  # the request cycle the application runs
        self._client_done = False  # the client has shut its sending side

    # -- the connection ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_LingeringTransport(transport, self))  # type: ignore[arg-type]
        self._raw = transport
        if len(self.connections) > self.limits.max_connections:
            self.app = _over_capacity  # this connection's request only
            throttled.log(
                logging.WARNING,
                "capacity",
                "%d connections open: one more answered 503",
                self.limits.max_connections,
            )
        self._watch()

    def data_received(self, data: bytes) -> None:
        if self.lingering or self._refusal is not None:
            return  # what a refused client still sends, dropped
        self._unset_keepalive_if_required()
        if self._receiving != "body":
            self._head_bytes += len(data)
        try:
            self._feed(data)
        except httptools.HttpParserError as exc:
            said = "" if isinstance(exc, httptools.HttpParserCallbackError) else f" ({exc})"
            why = self._refusal or MalformedRequest(f"not a valid HTTP/1.1 request{said}")
            self._refuse(why)
            return
        if self._receiving == "headers" and self._head_bytes > MAX_HEAD_BYTES:  # not ended yet
            self._refuse(_head_too_large())
            return
        self._watch()

    def _feed(self, data: bytes) -> None:
        """The parser fed `data`; past an upgrade, a fresh parser the rest."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self.parser = self._fresh_parser()
            framing, self._upgrade_framing = self._upgrade_framing, None
            if framing is not None:  # the fresh parser reads the body as the body
                self._muted = True
                self.parser.feed_data(b"POST / HTTP/1.1\r\n" + framing + b"\r\n")
                self._muted = False
            self._feed(data[upgrade.args[0] :])

    def _fresh_parser(self) -> httptools.HttpRequestParser:
        parser = httptools.HttpRequestParser(self)
        parser.set_dangerous_leniencies(lenient_data_after_close=True)  # (as uvicorn's)
        return parser

    def eof_received(self) -> bool | None:  # type: ignore[override]
        """The client shut its sending side: it is answered what it is owed (a request
        it cut short is refused), then the connection closes. True keeps it open."""
        self._client_done = True
        if self.lingering:  # the client has read its answer and closed: so may we
            self._raw.close()
            return None
        if self._refusal is None and self._receiving is not None:
            cut_short = f"the client closed its sending side within a request's {self._receiving}"
            self._refuse(MalformedRequest(cut_short))
        elif self._refusal is None and not self._owes_answers():
            return None  # idle: closed now
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)
        if self.on_closed is not None:
            self.on_closed(len(self.connections))

    # -- the parser's callbacks, in the order it makes them for one request -------------

    def on_message_begin(self) -> None:
        if self._muted:
            return
        super().on_message_begin()
        self._receiving, self._parsed_head = "headers", 0

    def on_url(self, url: bytes) -> None:
        if self._muted:
            return
        super().on_url(url)
        self._parsed_head += len(url)
        if self._parsed_head > MAX_URL_BYTES:
            self._stop_parsing(UriTooLong(f"a request line may hold {MAX_URL_BYTES} bytes"))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._muted:
            return
        super().on_header(name, value)
        self._parsed_head += len(name) + len(value) + 4
        if self._parsed_head > MAX_HEAD_BYTES:
            self._stop_parsing(_head_too_large())

    def on_headers_complete(self) -> None:
        if self._muted:
            return
        hosts = [value for name, value in self.headers if name == b"host"]
        needed = self.parser.get_http_version() != "1.0"
        if len(hosts) > 1 or (needed and not hosts) or (hosts and not HOST.match(hosts[0])):
            self._stop_parsing(MalformedRequest("a request needs exactly one valid Host"))
        if self.parser.should_upgrade():  # ignored: the body (if any) comes after it
            self._upgrade_framing = self._framing()
        super().on_headers_complete()
        self._receiving, self._head_bytes = "body", 0

    def on_message_complete(self) -> None:
        if self._muted or self._upgrade_framing is not None:
            return  # (an ignored upgrade: the parser skipped a body that is still to come)
        super().on_message_complete()
        self._receiving = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._owes_answers():
            self._watch()
        elif self._refusal is not None:
            self._answer_refusal()
        elif self._client_done:  # (a half-closed client had one more answer coming)
            self._raw.close()
        else:
            self._watch()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._answering = cycle
        super()._start_asgi_task(cycle, app)

    def _framing(self) -> bytes | None:
        """How the body of the request whose head was just read is delimited, as header
        lines; None when it has none."""
        headers = dict(self.headers)
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            return b"transfer-encoding: chunked\r\n"
        length = headers.get(b"content-length", b"0").strip()
        return None if length in (b"", b"0") else b"content-length: " + length + b"\r\n"

    # -- refusals -------------------------------------------------------------------------

    def _stop_parsing(self, error: BucketserveError) -> None:
        self._refusal = error
        raise _Refused  # (the parser stops; `data_received` answers)

    def _refuse(self, error: BucketserveError) -> None:
        """Answer `error` once every request before it is answered, then close."""
        self._refusal = error
        self._stop()
        self.flow.pause_reading()
        if self._receiving == "body":  # the application has this request: it is withdrawn
            self._withdraw(self.cycle, error)
        if not self._owes_answers():
            self._answer_refusal()

    def _withdraw(self, cycle: Any, error: BucketserveError) -> None:
        """Take a request whose body was refused from the application: never started if
        it waits behind others; else told its client left, and why."""
        self.pipeline = type(self.pipeline)(p for p in self.pipeline if p[0] is not cycle)
        cycle.scope.setdefault("extensions", {})[REFUSED] = error
        cycle.disconnected = True
        cycle.message_event.set()

    def _owes_answers(self) -> bool:
        cycle = self._answering
        answering = cycle is not None and not (cycle.response_complete or cycle.disconnected)
        return answering or bool(self.pipeline)

    def _answer_refusal(self) -> None:
        assert self._refusal is not None
        if self._raw.is_closing():
            return
        self.transport.write(_closing_answer(self._refusal, getattr(self, "url", b"")))
        self.linger()

    def client_may_send(self) -> bool:
        """Whether the client may still be sending: a refused request, or a body not read
        to its end."""
        return self._refusal is not None or self._receiving is not None

    def linger(self) -> None:
        """Shut the sending side after what is written, and drop what the client still
        sends until it closes, or until `LINGER_S` passes."""
        if self.lingering or self._raw.is_closing():
            return
        self.lingering = True
        self._stop()
        self._unset_keepalive_if_required()
        if self._client_done:  # it sends nothing more: closed once the answer is out
            self._raw.close()
            return
        if self._raw.can_write_eof():
            self._raw.write_eof()
        self.flow.resume_reading()
        self._linger_timer = self.loop.call_later(LINGER_S, self._raw.close)

    # -- deadlines ------------------------------------------------------------------------

    def _watch(self) -> None:
        """Arm the deadline that fits where the request is: its headers (its first byte
        in, or none yet and no keep-alive wait running), its body, or none (it is in, or
        being answered)."""
        if self.lingering or self._refusal is not None:
            return
        answering = self.cycle is not None and not self.cycle.response_complete
        if self._receiving == "body":
            self._arm("body", self.limits.body_timeout_s)
        elif self._receiving == "headers" or (
            not answering and self.timeout_keep_alive_task is None
        ):
            self._arm("headers", self.limits.header_timeout_s)
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
        if self._raw.is_closing():
            return
        throttled.log(logging.INFO, f"slow-{what}", "closed a connection: its %s were late", what)
        self._raw.close()  # the application, if it waits on the body, sees a disconnect


def guarded_protocol(
    limits: Limits, on_closed: Callable[[int], None] | None = None
) -> type[HttpToolsProtocol]:
    """The protocol class to hand uvicorn (`Config(http=...)`): `Guarded` with these limits.
    `on_closed(open)` is told how many connections are still open each time one closes (the
    drain waits for none)."""
    attributes = {
        "limits": limits,
        "on_closed": None if on_closed is None else staticmethod(on_closed),
    }
    return type("Guarded", (Guarded,), attributes)

"""Per-request context as plain ASGI middleware: X-Request-Id, the headers a route noted for its
answer (`common.note`), the request metrics, the
request's span (continuing a `traceparent` header, when tracing is on), and
`Connection: close` on every response once the server drains (so that a client leaves between
requests, and no connection is closed under it).

Plain ASGI (not BaseHTTPMiddleware) so that `receive` reaches the routes untouched: they
watch it for the client's disconnect.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bucketserve.edges.headers import REQUEST_ID
from bucketserve.edges.headers import request_id as new_request_id
from bucketserve.metrics import Metrics
from bucketserve.tracing import Tracing

# A request state's key: the headers a route noted for its answer (`common.note`).
NOTES = "notes"
# A scope's extension: the tenant of the bulk job a request is a line of (`jobs`). Set only by
# the job's dispatch, in process: nothing a client sends can set it.
BULK = "bucketserve.bulk"


class RequestContext:
    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        draining: Callable[[], bool],
        tracing: Tracing,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.draining = draining
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(REQUEST_ID.encode(), b"").decode("latin-1")
        request_id = new_request_id(given)
        scope.setdefault("state", {})["request_id"] = request_id
        start = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = MutableHeaders(scope=message)
                headers[REQUEST_ID] = request_id
                for header, value in scope["state"].get(NOTES, {}).items():
                    headers[header] = value
                if self.draining():
                    headers["connection"] = "close"
            await send(message)

        method, tracing = scope["method"], self.tracing
        carrier = _headers(scope) if tracing.enabled else {}  # (off: nothing decoded for it)
        with tracing.request(f"{method} {scope['path']}", carrier) as span:
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                route = scope.get("route")
                path = getattr(route, "path", "unmatched")
                self.metrics.request_done(path, status, time.perf_counter() - start)
                span.rename(f"{method} {path}")  # (the route's template: few names)
                span.set("http.response.status_code", status)
                span.set("bucketserve.request_id", request_id)


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}

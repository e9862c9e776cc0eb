"""The API key over HTTP, as plain ASGI middleware (`bucketserve.edges.auth` says which routes are
open and how a key is compared): a request without a valid key is answered 401 in its route's
error form (OpenAI's on /v1), with `WWW-Authenticate: Bearer`, before any route reads it."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from bucketserve.edges.auth import ApiKeys
from bucketserve.edges.failures import Failures
from bucketserve.edges.http.common import json_response
from bucketserve.edges.http.routes import error_body
from bucketserve.errors import Unauthorized


class RequireKey:
    def __init__(self, app: ASGIApp, keys: ApiKeys, failures: Failures) -> None:
        self.app = app
        self.keys = keys
        self.failures = failures

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.keys.open_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        given = [v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"]
        try:
            self.keys.check(given)
        except Unauthorized as refused:
            self.failures.settle(refused, f"{scope['method']} {scope['path']}")
            body = error_body(refused, scope["path"])
            response = json_response(body, refused.status, {"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

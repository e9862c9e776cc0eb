"""A bulk job's line sent to its route in process (`jobs.runner.Dispatch`): the route's own
function, given the line's body as a request of the application's, with the job's tenant in
the request's scope (`context.BULK`), so that the line is read, run and answered exactly as a
client's request to that route is; an error answered as the application answers it
(`error_response`, the failure counted and logged by the same rule).

What is left out is what a connection needs and a line does not: the framework's routing and
middleware (request metrics, which count clients' requests; the API key, which the job's
owner gave when creating it). On a saturated CPU every line pays for that plumbing in the
model's time: a batch of minilm sentences ran 371/s through it, 392/s without (BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import Request, Response
from starlette.types import ASGIApp, Message

from bucketserve.edges.http.common import FINGERPRINT, error_response
from bucketserve.edges.http.context import BULK, NOTES
from bucketserve.edges.http.routes import form_of
from bucketserve.errors import BucketserveError
from bucketserve.jobs.runner import Reply

Endpoint = Callable[[Request], Awaitable[Response]]
Settle = Callable[[BaseException, str], BucketserveError]  # (`Failures.settle`)


class InProcess:
    def __init__(self, app: ASGIApp, endpoints: Mapping[str, Endpoint], settle: Settle) -> None:
        self.app, self.endpoints, self.settle = app, endpoints, settle

    async def __call__(self, path: str, body: bytes, tenant: str, request_id: str) -> Reply:
        """POST `body` (JSON) to the route at `path`, as the request `request_id`: its
        status, body and X-Model-Fingerprint."""
        state: dict[str, Any] = {"request_id": request_id}  # (the route's notes land here)
        scope = {
            "type": "http",
            "app": self.app,
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [
                (b"host", b"bulk"),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
            "client": None,
            "server": None,
            "extensions": {BULK: tenant},
            "state": state,
        }
        given = False

        async def receive() -> Message:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Future()  # (a line's client never leaves)
            raise AssertionError

        try:
            response = await self.endpoints[path](Request(scope, receive))
        except Exception as exc:  # (answered as the application answers it)
            response = error_response(self.settle(exc, f"POST {path}"), form_of(path))
        fingerprint = state.get(NOTES, {}).get(FINGERPRINT)
        return Reply(response.status_code, bytes(response.body), fingerprint)

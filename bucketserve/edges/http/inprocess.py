"""Bulk requests sent to their routes in process (`jobs.sender.Dispatch`), made by the process
(`process.wiring`) and handed to the jobs, `batch run` and Ray Data: the route's own function
from the table of dialects (the routes a batch may run: `routes.ENDPOINTS`), given the body
as a request over the parts the process built (the engine, HTTP's options, the keys), with
the job's tenant in the request's scope (`context.BULK`), so that it is read, run and
answered exactly as a client's request to that route is; an error answered as the
application answers it (`error_response` in the path's form, the failure counted and logged
by the same rule). No application is built for it.

What is left out is what a connection needs and a bulk request does not: the framework's
routing and middleware (request metrics, which count clients' requests; the API key, which
the job's owner gave when creating it). On a saturated CPU every line pays for that plumbing
in the model's time: a batch of minilm sentences ran 371/s through it, 392/s without
(BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import Request
from starlette.datastructures import State
from starlette.types import Message

from bucketserve.core.engine import Engine
from bucketserve.edges.auth import ApiKeys
from bucketserve.edges.http.common import FINGERPRINT, error_response
from bucketserve.edges.http.context import BULK, NOTES
from bucketserve.edges.http.routes import ROWS, form_of
from bucketserve.edges.http.table import batchable, endpoint_of
from bucketserve.edges.options import HttpOptions
from bucketserve.errors import BucketserveError
from bucketserve.jobs.sender import Reply

Settle = Callable[[BaseException, str], BucketserveError]  # (`Failures.settle`)


class Parts:
    """What a route reads of the application it is served by (`common.engine_of`,
    `options_of`, the keys), without an application."""

    def __init__(self, engine: Engine, options: HttpOptions, keys: ApiKeys) -> None:
        self.state = State({"engine": engine, "options": options, "keys": keys})


class InProcess:
    def __init__(self, engine: Engine, options: HttpOptions, keys: ApiKeys, settle: Settle) -> None:
        self.parts, self.settle = Parts(engine, options, keys), settle
        self.endpoints = {path.path: endpoint_of(path) for path in batchable(ROWS)}

    @property
    def paths(self) -> tuple[str, ...]:
        """The routes a batch may run, in the order the Batch API lists them."""
        return tuple(self.endpoints)

    async def __call__(self, path: str, body: bytes, tenant: str, request_id: str) -> Reply:
        """POST `body` (JSON) to the route at `path`, as the request `request_id`: its
        status, body and X-Model-Fingerprint."""
        state: dict[str, Any] = {"request_id": request_id}  # (the route's notes land here)
        scope = {
            "type": "http",
            "app": self.parts,
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

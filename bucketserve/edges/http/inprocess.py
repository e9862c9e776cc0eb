"""A request sent to the application in process, as a bulk job's line (`jobs.runner.Dispatch`):
the same ASGI call a connection makes, with the job's tenant in the scope (`context.BULK`),
so that the line runs through the route a client's request runs through, at the bulk level.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message

from bucketserve.edges.http.context import BULK, REQUEST_ID


class InProcess:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, path: str, body: bytes, tenant: str) -> tuple[int, str, bytes]:
        """POST `body` (JSON) to `path`: the answer's status, request id and body."""
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
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
        }
        given = False
        status, request_id, chunks = 500, "", []

        async def receive() -> Message:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Future()  # (the line's client never leaves)
            raise AssertionError

        async def send(message: Message) -> None:
            nonlocal status, request_id
            if message["type"] == "http.response.start":
                status = message["status"]
                for name, value in message.get("headers", []):
                    if name == REQUEST_ID.encode():
                        request_id = value.decode("latin-1")
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, send)
        return status, request_id, b"".join(chunks)

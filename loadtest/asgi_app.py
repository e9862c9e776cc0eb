"""The bucketserve application for an ASGI server other than its own (`uvicorn
loadtest.asgi_app:app`, `granian --interface asgi loadtest.asgi_app:app`): the process's parts
wired from the environment's settings (`BUCKETSERVE_MODELS`, ...), the engine run by the
lifespan. For comparing connection layers (`loadtest.framing`); the server itself never runs
this way (its own process owns the signals and the drain).
"""

from __future__ import annotations

import contextlib
from typing import Any

from bucketserve.edges.http.app import create_app
from bucketserve.process.wiring import running, wire
from bucketserve.settings import Settings

wired = wire(Settings.from_env())
served = create_app(wired.engine, wired.control, wired.metrics, wired.keys, wired.http, wired.jobs)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "lifespan":
        await served(scope, receive, send)
        return
    async with contextlib.AsyncExitStack() as stack:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                context = running(wired.engine, wired.control, wired.metrics, wired.jobs)
                await stack.enter_async_context(context)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await stack.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

"""The server process: uvicorn running the app, with SIGTERM meaning a graceful drain.

On SIGTERM readiness turns false at once, new requests get 503, everything already admitted
is answered, then the process exits 0. A second signal (or Ctrl-C) exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType

import uvicorn

from serve import logs
from serve.app import create_app
from serve.engine import Engine
from serve.loading import load_engine
from serve.settings import Settings

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self.engine = engine
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)  # type: ignore[arg-type]

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        loop = self._loop
        if sig != signal.SIGTERM or self.engine.draining or loop is None:
            super().handle_exit(sig, frame)
            return
        log.info("SIGTERM: not ready any more; finishing admitted requests")
        loop.call_soon_threadsafe(lambda: loop.create_task(self._drain()))

    async def _drain(self) -> None:
        await self.engine.drain()  # logs "drained: ..." once
        self.should_exit = True


def run(settings: Settings) -> int:
    logs.configure(settings.log_level, settings.log_json)
    engine = load_engine(settings)
    config = uvicorn.Config(
        create_app(settings, engine),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=max(1, round(settings.drain_timeout_s)),
    )
    log.info("serving %s on http://%s:%d", ", ".join(engine.models), settings.host, settings.port)
    DrainingServer(config, engine).run()
    return 0

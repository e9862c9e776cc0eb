"""The server process: the engine and the metrics, the HTTP app over guarded connections
(uvicorn) and, when asked for, gRPC beside it, both serving the engine as peers; and a drain on
SIGTERM that never resets a connection under a client.

SIGTERM: readiness turns false and the listener closes (a new connect is refused); every
response from then on says `Connection: close`, so a client learns to leave between requests;
everything admitted is answered (new work gets 503); connections still open, idle, wait until
their client sends (and is told to close) or until the drain timeout. Then the process exits
0. A second SIGTERM (or Ctrl-C) ends the drain at once, and still exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Sequence
from types import FrameType
from typing import Protocol

import uvicorn

from bucketserve import logs
from bucketserve.core.engine import Engine
from bucketserve.edges.http.app import create_app
from bucketserve.edges.http.connections import Limits, guarded_protocol
from bucketserve.errors import ConfigError
from bucketserve.loading import load_engine
from bucketserve.metrics import Metrics
from bucketserve.settings import Settings

log = logging.getLogger(__name__)


class Companion(Protocol):
    """A listener beside HTTP on the same engine and loop (gRPC): started once the app is up,
    drained after the engine (its clients told to leave, until the loop's time `until`)."""

    async def start(self) -> None: ...

    async def drain(self, until: float) -> None: ...

    async def stop(self, grace_s: float | None) -> None: ...


class DrainingServer(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        engine: Engine,
        metrics: Metrics,
        drain_timeout_s: float,
        companions: Sequence[Companion] = (),
    ) -> None:
        super().__init__(config)
        self.engine = engine
        self.metrics = metrics
        self.drain_timeout_s = drain_timeout_s
        self.companions = list(companions)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = asyncio.Event()  # every connection closed (set from the protocol)
        self._draining = False

    async def serve(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        async with self.engine.running(self.metrics):  # HTTP and gRPC serve it as peers
            await super().serve(sockets)  # type: ignore[arg-type]

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:
            for companion in self.companions:
                await companion.start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for companion in self.companions:
            await companion.stop(0)  # (after a drain: stopped already)
        await super().shutdown(sockets)

    def connection_closed(self, still_open: int) -> None:
        if self._draining and still_open == 0:
            self._closed.set()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # (Not super().handle_exit: uvicorn re-raises every signal it captured when it stops,
        # so the process would die of the SIGTERM it just drained for.)
        loop = self._loop
        if loop is None:
            self.should_exit = True
            return
        if self._draining or sig != signal.SIGTERM:  # a second signal: stop now, cleanly
            log.info("stopping now: the drain is cut short")
            self.force_exit = self.should_exit = True
            return
        self._draining = True
        log.info("SIGTERM: not ready any more; finishing admitted requests")
        loop.call_soon_threadsafe(lambda: loop.create_task(self._drain()))

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout_s
        for server in self.servers:
            server.close()  # a new connect is refused, never accepted and then dropped
        # New work is refused (HTTP 503, gRPC UNAVAILABLE: the engine is draining) and what
        # was admitted is answered; then gRPC, like HTTP below, waits for its clients to leave.
        await self.engine.drain()
        await asyncio.gather(*(c.drain(deadline) for c in self.companions))
        if self.server_state.connections:
            remaining = max(0.0, deadline - loop.time())
            try:  # idle keep-alive connections: their clients leave, or the timeout comes
                await asyncio.wait_for(self._closed.wait(), remaining)
            except TimeoutError:
                log.info(
                    "drain timeout: closing %d idle connections", len(self.server_state.connections)
                )
        self.config.timeout_graceful_shutdown = 1  # what is left is closed now
        self.should_exit = True


def run(settings: Settings) -> int:
    logs.configure(settings.log_level, settings.log_json)
    engine = load_engine(settings)
    metrics = Metrics()
    limits = Limits(settings.header_timeout_s, settings.body_timeout_s, settings.max_connections)
    app = create_app(settings, engine, metrics)
    companions: list[Companion] = []
    if settings.grpc_port is not None:
        try:
            from bucketserve.edges.grpc import GrpcServer
        except ImportError as exc:
            raise ConfigError(f"--grpc-port needs the grpc extra ({exc})") from None
        companions.append(GrpcServer(engine, metrics, settings))
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_keep_alive=settings.keep_alive_s,
        ws="none",  # no upgrade is honoured: a request that asks for one is served as HTTP/1.1
    )
    server = DrainingServer(config, engine, metrics, settings.drain_timeout_s, companions)
    config.http = guarded_protocol(limits, server.connection_closed)
    log.info("serving %s on http://%s:%d", ", ".join(engine.models), settings.host, settings.port)
    server.run()
    return 0

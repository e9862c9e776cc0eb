"""The server process: the parts wired once (`wiring`), then HTTP (uvicorn over guarded
connections) and, when asked for, gRPC started on them as equals, and a drain on SIGTERM that
never resets a connection under a client. The process owns the signals; neither protocol
installs its own. Imports the wiring and both protocols' edges.

SIGTERM: every listener stops accepting (HTTP's socket closes: a new connect is refused); the
engine drains: readiness turns false, new work is refused (HTTP 503, gRPC UNAVAILABLE), model
control refuses loads and its poller stops, and everything admitted is answered. Then each
listener lets its clients leave: HTTP says `Connection: close` on every response and waits for
idle connections until their client sends (and is told to close) or the drain timeout; gRPC
answers UNAVAILABLE until its clients go quiet. Then the process exits 0. A second SIGTERM
(or Ctrl-C) ends the drain at once, and still exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
from collections.abc import Iterator, Sequence
from typing import Protocol

import uvicorn

from bucketserve import logs
from bucketserve.edges.http.app import create_app
from bucketserve.edges.http.connections import Limits, guarded_protocol
from bucketserve.errors import ConfigError
from bucketserve.process.wiring import Wired, running, wire
from bucketserve.settings import Settings

log = logging.getLogger(__name__)


class Listener(Protocol):
    """One protocol's port on the process's parts (HTTP, gRPC)."""

    async def start(self) -> None:
        """Listening, or an error saying why not."""

    def stop_accepting(self) -> None:
        """The drain began: a new connection is refused where the protocol allows it."""

    async def drain(self, until: float) -> None:
        """Once the engine has drained: clients are let leave until the loop's time `until`,
        then the listener stops."""

    async def stop(self) -> None:
        """Stopped now: what is still open is closed."""


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, without its own signal handlers (the process has them), telling
    when it has started."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.up = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        await super().startup(sockets)  # type: ignore[arg-type]
        self.up.set()


class HttpListener:
    """HTTP/1.1 on the app, over connections held to their limits (`connections`)."""

    def __init__(self, wired: Wired) -> None:
        settings = wired.settings
        app = create_app(
            wired.engine, wired.control, wired.metrics, wired.keys, wired.http, wired.jobs
        )
        self.config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_config=None,
            access_log=False,
            timeout_keep_alive=settings.keep_alive_s,
            ws="none",  # no upgrade is honoured: a request that asks for one is served as HTTP/1.1
            lifespan="off",  # (the process runs the engine)
        )
        limits = Limits(
            settings.header_timeout_s, settings.body_timeout_s, settings.max_connections
        )
        self.config.http = guarded_protocol(limits, self._connection_closed)
        self.server = _Uvicorn(self.config)
        self._closed = asyncio.Event()  # every connection closed, once the drain began
        self._draining = False
        self._task: asyncio.Task[None] | None = None
        self._taking: set[asyncio.Task[object]] = set()  # backlog connections being taken in

    def _connection_closed(self, still_open: int) -> None:
        if self._draining and still_open == 0:
            self._closed.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self.server.serve(), name="http")
        up = asyncio.create_task(self.server.up.wait())
        await asyncio.wait({self._task, up}, return_when=asyncio.FIRST_COMPLETED)
        up.cancel()
        if self._task.done():  # (uvicorn logged why)
            await self._task
            raise OSError(f"HTTP did not start on {self.config.host}:{self.config.port}")

    def stop_accepting(self) -> None:
        """New connects refused, never accepted and then dropped: the connections the kernel
        has already accepted (its backlog, which closing the listener would reset) are taken
        in and answered (503, draining), then the listener closed."""
        self._draining = True
        loop = asyncio.get_running_loop()
        for server in self.server.servers:
            # a second handle on each listening socket keeps it, and its backlog, past close()
            held = [socket.socket(fileno=os.dup(s.fileno())) for s in server.sockets]
            server.close()
            for listening in held:
                with listening:
                    listening.setblocking(False)
                    for accepted in iter(functools.partial(_accepted, listening), None):
                        taken = loop.create_task(
                            loop.connect_accepted_socket(self._protocol, accepted)
                        )
                        self._taking.add(taken)
                        taken.add_done_callback(self._taking.discard)

    def _protocol(self) -> asyncio.Protocol:
        """A connection's protocol, as uvicorn makes one for the connections it accepts."""
        server = self.server
        return self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=server.server_state, app_state=server.lifespan.state
        )

    async def drain(self, until: float) -> None:
        self._draining = True
        loop = asyncio.get_running_loop()
        if self.server.server_state.connections:
            try:  # idle keep-alive connections: their clients leave, or the timeout comes
                await asyncio.wait_for(self._closed.wait(), max(0.0, until - loop.time()))
            except TimeoutError:
                open_now = len(self.server.server_state.connections)
                log.info("drain timeout: closing %d idle connections", open_now)
        self.config.timeout_graceful_shutdown = 1  # what is left is closed now
        await self._stopped()

    async def stop(self) -> None:
        self.server.force_exit = True
        await self._stopped()

    async def _stopped(self) -> None:
        self.server.should_exit = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


def _accepted(listening: socket.socket) -> socket.socket | None:
    """The next connection in `listening`'s backlog, or None when it is empty."""
    try:
        connection, _ = listening.accept()
    except (BlockingIOError, InterruptedError):
        return None
    connection.setblocking(False)
    return connection


def grpc_listener(wired: Wired) -> Listener:
    """gRPC on its own port (the grpc extra)."""
    try:
        from bucketserve.edges.grpc import GrpcListener
    except ImportError as exc:
        raise ConfigError(f"--grpc-port needs the grpc extra ({exc})") from None
    assert wired.grpc is not None  # (wired with a --grpc-port)
    return GrpcListener(wired.engine, wired.control, wired.metrics, wired.keys, wired.grpc)


async def serve(wired: Wired, ports: Sequence[Listener]) -> None:
    """Serve on `ports` until SIGTERM, then drain (or until a second signal, then stop at
    once)."""
    loop = asyncio.get_running_loop()
    drain_asked, stop_asked = asyncio.Event(), asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        if drain_asked.is_set() or sig != signal.SIGTERM:  # a second signal: stop now, cleanly
            log.info("stopping now: the drain is cut short")
            stop_asked.set()
        drain_asked.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    engine = wired.engine
    async with running(engine, wired.control, wired.metrics, wired.jobs):
        try:
            for listener in ports:
                await listener.start()
            settings = wired.settings
            served = ", ".join(engine.registry.models)
            log.info("serving %s on http://%s:%d", served, settings.host, settings.port)
            await drain_asked.wait()
            if not stop_asked.is_set():
                log.info("SIGTERM: not ready any more; finishing admitted requests")
                draining = asyncio.create_task(drain(wired, ports))
                await asyncio.wait(
                    {draining, asyncio.create_task(stop_asked.wait())},
                    return_when=asyncio.FIRST_COMPLETED,
                )
                draining.cancel()
                await asyncio.gather(draining, return_exceptions=True)
        finally:
            await asyncio.gather(*(listener.stop() for listener in ports))


async def drain(wired: Wired, ports: Sequence[Listener]) -> None:
    """New connections refused, the engine drained (new work refused, admitted work
    answered), then every listener's clients let leave, within the drain timeout."""
    until = asyncio.get_running_loop().time() + wired.settings.drain_timeout_s
    for listener in ports:
        listener.stop_accepting()
    await wired.jobs.stop()  # (their lines in flight answered and kept; resumed at the start)
    await wired.engine.drain()
    await asyncio.gather(*(listener.drain(until) for listener in ports))


def run(settings: Settings) -> int:
    logs.configure(settings.log_level, settings.log_json)
    wired = wire(settings)
    http = HttpListener(wired)
    ports = [http] if settings.grpc_port is None else [http, grpc_listener(wired)]
    with asyncio.Runner(loop_factory=http.config.get_loop_factory()) as runner:  # uvloop, if any
        runner.run(serve(wired, ports))
    return 0

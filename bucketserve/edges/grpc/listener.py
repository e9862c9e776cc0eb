"""The gRPC listener, HTTP's equal on its own port: started by the process after the engine,
drained after it, where the process's options say (`GrpcOptions`: its address, limits and
tracing). Imports the service below it, and the parts the process hands it.

A message is at most `--max-body-bytes` (the HTTP body limit): past it, gRPC itself answers
RESOURCE_EXHAUSTED before the service sees a byte. Answers have no size limit of their own
(per-step outputs of a long request can be large; the request limit bounds them).
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from bucketserve.control import Control
from bucketserve.core.engine import Engine
from bucketserve.edges.auth import ApiKeys
from bucketserve.edges.grpc.service import InferenceService
from bucketserve.edges.options import GrpcOptions
from bucketserve.metrics import Metrics

log = logging.getLogger(__name__)


class GrpcListener:
    """gRPC's port, serving `InferenceService` on the parts the process made."""

    def __init__(
        self,
        engine: Engine,
        control: Control,
        metrics: Metrics,
        keys: ApiKeys,
        options: GrpcOptions,
    ) -> None:
        """`options`: the process's (`process.wiring.grpc_options`)."""
        self.service = InferenceService(engine, metrics, keys, control, options.tracing)
        self.address = options.address
        self.max_message_bytes = options.limits.max_body_bytes
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
            ]
        )
        server.add_generic_rpc_handlers((self.service.handler(),))
        if server.add_insecure_port(self.address) == 0:
            raise OSError(f"cannot listen for gRPC on {self.address}")
        await server.start()
        self._server = server
        log.info("serving KServe v2 over gRPC on %s", self.address)

    def stop_accepting(self) -> None:
        """(gRPC keeps answering, UNAVAILABLE, until its clients go quiet: see `drain`.)"""

    async def drain(self, until: float, quiet_s: float = 0.5) -> None:
        """Once the engine has drained: new calls are still answered, UNAVAILABLE (the engine
        refuses them), until the clients have gone quiet for `quiet_s` or the loop's time
        reaches `until`; then it stops. (A call that reaches a stopping gRPC server is
        cancelled, which tells its client less than UNAVAILABLE: retry elsewhere.)"""
        loop = asyncio.get_running_loop()
        while (wake := min(self.service.last_call + quiet_s, until)) > loop.time():
            await asyncio.sleep(wake - loop.time())
        await self._stopped(1.0)

    async def stop(self) -> None:
        """No new call from now on, and calls in flight cancelled."""
        await self._stopped(0)

    async def _stopped(self, grace_s: float) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)

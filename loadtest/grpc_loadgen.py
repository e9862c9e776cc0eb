"""gRPC connections for `loadgen`'s loops: KServe v2 `ModelInfer` calls whose requests are
serialised before the run and whose answers are read but not parsed, the least a gRPC client
can do (grpc.aio still spends about twice the HTTP client's CPU a call; the bench reports
both). Each connection is a channel with a subchannel pool of its own, so N clients
hold N TCP connections, as N separate `tritonclient.grpc` processes would (channels in one
process otherwise share one).
"""

from __future__ import annotations

import grpc
import numpy as np

from bucketserve.edges.grpc.messages import MESSAGE_CLASSES, SERVICE
from bucketserve.edges.tensors import DATATYPE_OF
from loadtest.loadgen import Connect, Connection


def infer_request(model: str, inputs: dict[str, np.ndarray], outputs: list[str]) -> bytes:
    """A serialised `ModelInferRequest`: every input as raw contents, as Triton's clients send
    them from numpy."""
    request = MESSAGE_CLASSES["ModelInferRequest"](model_name=model)
    for name, array in inputs.items():
        tensor = request.inputs.add(name=name, datatype=DATATYPE_OF[array.dtype])
        tensor.shape.extend(array.shape)
        request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    for name in outputs:
        request.outputs.add(name=name)
    raw: bytes = request.SerializeToString()
    return raw


class GrpcConnection:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        # no serialisers: the request goes as the bytes given, the answer comes back as bytes
        self.infer = channel.unary_unary(f"/{SERVICE}/ModelInfer")

    async def send(self, raw: bytes) -> str | None:
        try:
            await self.infer(raw)
        except grpc.aio.AioRpcError as exc:
            return str(exc.code().name)
        return None

    async def close(self) -> None:
        await self.channel.close()


def grpc_infer(address: str) -> Connect:
    """Opens a channel of its own to `address` (host:port) per connection."""

    async def connect() -> Connection:
        channel = grpc.aio.insecure_channel(
            address, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        await channel.channel_ready()
        return GrpcConnection(channel)

    return connect

"""KServe v2 over gRPC: `GRPCInferenceService` on the engine that HTTP serves, on its own port.

`ModelInfer` takes the steps of HTTP's v2 infer: tensors (raw contents, or typed contents
checked to fit their datatype) -> `serve.edges.kserve` rows -> the engine's token budget, deadline,
admission and scheduler -> output tensors as raw contents (as Triton sends them). A request's
deadline is the sooner of its gRPC deadline and Triton's `timeout` parameter (microseconds),
never later than the server's. Errors carry the status codes Triton's clients expect; a bug
is logged and answered INTERNAL without its details. A client that cancels leaves nothing to
compute. Metrics are the HTTP routes', under the method's path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from importlib.metadata import version
from typing import Any

import grpc
import numpy as np

from serve.core.engine import Engine
from serve.core.model import Model
from serve.edges import kserve
from serve.edges.grpc.messages import MESSAGE_CLASSES, METHODS, SERVICE
from serve.edges.kserve import DATATYPE_OF, DATATYPES, V2Request, WireTensor, metadata
from serve.errors import (
    BucketserveError,
    InvalidInput,
    MalformedRequest,
    ModelNotReady,
)
from serve.metrics import Metrics
from serve.settings import Settings

log = logging.getLogger(__name__)

SERVER_NAME = "bucketserve"
STATUS_CODES = {  # HTTP status of our error -> the gRPC code Triton answers such a request with
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
CONTENTS = {  # datatype -> the typed-contents field it travels in (FP16 has none: raw only)
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}
# A request this large is decoded in a worker thread, not on the event loop (as over HTTP).
OFF_LOOP_BYTES = 64 * 1024

Message = Any  # the classes of `protocol` are made at run time
Handler = Callable[[Message, grpc.aio.ServicerContext], Awaitable[Message]]


def decode_request(request: Message) -> V2Request:
    """The request's input tensors as sent, each raw or in its typed contents."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise MalformedRequest(
            f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: send every input "
            "raw, or none"
        )
    inputs = []
    for index, tensor in enumerate(request.inputs):
        wire = WireTensor(tensor.name, tensor.datatype, tuple(tensor.shape))
        if raw:
            if tensor.HasField("contents"):
                raise MalformedRequest(f"input {tensor.name}: both contents and raw_input_contents")
            inputs.append(replace(wire, raw=raw[index]))
            continue
        field = CONTENTS.get(tensor.datatype)
        if field is None and tensor.datatype in DATATYPES:
            raise InvalidInput(
                f"input {tensor.name}: {tensor.datatype} travels as raw_input_contents only"
            )
        values = getattr(tensor.contents, field) if field is not None else None
        inputs.append(replace(wire, values=values))
    wanted = tuple(out.name for out in request.outputs) or None
    timeout_ms = None
    if "timeout" in request.parameters:  # Triton's: microseconds
        timeout_ms = request.parameters["timeout"].int64_param / 1000
    return V2Request(
        request.model_name,
        request.model_version or None,
        tuple(inputs),
        wanted,
        request.id or None,
        timeout_ms,
    )


class InferenceService:
    """The methods of `GRPCInferenceService` that bucketserve serves."""

    def __init__(self, engine: Engine, metrics: Metrics) -> None:
        self.engine = engine
        self.metrics = metrics
        self.messages = MESSAGE_CLASSES
        self.last_call = 0.0  # the loop's time when the latest call came

    def _ready(self) -> bool:
        return not self.engine.draining

    def _model(self, name: str, version: str) -> Model:
        return self.engine.model(name or None, version or None)

    async def ServerLive(self, request: Message, context: grpc.aio.ServicerContext) -> Message:  # noqa: N802
        return self.messages["ServerLiveResponse"](live=True)

    async def ServerReady(self, request: Message, context: grpc.aio.ServicerContext) -> Message:  # noqa: N802
        return self.messages["ServerReadyResponse"](ready=self._ready())

    async def ModelReady(self, request: Message, context: grpc.aio.ServicerContext) -> Message:  # noqa: N802
        if request.name in self.engine.failed:
            return self.messages["ModelReadyResponse"](ready=False)
        self._model(request.name, request.version)
        return self.messages["ModelReadyResponse"](ready=self._ready())

    async def ServerMetadata(self, request: Message, context: grpc.aio.ServicerContext) -> Message:  # noqa: N802
        return self.messages["ServerMetadataResponse"](
            name=SERVER_NAME, version=version(SERVER_NAME), extensions=[]
        )

    async def ModelMetadata(self, request: Message, context: grpc.aio.ServicerContext) -> Message:  # noqa: N802
        described = metadata(self._model(request.name, request.version))
        tensor = self.messages["ModelMetadataResponse.TensorMetadata"]
        return self.messages["ModelMetadataResponse"](
            name=described["name"],
            versions=described["versions"],
            platform=described["platform"],
            inputs=[tensor(**t) for t in described["inputs"]],
            outputs=[tensor(**t) for t in described["outputs"]],
        )

    async def ModelInfer(self, request: Message, context: grpc.aio.ServicerContext) -> Message:  # noqa: N802
        if request.ByteSize() > OFF_LOOP_BYTES:
            decoded = await asyncio.to_thread(decode_request, request)
        else:
            decoded = decode_request(request)
        remaining = context.time_remaining()
        deadline_ms = None if remaining is None else remaining * 1000
        answer, tensors = await kserve.infer(self.engine, decoded, request.id, [deadline_ms])
        model = answer.model
        response = self.messages["ModelInferResponse"](
            model_name=model.name, model_version=str(model.info.version), id=request.id
        )
        for name, array in tensors.items():
            response.outputs.add(name=name, datatype=DATATYPE_OF[array.dtype], shape=array.shape)
            little = np.ascontiguousarray(array, array.dtype.newbyteorder("<"))
            response.raw_output_contents.append(little.tobytes())
        return response

    def _answered(self, method: str, handler: Handler) -> Handler:
        """`handler` with its errors turned into status codes, and its metrics kept."""
        route = f"/{SERVICE}/{method}"

        async def call(request: Message, context: grpc.aio.ServicerContext) -> Message:
            self.last_call = asyncio.get_running_loop().time()
            start, status = time.perf_counter(), 200
            try:
                return await handler(request, context)
            except BucketserveError as exc:
                status = exc.status
                if exc.status < 500 or isinstance(exc, ModelNotReady):  # (admission counts)
                    self.metrics.reject(exc.code)
                code = STATUS_CODES.get(exc.status, grpc.StatusCode.INTERNAL)
                await context.abort(code, exc.message)
                raise  # (abort raises; this line is never reached)
            except asyncio.CancelledError:
                status = 499  # the client cancelled, or its deadline passed
                raise
            except grpc.aio.AbortError:
                raise
            except Exception:
                status = 500
                log.exception("unhandled error in %s", route)
                await context.abort(grpc.StatusCode.INTERNAL, "internal server error")
                raise
            finally:
                self.metrics.request_done(route, status, time.perf_counter() - start)

        return call

    def handler(self) -> grpc.GenericRpcHandler:
        methods = {}
        for method, (request, response) in METHODS.items():
            methods[method] = grpc.unary_unary_rpc_method_handler(
                self._answered(method, getattr(self, method)),
                request_deserializer=self.messages[request].FromString,
                response_serializer=self.messages[response].SerializeToString,
            )
        return grpc.method_handlers_generic_handler(SERVICE, methods)


class GrpcServer:
    """The gRPC listener beside HTTP: started after the engine, drained after it."""

    def __init__(self, engine: Engine, metrics: Metrics, settings: Settings) -> None:
        self.service = InferenceService(engine, metrics)
        self.address = f"{settings.host}:{settings.grpc_port}"
        self.max_message_bytes = settings.max_body_bytes
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

    async def drain(self, until: float, quiet_s: float = 0.5) -> None:
        """Once the engine has drained: new calls are still answered, UNAVAILABLE (the engine
        refuses them), until the clients have gone quiet for `quiet_s` or the loop's time
        reaches `until`; then it stops. (A call that reaches a stopping gRPC server is
        cancelled, which tells its client less than UNAVAILABLE: retry elsewhere.)"""
        loop = asyncio.get_running_loop()
        while (wake := min(self.service.last_call + quiet_s, until)) > loop.time():
            await asyncio.sleep(wake - loop.time())
        await self.stop(1.0)

    async def stop(self, grace_s: float | None) -> None:
        """No new call from now on; calls in flight get `grace_s` to finish."""
        if self._server is not None:
            await self._server.stop(grace_s)

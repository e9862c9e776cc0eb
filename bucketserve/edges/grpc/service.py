"""KServe v2 over gRPC: the methods of `GRPCInferenceService` that bucketserve serves, on the
engine that HTTP serves.

Every call is answered with a status a client can act on, whatever bytes it sent. A method
takes its request as raw bytes and reads exactly one message itself: a call with no message,
or two, and bytes that do not decode (truncated, not protobuf, invalid UTF-8 in a string) are
INVALID_ARGUMENT, never UNKNOWN. `ModelInfer` decodes its message into the v2 request HTTP's
infer makes too (`decoding`) and takes the same path through the core (`bucketserve.edges.kserve`);
outputs go back as raw contents (as Triton sends them). A request's deadline is the soonest of
its gRPC deadline, Triton's `timeout` parameter (microseconds; 0: none) and the server's.

With an API key set, every method but liveness and readiness needs it as `authorization`
metadata (`Bearer <key>`): UNAUTHENTICATED without it. Errors carry the codes Triton's clients
expect and a message of at most 500 characters that quotes a client's strings cut short; how a
failure is counted and logged is `edges.failures`' rule, the same as HTTP's (a bug: INTERNAL,
without its details). A client that cancels leaves nothing to compute. Metrics are the HTTP
routes', under the method's path.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from bucketserve.about import NAME, VERSION
from bucketserve.control import Control
from bucketserve.core.calls import OFF_LOOP_BYTES
from bucketserve.core.engine import Engine
from bucketserve.core.model import Model
from bucketserve.edges import headers, kserve
from bucketserve.edges.auth import OPEN_METHODS, ApiKeys
from bucketserve.edges.failures import CLIENT_CLOSED, Failures
from bucketserve.edges.grpc.decoding import decode_request
from bucketserve.edges.grpc.messages import DATA_TYPES, MESSAGE_CLASSES, METHODS, SERVICE
from bucketserve.edges.kserve import metadata
from bucketserve.edges.tensors import DATATYPE_OF, little_endian
from bucketserve.errors import Forbidden, MalformedRequest, brief
from bucketserve.metrics import Metrics
from bucketserve.tracing import Tracing

STATUS_CODES = {  # HTTP status of our error -> the gRPC code Triton answers such a request with
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.FAILED_PRECONDITION,  # (model control off)
    404: grpc.StatusCode.NOT_FOUND,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
CODES = {Forbidden.code: grpc.StatusCode.PERMISSION_DENIED}  # (where a status says too little)
INTERNAL = grpc.StatusCode.INTERNAL
AUTHORIZATION = "authorization"  # metadata: `Bearer <key>`, as the HTTP header

Message = Any  # the classes of `messages` are made at run time
Context = Any  # grpc.aio.ServicerContext (grpc ships no type information)
Method = Callable[[Message, Context], Awaitable[Message]]
Entries = tuple[tuple[str, str], ...]  # a call's text metadata, names lower-cased
# The call's metadata, as `_answered` read it once (each call runs in a task of its own, so each
# sees its own): names compared as HTTP/2 compares them, case not mattering.
CALL_METADATA: contextvars.ContextVar[Entries] = contextvars.ContextVar("call_metadata")


async def one_message(requests: AsyncIterator[bytes]) -> bytes:
    """The one message of a unary call. A call that ends without one would otherwise wait
    forever; a second one is a client that does not speak this method."""
    messages = []
    async for message in requests:
        messages.append(message)
        if len(messages) > 1:
            break
    if len(messages) != 1:
        raise MalformedRequest(f"a unary call carries one message, this one {len(messages)}")
    return messages[0]


def parsed(kind: Any, data: bytes) -> Message:
    try:
        return kind.FromString(data)
    except DecodeError:
        raise MalformedRequest(f"the message does not decode as {kind.DESCRIPTOR.name}") from None


class InferenceService:
    """The methods of `GRPCInferenceService` that bucketserve serves."""

    def __init__(
        self,
        engine: Engine,
        metrics: Metrics,
        keys: ApiKeys | None = None,
        control: Control | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """`tracing`: the process's (default: off)."""
        self.engine = engine
        self.tracing = tracing or Tracing()
        self.control = control or Control(engine, None)
        self.metrics = metrics
        self.failures = Failures(metrics)
        self.keys = keys or ApiKeys(())
        self.messages = MESSAGE_CLASSES
        self.last_call = 0.0  # the loop's time when the latest call came

    def _ready(self) -> bool:
        return self.engine.ready

    def _model(self, name: str, version: str) -> Model:
        return self.engine.model(name or None, version or None)

    async def ServerLive(self, request: Message, context: Context) -> Message:  # noqa: N802
        return self.messages["ServerLiveResponse"](live=True)

    async def ServerReady(self, request: Message, context: Context) -> Message:  # noqa: N802
        return self.messages["ServerReadyResponse"](ready=self._ready())

    async def ModelReady(self, request: Message, context: Context) -> Message:  # noqa: N802
        if request.name in self.engine.registry.failed:
            return self.messages["ModelReadyResponse"](ready=False)
        self._model(request.name, request.version)
        return self.messages["ModelReadyResponse"](ready=self._ready())

    async def ServerMetadata(self, request: Message, context: Context) -> Message:  # noqa: N802
        return self.messages["ServerMetadataResponse"](name=NAME, version=VERSION, extensions=[])

    async def ModelMetadata(self, request: Message, context: Context) -> Message:  # noqa: N802
        model = self._model(request.name, request.version)
        described = metadata(model, self.engine.registry.versions(model.name))
        tensor = self.messages["ModelMetadataResponse.TensorMetadata"]
        return self.messages["ModelMetadataResponse"](
            name=described["name"],
            versions=described["versions"],
            platform=described["platform"],
            inputs=[tensor(**t) for t in described["inputs"]],
            outputs=[tensor(**t) for t in described["outputs"]],
        )

    async def ModelConfig(self, request: Message, context: Context) -> Message:  # noqa: N802
        config = kserve.triton_config(self._model(request.name, request.version))

        def tensors(kind: str, described: list[dict[str, Any]]) -> list[Message]:
            return [
                self.messages[kind](**{**t, "data_type": DATA_TYPES.index(t["data_type"])})
                for t in described
            ]

        message = self.messages["ModelConfig"](
            name=config["name"],
            platform=config["platform"],
            backend=config["backend"],
            max_batch_size=config["max_batch_size"],
            input=tensors("ModelInput", config["input"]),
            output=tensors("ModelOutput", config["output"]),
            dynamic_batching=self.messages["ModelDynamicBatching"](),
        )
        return self.messages["ModelConfigResponse"](config=message)

    async def RepositoryIndex(self, request: Message, context: Context) -> Message:  # noqa: N802
        entries = self.engine.registry.index()
        if request.ready:
            entries = [e for e in entries if e["state"] == "READY"]
        index = self.messages["RepositoryIndexResponse.ModelIndex"]
        return self.messages["RepositoryIndexResponse"](models=[index(**e) for e in entries])

    async def RepositoryModelLoad(self, request: Message, context: Context) -> Message:  # noqa: N802
        kserve.repository_parameters(request.parameters, kserve.LOAD_PARAMETERS)
        await self.control.load(request.model_name)
        return self.messages["RepositoryModelLoadResponse"]()

    async def RepositoryModelUnload(self, request: Message, context: Context) -> Message:  # noqa: N802
        kserve.repository_parameters(request.parameters, kserve.UNLOAD_PARAMETERS)
        await self.control.unload(request.model_name)
        return self.messages["RepositoryModelUnloadResponse"]()

    async def ModelInfer(self, request: Message, context: Context) -> Message:  # noqa: N802
        if request.ByteSize() > OFF_LOOP_BYTES:
            decoded = await asyncio.to_thread(decode_request, request)
        else:
            decoded = decode_request(request)
        remaining = context.time_remaining()
        deadline_ms = None if remaining is None else remaining * 1000
        entries = CALL_METADATA.get()
        metadata = dict(entries)
        metadata_id = metadata.get(headers.REQUEST_ID)
        given = metadata_id if isinstance(metadata_id, str) else request.id
        level = metadata.get(headers.PRIORITY)  # (Triton's `priority` parameter first)
        answer, tensors = await kserve.infer(
            self.engine,
            decoded,
            headers.request_id(given),
            [deadline_ms],
            None if level is None else headers.priority_level(level, headers.PRIORITY),
            self._tenant(entries),
        )
        model = answer.model
        response = self.messages["ModelInferResponse"](
            model_name=model.name, model_version=str(model.info.version), id=request.id
        )
        for name, array in tensors.items():
            response.outputs.add(name=name, datatype=DATATYPE_OF[array.dtype], shape=array.shape)
            response.raw_output_contents.append(little_endian(array))
        return response

    def _tenant(self, entries: Entries) -> str:
        """The call's tenant, by its key or the metadata the operator names (`edges.auth`)."""
        keys = self.keys
        authorizations = [v for k, v in entries if k == AUTHORIZATION]
        named = [v for k, v in entries if k == keys.tenant_header]
        return keys.tenant(authorizations, named)

    def _answered(self, method: str, kind: Any, handler: Method) -> Any:
        """`handler` over the call's raw bytes: its one message decoded, its errors turned
        into status codes, its metrics kept, its span opened (continuing a `traceparent` from the
        metadata, when tracing is on)."""
        route = f"/{SERVICE}/{method}"

        async def call(requests: AsyncIterator[bytes], context: Context) -> Message:
            self.last_call = asyncio.get_running_loop().time()
            entries = tuple(
                (k.lower(), v) for k, v in context.invocation_metadata() or () if isinstance(v, str)
            )
            CALL_METADATA.set(entries)  # (read by the handler: walked once a call)
            with self.tracing.request(route, dict(entries)) as span:
                return await answer(requests, context, entries, span)

        async def answer(
            requests: AsyncIterator[bytes],
            context: Context,
            entries: Entries,
            span: Any,
        ) -> Message:
            start, status = time.perf_counter(), 200
            try:
                if method not in OPEN_METHODS:
                    self.keys.check([v for k, v in entries if k == AUTHORIZATION])
                return await handler(parsed(kind, await one_message(requests)), context)
            except asyncio.CancelledError:
                status = CLIENT_CLOSED  # the client cancelled, or its deadline passed
                self.failures.client_left(route)
                raise
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                error = self.failures.settle(exc, route)
                status = error.status
                code = CODES.get(error.code) or STATUS_CODES.get(error.status, INTERNAL)
                await context.abort(code, brief(error.message))
                raise  # (abort raises; this line is never reached)
            finally:
                self.metrics.request_done(route, status, time.perf_counter() - start)
                span.set("bucketserve.status", status)  # (as HTTP would answer it)

        return call

    def handler(self) -> grpc.GenericRpcHandler:
        """Every method as stream -> unary over raw bytes (a unary client's call is the same
        on the wire), so that the service, not the gRPC runtime, reads and decodes the
        message."""
        methods = {}
        for method, (request, response) in METHODS.items():
            methods[method] = grpc.stream_unary_rpc_method_handler(
                self._answered(method, self.messages[request], getattr(self, method)),
                response_serializer=self.messages[response].SerializeToString,
            )
        return grpc.method_handlers_generic_handler(SERVICE, methods)

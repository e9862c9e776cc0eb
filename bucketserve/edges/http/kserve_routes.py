"""The KServe v2 / Triton HTTP protocol, so that `tritonclient.http` works unchanged.

Routes only: a body is decoded by `kserve_body`; the inference path is the one gRPC shares
(`bucketserve.edges.kserve`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request, Response

from bucketserve.about import NAME, VERSION
from bucketserve.core.engine import Engine
from bucketserve.core.model import Model
from bucketserve.edges import kserve
from bucketserve.edges.http.common import (
    BINARY,
    JSON,
    LENGTH_PARAMETER,
    PRIORITY_PARAMETER,
    TIMEOUT_PARAMETER,
    control_of,
    engine_of,
    fingerprinted,
    json_response,
    limits_of,
    media_type,
    off_loop,
    parse_json,
    read_body,
    request_id,
    request_priority,
    request_tenant,
    request_timeout_ms,
    unless_client_leaves,
)
from bucketserve.edges.http.dialects import OWN, errors
from bucketserve.edges.http.kserve_body import decode_request, encode_response, header_length
from bucketserve.edges.http.schemas import (
    IndexEntry,
    InferRequest,
    InferResponse,
    Live,
    ModelMetadata,
    ModelReady,
    Ready,
    ServerMetadata,
    inlined,
)
from bucketserve.edges.kserve import (
    LOAD_PARAMETERS,
    UNLOAD_PARAMETERS,
    metadata,
    repository_parameters,
    triton_config,
)
from bucketserve.edges.limits import Limits
from bucketserve.errors import BucketserveError, MalformedRequest, ModelNotFound

router = APIRouter(prefix="/v2", tags=["KServe v2"])

HEADER_LENGTH = "inference-header-content-length"


Handler = Callable[[Request, str, str | None], Awaitable[Response]]


def model_routes(method: str, suffix: str, **options: Any) -> Callable[[Handler], Handler]:
    """Register `handler(request, name, version)` at /models/{name}{suffix} and at
    /models/{name}/versions/{version}{suffix}: the version is a path parameter of the second,
    never a stray query parameter of the first."""

    def register(handler: Handler) -> Handler:
        async def latest(request: Request, name: str) -> Response:
            return await handler(request, name, None)

        async def versioned(request: Request, name: str, version: str) -> Response:
            return await handler(request, name, version)

        for path, endpoint, label in (
            (f"/models/{{name}}{suffix}", latest, handler.__name__),
            (f"/models/{{name}}/versions/{{version}}{suffix}", versioned, f"{handler.__name__}_v"),
        ):
            router.add_api_route(path, endpoint, methods=[method], name=label, **options)
        return handler

    return register


def _model(request: Request, name: str, version: str | None) -> Model:
    return engine_of(request).model(name, version)


def _failed(request: Request, name: str, version: str | None) -> str | None:
    """Why the model did not load, or None; no version of such a model is served."""
    failed = engine_of(request).registry.failed
    if name in failed and version is not None:
        raise ModelNotFound(f"model {name} did not load: no version of it is served")
    return failed.get(name)


def _ready(request: Request) -> bool:
    return engine_of(request).ready


@router.get("/health/live", summary="Liveness", response_model=Live)
async def live() -> Response:
    return json_response({"live": True})


@router.get(
    "/health/ready",
    summary="Readiness: every model that loaded is warm, and the server is not draining",
    response_model=Ready,
    responses={503: {"model": Ready, "description": "loading or draining"}},
)
async def ready(request: Request) -> Response:
    is_ready = _ready(request)
    return json_response({"ready": is_ready}, 200 if is_ready else 503)


@router.get("", summary="Server metadata", response_model=ServerMetadata)
async def server_metadata(request: Request) -> Response:
    # default_model is ours (v2 clients ignore fields they do not know): the model that
    # /predict serves when a request names none.
    return json_response(
        {
            "name": NAME,
            "version": VERSION,
            "extensions": ["binary_tensor_data"],
            "default_model": engine_of(request).registry.default_model,
        }
    )


@model_routes(
    "GET",
    "",
    summary="Model metadata",
    response_model=ModelMetadata,
    responses=errors(OWN, 404, 422, 503),
)
async def model_metadata(request: Request, name: str, version: str | None) -> Response:
    model = _model(request, name, version)
    return json_response(metadata(model, engine_of(request).registry.versions(model.name)))


@model_routes(
    "GET",
    "/config",
    summary="Model configuration, as served",
    response_model=dict[str, Any],
    responses=errors(OWN, 404, 422),
)
async def model_config(request: Request, name: str, version: str | None) -> Response:
    """The model's config.toml with fitted edges, overrides and what load found applied (load
    generators read the bucket edges from here), whether its result cache is on and why, and
    beside it, under Triton's own keys (`platform`, `max_batch_size`, `input`, `output`...),
    the model as Triton's configuration at this path describes one, for the clients that read
    it. A model that did not load says why."""
    failed = _failed(request, name, version)
    if failed is not None:
        return json_response({"name": name, "ready": False, "error": failed})
    model = _model(request, name, version)
    engine = engine_of(request)
    refused = engine.cache_refused(model)
    cache = {
        "on": refused is None,
        "bytes": engine.cache_bound_bytes if refused is None else 0,
        "why": refused or "on: the check found batching and padding change no answer",
    }
    return json_response(
        {**model.info.served_config, "result_cache": cache, **triton_config(model)}
    )


@model_routes(
    "GET",
    "/ready",
    summary="Model readiness",
    response_model=ModelReady,
    responses={
        **errors(OWN, 404, 422),
        503: {"model": ModelReady, "description": "draining, or it did not load (with why)"},
    },
)
async def model_ready(request: Request, name: str, version: str | None) -> Response:
    failed = _failed(request, name, version)
    if failed is not None:
        return json_response({"name": name, "ready": False, "error": failed}, 503)
    model = _model(request, name, version)
    is_ready = _ready(request)
    return json_response({"name": model.name, "ready": is_ready}, 200 if is_ready else 503)


@router.post(
    "/repository/index",
    summary="Every model of the repository, and its state",
    response_model=list[IndexEntry],
)
async def repository_index(request: Request) -> Response:
    """Triton's repository index: each version served READY; a model that did not load, or
    was unloaded, UNAVAILABLE with the reason."""
    return json_response(engine_of(request).registry.index())


@router.post(
    "/repository/models/{name}/load",
    summary="Load a model, or replace it, while serving (--model-control explicit or poll)",
    response_model=dict[str, Any],
    responses=errors(OWN, 400, 403, 413, 415),
)
async def repository_load(request: Request, name: str) -> Response:
    """Every version the model's config serves, built and checked beside what is served,
    then switched to; the versions replaced finish what they took. A failed load: 400, and
    what was served keeps serving."""
    await _parameters(request, allowed=LOAD_PARAMETERS)
    await control_of(request).load(name)
    return json_response({})


@router.post(
    "/repository/models/{name}/unload",
    summary="Unload a model while serving (--model-control explicit or poll)",
    response_model=dict[str, Any],
    responses=errors(OWN, 400, 403, 413, 415),
)
async def repository_unload(request: Request, name: str) -> Response:
    await _parameters(request, allowed=UNLOAD_PARAMETERS)
    await control_of(request).unload(name)
    return json_response({})


def _most_values(engine: Engine, limits: Limits, name: str, version: str | None) -> int | None:
    """The most numbers a request for the model may carry (`kserve.most_values`); None when
    the model is not served (the infer call says why, after the body is read)."""
    try:
        model = engine.model(name, version)
    except BucketserveError:
        return None
    return kserve.most_values(model, limits.max_sequences)


async def _parameters(request: Request, allowed: tuple[str, ...]) -> None:
    """A load's or an unload's body: none, or `{"parameters": {...}}` with only the
    parameters `allowed` (`kserve.repository_parameters`)."""
    body = await read_body(request, 64 * 1024)
    if not body.strip():
        return
    given = parse_json(body)
    parameters = given.get("parameters", {}) if isinstance(given, dict) else None
    if not isinstance(parameters, dict) or set(given) - {"parameters"}:
        raise MalformedRequest('expected no body, or {"parameters": {...}}')
    repository_parameters(parameters, allowed)


BINARY_BODY = {"schema": {"type": "string", "format": "binary"}}
INFER_CONTRACT = {
    "requestBody": {
        "required": True,
        "description": "JSON, or a JSON header (Inference-Header-Content-Length bytes) and the "
        "binary tensors it describes, in order",
        "content": {JSON: {"schema": inlined(InferRequest)}, BINARY: BINARY_BODY},
    },
    "parameters": [TIMEOUT_PARAMETER, PRIORITY_PARAMETER, LENGTH_PARAMETER],
}


@model_routes(
    "POST",
    "/infer",
    summary="Inference (JSON or binary tensors)",
    response_model=InferResponse,
    responses={
        200: {"content": {BINARY: BINARY_BODY}, "description": "outputs (JSON, or binary)"},
        **errors(OWN, 400, 404, 413, 415, 422, 503, 504),
    },
    openapi_extra=INFER_CONTRACT,
)
async def infer(request: Request, name: str, version: str | None) -> Response:
    engine, limits = engine_of(request), limits_of(request)
    budget = limits.tensors(_most_values(engine, limits, name, version))
    body = await read_body(request, budget.bytes, (JSON, BINARY))
    binary = media_type(request) != JSON  # (a JSON body is JSON whole, whatever a header says)
    json_length = header_length(request.headers.get(HEADER_LENGTH), len(body)) if binary else None
    decoded = await off_loop(
        decode_request, body, json_length, name, version, budget.steps, budget.values
    )
    work = kserve.infer(
        engine,
        decoded.request,
        request_id(request),
        [request_timeout_ms(request)],
        request_priority(request),
        request_tenant(request),
    )
    answer, tensors = await unless_client_leaves(request, work)
    fingerprinted(request, answer)
    model = answer.model
    header: dict[str, Any] = {"model_name": model.name, "model_version": str(model.info.version)}
    if decoded.request.id is not None:
        header["id"] = decoded.request.id
    as_binary = decoded.binary_outputs or dict.fromkeys(tensors, decoded.binary_by_default)
    content, json_length = encode_response(header, tensors, as_binary)
    if json_length is None:
        return Response(content, media_type="application/json")
    return Response(
        content,
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(json_length)},
    )

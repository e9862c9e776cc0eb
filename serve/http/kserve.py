"""The KServe v2 / Triton HTTP protocol, so that `tritonclient.http` works unchanged.

Routes only: tensors are decoded by `tensors`, turned into sequences (and outputs back into
tensors) by `rows`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response

from serve.errors import InvalidInput, ModelNotFound
from serve.http.common import (
    BINARY,
    JSON,
    SERVER_VERSION,
    engine_of,
    json_response,
    off_loop,
    read_body,
    request_timeout_ms,
    unless_client_leaves,
    within_token_budget,
)
from serve.http.rows import sequences_from_tensors, stack_outputs
from serve.http.tensors import (
    DATATYPE_OF,
    Decoded,
    decode_request,
    encode_response,
    header_length,
)
from serve.layout import InputRole, Tensor
from serve.model import Model
from serve.settings import Settings

router = APIRouter(prefix="/v2", tags=["KServe v2"])

HEADER_LENGTH = "inference-header-content-length"
CLIENT_INPUTS = (
    InputRole.TOKENS,
    InputRole.FEATURES,
    InputRole.MASK,
    InputRole.LENGTHS,
    InputRole.TOKEN_TYPES,
)


def _model(request: Request, name: str, version: str | None) -> Model:
    model = engine_of(request).model(name)
    if version is not None and version != str(model.info.version):
        raise ModelNotFound(f"model {name} has no version {version} (serving {model.info.version})")
    return model


def _ready(request: Request) -> bool:
    engine = getattr(request.app.state, "engine", None)
    return engine is not None and not engine.draining


@router.get("/health/live", summary="Liveness")
async def live() -> Response:
    return json_response({"live": True})


@router.get(
    "/health/ready",
    summary="Readiness: every model that loaded is warm, and the server is not draining",
)
async def ready(request: Request) -> Response:
    is_ready = _ready(request)
    return json_response({"ready": is_ready}, 200 if is_ready else 503)


@router.get("", summary="Server metadata")
async def server_metadata(request: Request) -> Response:
    # default_model is ours (v2 clients ignore fields they do not know): the model that
    # /predict serves when a request names none.
    return json_response(
        {
            "name": "bucketserve",
            "version": SERVER_VERSION,
            "extensions": ["binary_tensor_data"],
            "default_model": engine_of(request).default_model,
        }
    )


def _described(tensor: Tensor) -> dict[str, Any]:
    return {
        "name": tensor.name,
        "datatype": DATATYPE_OF[tensor.dtype],
        "shape": [-1 if d is None else d for d in tensor.dims],
    }


@router.get("/models/{name}", summary="Model metadata")
@router.get("/models/{name}/versions/{version}", summary="Model metadata")
async def model_metadata(request: Request, name: str, version: str | None = None) -> Response:
    model = _model(request, name, version)
    layout = model.info.layout
    return json_response(
        {
            "name": model.name,
            "versions": [str(model.info.version)],
            "platform": "onnxruntime_onnx",
            "inputs": [_described(i.tensor) for i in layout.inputs if i.role in CLIENT_INPUTS],
            "outputs": [_described(o) for o in layout.outputs],
        }
    )


@router.get("/models/{name}/config", summary="Model configuration, as served")
@router.get("/models/{name}/versions/{version}/config", summary="Model configuration, as served")
async def model_config(request: Request, name: str, version: str | None = None) -> Response:
    """The model's config.toml with fitted edges, overrides and what load found applied
    (Triton serves its model configuration at the same path); load generators read the
    bucket edges from here. A model that did not load says why."""
    failed = engine_of(request).failed
    if name in failed:
        return json_response({"name": name, "ready": False, "error": failed[name]})
    return json_response(_model(request, name, version).info.served_config)


@router.get("/models/{name}/ready", summary="Model readiness")
@router.get("/models/{name}/versions/{version}/ready", summary="Model readiness")
async def model_ready(request: Request, name: str, version: str | None = None) -> Response:
    failed = engine_of(request).failed
    if name in failed:
        return json_response({"name": name, "ready": False, "error": failed[name]}, 503)
    model = _model(request, name, version)
    is_ready = _ready(request)
    return json_response({"name": model.name, "ready": is_ready}, 200 if is_ready else 503)


@router.post("/repository/index", summary="Every model of the repository, and its state")
async def repository_index(request: Request) -> Response:
    """Triton's repository index: each model READY, or UNAVAILABLE with the reason."""
    engine = engine_of(request)
    ready = [
        {"name": name, "version": str(model.info.version), "state": "READY"}
        for name, model in engine.models.items()
    ]
    failed = [
        {"name": name, "state": "UNAVAILABLE", "reason": error}
        for name, error in engine.failed.items()
    ]
    return json_response(sorted(ready + failed, key=lambda entry: entry["name"]))


def _decode(
    body: bytes, json_length: int | None, model: Model, settings: Settings
) -> tuple[Decoded, list[np.ndarray], int]:
    """The request's tensors, and its rows as validated sequences (T: the steps sent)."""
    parsed = decode_request(body, json_length)
    sequences, steps = sequences_from_tensors(model, parsed.inputs, settings.max_sequences)
    within_token_budget(sequences, settings.max_request_tokens)
    return parsed, sequences, steps


@router.post("/models/{name}/infer", summary="Inference (JSON or binary tensors)")
@router.post(
    "/models/{name}/versions/{version}/infer", summary="Inference (JSON or binary tensors)"
)
async def infer(request: Request, name: str, version: str | None = None) -> Response:
    engine = engine_of(request)
    model = _model(request, name, version)
    body = await read_body(request, engine.settings.max_body_bytes, (JSON, BINARY))
    json_length = header_length(request.headers.get(HEADER_LENGTH), len(body))
    parsed, sequences, steps = await off_loop(_decode, body, json_length, model, engine.settings)
    known = model.info.layout.output_names
    wanted = parsed.outputs or dict.fromkeys(known, parsed.binary_by_default)
    for out in wanted:
        if out not in known:
            raise InvalidInput(f"model {model.name} has no output {out}")
    timeouts = [t for t in (request_timeout_ms(request), parsed.timeout_ms) if t is not None]
    deadline = engine.deadline(min(timeouts, default=None))
    answers = await unless_client_leaves(request, engine.infer(model, sequences, deadline))
    tensors = stack_outputs(model, answers, list(wanted), steps)
    header: dict[str, Any] = {"model_name": model.name, "model_version": str(model.info.version)}
    if parsed.id is not None:
        header["id"] = parsed.id
    content, json_length = encode_response(header, tensors, wanted)
    if json_length is None:
        return Response(content, media_type="application/json")
    return Response(
        content,
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(json_length)},
    )

"""The KServe v2 / Triton HTTP protocol, so that `tritonclient.http` works unchanged.

Rows of the `[n, T]` (or `[n, T, F]`) sequence tensor are n sequences. A mask or lengths
input, when sent, gives each row's length; otherwise every row is T long. Per-step outputs
come back as `[n, T, ...]` with zeros past each row's length.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response

from serve import __version__
from serve.batcher import Outputs
from serve.config import InputRole
from serve.errors import InvalidInput, ModelNotFound
from serve.http.common import (
    engine_of,
    json_response,
    read_body,
    request_timeout_ms,
    unless_client_leaves,
)
from serve.http.tensors import DATATYPE_OF, decode_request, encode_response
from serve.model import Model

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
    if version is not None and version != str(model.spec.version):
        raise ModelNotFound(f"model {name} has no version {version} (serving {model.spec.version})")
    return model


def _ready(request: Request) -> bool:
    engine = getattr(request.app.state, "engine", None)
    return engine is not None and not engine.draining


@router.get("/health/live", summary="Liveness")
async def live() -> Response:
    return json_response({"live": True})


@router.get("/health/ready", summary="Readiness: models loaded and warm, not draining")
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
            "version": __version__,
            "extensions": ["binary_tensor_data"],
            "default_model": engine_of(request).repository.default_model,
        }
    )


def _dims(dims: tuple[int | str, ...]) -> list[int]:
    return [d if isinstance(d, int) else -1 for d in dims]


@router.get("/models/{name}", summary="Model metadata")
@router.get("/models/{name}/versions/{version}", summary="Model metadata")
async def model_metadata(request: Request, name: str, version: str | None = None) -> Response:
    model = _model(request, name, version)
    sig, config = model.spec.signature, model.spec.config
    inputs = [
        {
            "name": n,
            "datatype": DATATYPE_OF[sig.inputs[n].dtype],
            "shape": _dims(sig.inputs[n].dims),
        }
        for n, cfg in config.inputs.items()
        if cfg.role in CLIENT_INPUTS
    ]
    outputs = [
        {
            "name": n,
            "datatype": DATATYPE_OF[sig.outputs[n].dtype],
            "shape": _dims(sig.outputs[n].dims),
        }
        for n in config.outputs
    ]
    return json_response(
        {
            "name": model.name,
            "versions": [str(model.spec.version)],
            "platform": "onnxruntime_onnx",
            "inputs": inputs,
            "outputs": outputs,
        }
    )


@router.get("/models/{name}/config", summary="Model configuration, as served")
@router.get("/models/{name}/versions/{version}/config", summary="Model configuration, as served")
async def model_config(request: Request, name: str, version: str | None = None) -> Response:
    """The model's config.toml with fitted edges and command-line overrides applied (Triton
    serves its model configuration at the same path); load generators read the bucket
    edges from here."""
    model = _model(request, name, version)
    return json_response(
        {
            "name": model.name,
            "version": str(model.spec.version),
            "strategy": model.executor.strategy,
            "pad_sensitive": model.pad_sensitive,
            **model.spec.config.model_dump(mode="json"),
        }
    )


@router.get("/models/{name}/ready", summary="Model readiness")
@router.get("/models/{name}/versions/{version}/ready", summary="Model readiness")
async def model_ready(request: Request, name: str, version: str | None = None) -> Response:
    model = _model(request, name, version)
    is_ready = _ready(request)
    return json_response({"name": model.name, "ready": is_ready}, 200 if is_ready else 503)


def _row_lengths(model: Model, inputs: dict[str, np.ndarray], rows: int, steps: int) -> np.ndarray:
    """Each row's length, from the mask or lengths input when one was sent."""
    for name, cfg in model.spec.config.inputs.items():
        if name not in inputs or cfg.role not in (InputRole.MASK, InputRole.LENGTHS):
            continue
        given = inputs[name]
        if cfg.role is InputRole.LENGTHS:
            if given.shape != (rows,):
                raise InvalidInput(
                    f"input {name}: expected shape [{rows}], got {list(given.shape)}"
                )
            lengths: np.ndarray = given.astype(np.int64)
            return lengths
        if given.shape != (rows, steps):
            raise InvalidInput(
                f"input {name}: expected shape [{rows}, {steps}], got {list(given.shape)}"
            )
        lengths = (given != 0).sum(axis=1)
        if not (given.astype(bool) == (np.arange(steps) < lengths[:, None])).all():
            raise InvalidInput(f"input {name}: each row must be ones followed by zeros")
        return lengths
    return np.full(rows, steps, np.int64)


def sequences_from_tensors(
    model: Model, inputs: dict[str, np.ndarray], max_sequences: int
) -> list[np.ndarray]:
    config = model.spec.config
    for name in inputs:
        if name not in config.inputs:
            raise InvalidInput(f"model {model.name} has no input {name}")
        cfg = config.inputs[name]
        if cfg.role is InputRole.STATE:
            raise InvalidInput(f"input {name} is a state the server fills; do not send it")
        if cfg.role is InputRole.TOKEN_TYPES and inputs[name].any():
            raise InvalidInput(f"input {name}: only token type 0 is supported")
    name = config.sequence_input
    if name not in inputs:
        raise InvalidInput(f"missing input {name}")
    tensor = inputs[name]
    rank = 2 if config.inputs[name].role is InputRole.TOKENS else 3
    if tensor.ndim != rank:
        raise InvalidInput(f"input {name}: expected rank {rank}, got shape {list(tensor.shape)}")
    rows, steps = tensor.shape[:2]
    if rows == 0 or steps == 0:
        raise InvalidInput(f"input {name}: empty")
    if rows > max_sequences:
        raise InvalidInput(f"too many sequences: {rows} > {max_sequences}")
    lengths = _row_lengths(model, inputs, rows, steps)
    if lengths.min() < 1 or lengths.max() > steps:
        raise InvalidInput(f"row lengths must lie in 1..{steps}")
    return [model.validate(tensor[i, : lengths[i]], i) for i in range(rows)]


def stack_outputs(
    model: Model, answers: list[Outputs], names: list[str], steps: int
) -> dict[str, np.ndarray]:
    """Per-sequence outputs back into [n, ...] tensors; per-step ones zero-padded to T."""
    tensors = {}
    for name in names:
        parts = [a[name] for a in answers]
        if model.spec.config.outputs[name].per_step:
            out = np.zeros((len(parts), steps, *parts[0].shape[1:]), parts[0].dtype)
            for row, part in enumerate(parts):
                out[row, : len(part)] = part
            tensors[name] = out
        else:
            tensors[name] = np.stack(parts)
    return tensors


@router.post("/models/{name}/infer", summary="Inference (JSON or binary tensors)")
@router.post(
    "/models/{name}/versions/{version}/infer", summary="Inference (JSON or binary tensors)"
)
async def infer(request: Request, name: str, version: str | None = None) -> Response:
    engine = engine_of(request)
    model = _model(request, name, version)
    body = await read_body(request, engine.settings.max_body_bytes)
    parsed = decode_request(body, request.headers.get(HEADER_LENGTH))
    wanted = parsed.outputs or dict.fromkeys(model.spec.config.outputs, parsed.binary_by_default)
    for out in wanted:
        if out not in model.spec.config.outputs:
            raise InvalidInput(f"model {model.name} has no output {out}")
    sequences = sequences_from_tensors(model, parsed.inputs, engine.settings.max_sequences)
    deadline = engine.deadline(request_timeout_ms(request))
    answers = await unless_client_leaves(request, engine.infer(model, sequences, deadline))
    steps = parsed.inputs[model.spec.config.sequence_input].shape[1]
    tensors = stack_outputs(model, answers, list(wanted), steps)
    header: dict[str, Any] = {"model_name": model.name, "model_version": str(model.spec.version)}
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

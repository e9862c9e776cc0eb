"""The KServe v2 / Triton HTTP protocol, so that `tritonclient.http` works unchanged.

Rows of the `[n, T]` (or `[n, T, F]`) sequence tensor are n sequences. A mask or lengths
input, when sent, gives each row's length; otherwise every row is T long. Per-step outputs
come back as `[n, T, ...]` with zeros past each row's length.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response

from serve.batcher import Outputs
from serve.errors import InvalidInput, ModelNotFound
from serve.http.common import (
    SERVER_VERSION,
    engine_of,
    json_response,
    read_body,
    request_timeout_ms,
    unless_client_leaves,
)
from serve.http.tensors import DATATYPE_OF, decode_request, encode_response
from serve.layout import InputRole, Tensor
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
    if version is not None and version != str(model.info.version):
        raise ModelNotFound(f"model {name} has no version {version} (serving {model.info.version})")
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
    """The model's config.toml with fitted edges and command-line overrides applied (Triton
    serves its model configuration at the same path); load generators read the bucket
    edges from here."""
    return json_response(_model(request, name, version).info.served_config)


@router.get("/models/{name}/ready", summary="Model readiness")
@router.get("/models/{name}/versions/{version}/ready", summary="Model readiness")
async def model_ready(request: Request, name: str, version: str | None = None) -> Response:
    model = _model(request, name, version)
    is_ready = _ready(request)
    return json_response({"name": model.name, "ready": is_ready}, 200 if is_ready else 503)


def _row_lengths(model: Model, inputs: dict[str, np.ndarray], rows: int, steps: int) -> np.ndarray:
    """Each row's length, from the mask or lengths input when one was sent."""
    for inp in model.info.layout.inputs:
        name = inp.tensor.name
        if name not in inputs or inp.role not in (InputRole.MASK, InputRole.LENGTHS):
            continue
        given = inputs[name]
        if inp.role is InputRole.LENGTHS:
            if given.shape != (rows,):
                raise InvalidInput(
                    f"input {name}: expected shape [{rows}], got {list(given.shape)}"
                )
            lengths: np.ndarray = given.astype(np.int64)
            return lengths
        expected = inp.tensor.shape(rows, steps)
        if given.shape != expected:
            raise InvalidInput(
                f"input {name}: expected shape {list(expected)}, got {list(given.shape)}"
            )
        given = inp.tensor.to_batch_major(given)
        lengths = (given != 0).sum(axis=1)
        if not (given.astype(bool) == (np.arange(steps) < lengths[:, None])).all():
            raise InvalidInput(f"input {name}: each row must be ones followed by zeros")
        return lengths
    return np.full(rows, steps, np.int64)


def sequences_from_tensors(
    model: Model, inputs: dict[str, np.ndarray], max_sequences: int
) -> tuple[list[np.ndarray], int]:
    """The request's rows as validated sequences, and the time steps T the rows were sent at."""
    roles = {i.tensor.name: i.role for i in model.info.layout.inputs}
    for name in inputs:
        if name not in roles:
            raise InvalidInput(f"model {model.name} has no input {name}")
        if roles[name] is InputRole.STATE:
            raise InvalidInput(f"input {name} is a state the server fills; do not send it")
        if roles[name] is InputRole.TOKEN_TYPES and inputs[name].any():
            raise InvalidInput(f"input {name}: only token type 0 is supported")
    sequence = model.info.layout.sequence
    name = sequence.tensor.name
    if name not in inputs:
        raise InvalidInput(f"missing input {name}")
    rank = len(sequence.tensor.dims)
    if inputs[name].ndim != rank:
        raise InvalidInput(
            f"input {name}: expected rank {rank}, got shape {list(inputs[name].shape)}"
        )
    tensor = sequence.tensor.to_batch_major(inputs[name])
    rows, steps = tensor.shape[:2]
    if rows == 0 or steps == 0:
        raise InvalidInput(f"input {name}: empty")
    if rows > max_sequences:
        raise InvalidInput(f"too many sequences: {rows} > {max_sequences}")
    lengths = _row_lengths(model, inputs, rows, steps)
    if lengths.min() < 1 or lengths.max() > steps:
        raise InvalidInput(f"row lengths must lie in 1..{steps}")
    return [model.validate(tensor[i, : lengths[i]], i) for i in range(rows)], steps


def stack_outputs(
    model: Model, answers: list[Outputs], names: list[str], steps: int
) -> dict[str, np.ndarray]:
    """Per-sequence outputs back into tensors in the model's own axes; per-step ones
    zero-padded to the T the request was sent at."""
    tensors = {}
    for name in names:
        parts = [a[name] for a in answers]
        tensor = model.info.layout.output(name)
        if tensor.per_step:
            out = np.zeros((len(parts), steps, *parts[0].shape[1:]), parts[0].dtype)
            for row, part in enumerate(parts):
                out[row, : len(part)] = part
        else:
            out = np.stack(parts)
        tensors[name] = tensor.to_model_axes(out)
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
    known = model.info.layout.output_names
    wanted = parsed.outputs or dict.fromkeys(known, parsed.binary_by_default)
    for out in wanted:
        if out not in known:
            raise InvalidInput(f"model {model.name} has no output {out}")
    sequences, steps = sequences_from_tensors(model, parsed.inputs, engine.settings.max_sequences)
    deadline = engine.deadline(request_timeout_ms(request))
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

"""KServe v2 bodies over HTTP: JSON `data` and the binary-tensor extension, decoded into the
`V2Request` both protocols share (`bucketserve.edges.kserve`), and outputs encoded back.

A request body is a JSON header, optionally followed by raw tensor bytes; the header's length
is in `Inference-Header-Content-Length` (a body sent as application/json is JSON whole). An
input with `parameters.binary_data_size` takes its bytes from there, in order. Outputs go back
the same way when asked for as binary.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import orjson

from bucketserve.edges.http.common import parse_json
from bucketserve.edges.http.schemas import InferRequest, InputTensor, validate
from bucketserve.edges.kserve import V2Request, priority, timeout_ms, truncation
from bucketserve.edges.tensors import DATATYPE_OF, WireTensor, little_endian
from bucketserve.errors import InvalidInput, MalformedRequest, quoted


@dataclass(frozen=True)
class Decoded:
    request: V2Request
    binary_outputs: dict[str, bool]  # requested output -> send as binary
    binary_by_default: bool  # for outputs not named


def _wire(spec: InputTensor, binary: memoryview, offset: int) -> tuple[WireTensor, int]:
    """One input tensor as sent (and where the next one's binary bytes start)."""
    size = spec.parameters.binary_data_size if spec.parameters is not None else None
    wire = WireTensor(spec.name, spec.datatype, tuple(spec.shape), values=spec.data)
    if size is None:
        if spec.data is None:
            raise InvalidInput(f"input {spec.name}: needs 'data' or parameters.binary_data_size")
        return wire, offset
    if spec.data is not None:
        raise InvalidInput(f"input {spec.name}: send 'data' or binary_data_size, not both")
    if offset + size > len(binary):
        raise InvalidInput(
            f"input {spec.name}: binary_data_size {size} runs past the end of the body"
        )
    return replace(wire, raw=binary[offset : offset + size]), offset + size


def header_length(value: str | None, body_size: int) -> int | None:
    """`Inference-Header-Content-Length`: ASCII digits, no longer than the body."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or int(value) > body_size:
        raise MalformedRequest("Inference-Header-Content-Length does not fit the body")
    return int(value)


def decode_request(
    body: bytes,
    json_length: int | None,
    model: str,
    version: str | None,
    steps: int = 0,
    values: int | None = None,
) -> Decoded:
    """A v2 request body (JSON, or a JSON header and binary tensors) as a `V2Request`; every
    tensor byte accounted for. `steps`, `values`: what `parse_json` bounds the JSON by."""
    head, binary = body, memoryview(b"")
    if json_length is not None:
        head, binary = body[:json_length], memoryview(body)[json_length:]
    parsed = parse_json(head, steps, values)
    request: InferRequest = validate(InferRequest, parsed, "infer request")
    named = request.model_name  # (KServe's clients repeat the path's model in the body)
    if named and named != model:
        raise InvalidInput(f"model_name {quoted(named)} is not the path's {quoted(model)}")
    if request.model_version and version not in (None, request.model_version):
        raise InvalidInput(
            f"model_version {quoted(request.model_version)} is not the path's {quoted(version)}"
        )
    version = version or request.model_version or None
    inputs = []
    offset = 0
    for spec in request.inputs:
        wire, offset = _wire(spec, binary, offset)
        inputs.append(wire)
    if offset != len(binary):
        raise MalformedRequest(f"{len(binary) - offset} bytes after the binary tensors")
    params = request.parameters
    binary_default = bool(params and params.binary_data_output)
    binary_outputs = {}
    for out in request.outputs or ():
        chosen = out.parameters.binary_data if out.parameters is not None else None
        binary_outputs[out.name] = binary_default if chosen is None else chosen
    given = params.model_dump(exclude_none=True) if params else {}
    names = tuple(binary_outputs) if request.outputs is not None else None
    decoded = V2Request(
        model,
        version,
        tuple(inputs),
        names,
        request.id,
        timeout_ms(given),
        truncation(given),
        priority(given),
    )
    return Decoded(decoded, binary_outputs, binary_default)


def encode_response(
    header: dict[str, Any], tensors: dict[str, np.ndarray], binary: dict[str, bool]
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary tensors follow it."""
    chunks: list[bytes] = []
    described = []
    for name, array in tensors.items():
        entry: dict[str, Any] = {
            "name": name,
            "datatype": DATATYPE_OF[array.dtype],
            "shape": list(array.shape),
        }
        if binary[name]:
            raw = little_endian(array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = np.ascontiguousarray(array).ravel()
        described.append(entry)
    head = orjson.dumps({**header, "outputs": described}, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return head, None
    return head + b"".join(chunks), len(head)

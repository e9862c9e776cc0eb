"""KServe v2 tensors: JSON `data` and the binary-tensor extension, both ways.

A request body is a JSON header, optionally followed by raw tensor bytes; the header's length
is in `Inference-Header-Content-Length`. An input with `parameters.binary_data_size` takes
its bytes from there, in order. Outputs go back the same way when asked for as binary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from serve.errors import InvalidInput, MalformedRequest
from serve.http.common import parse_json
from serve.http.schemas import InferRequest, InputTensor, validate
from serve.v2 import DATATYPE_OF, DATATYPES, fitted


@dataclass(frozen=True)
class Decoded:
    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: dict[str, bool] | None  # requested output -> send as binary; None: all outputs
    binary_by_default: bool
    timeout_ms: float | None  # the request's own deadline, if it gave one (Triton's timeout)


def _tensor(spec: InputTensor, binary: memoryview, offset: int) -> tuple[np.ndarray, int]:
    """One input tensor (and where the next one's binary bytes start)."""
    name, shape = spec.name, spec.shape
    if spec.datatype not in DATATYPES:
        raise InvalidInput(
            f"input {name}: datatype {spec.datatype!r} is not supported "
            f"(use one of {sorted(DATATYPES)})"
        )
    dtype = DATATYPES[spec.datatype]
    expected = math.prod(shape) * dtype.itemsize
    size = spec.parameters.binary_data_size if spec.parameters is not None else None
    if size is not None:
        if spec.data is not None:
            raise MalformedRequest(f"input {name}: send 'data' or binary_data_size, not both")
        if size != expected or offset + size > len(binary):
            raise MalformedRequest(
                f"input {name}: binary_data_size {size} does not match shape "
                f"{shape} of {spec.datatype} ({expected} bytes) or the body"
            )
        raw = binary[offset : offset + size]
        return np.frombuffer(raw, dtype.newbyteorder("<")).reshape(shape), offset + size
    if spec.data is None:
        raise MalformedRequest(f"input {name}: needs 'data' or parameters.binary_data_size")
    try:
        values = np.asarray(spec.data)
    except (ValueError, TypeError):
        raise MalformedRequest(f"input {name}: 'data' is not a rectangular array") from None
    if values.size != math.prod(shape):
        raise MalformedRequest(f"input {name}: {values.size} values for shape {shape}")
    return fitted(values, dtype, name, spec.datatype).reshape(shape), offset


def header_length(value: str | None, body_size: int) -> int | None:
    """`Inference-Header-Content-Length`: ASCII digits, no longer than the body."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or int(value) > body_size:
        raise MalformedRequest("Inference-Header-Content-Length does not fit the body")
    return int(value)


def decode_request(body: bytes, json_length: int | None) -> Decoded:
    """A v2 request body (JSON, or a JSON header and binary tensors) as arrays; every tensor
    byte accounted for."""
    head, binary = body, memoryview(b"")
    if json_length is not None:
        head, binary = body[:json_length], memoryview(body)[json_length:]
    request: InferRequest = validate(InferRequest, parse_json(head), "infer request")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for spec in request.inputs:
        if spec.name in inputs:
            raise MalformedRequest(f"input {spec.name} given twice")
        inputs[spec.name], offset = _tensor(spec, binary, offset)
    if offset != len(binary):
        raise MalformedRequest(f"{len(binary) - offset} bytes after the binary tensors")
    params = request.parameters
    binary_default = bool(params and params.binary_data_output)
    outputs = None
    if request.outputs is not None:
        outputs = {}
        for out in request.outputs:
            chosen = out.parameters.binary_data if out.parameters is not None else None
            outputs[out.name] = binary_default if chosen is None else chosen
    timeout_ms = params.timeout / 1000 if params and params.timeout is not None else None
    return Decoded(request.id, inputs, outputs, binary_default, timeout_ms)


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
            raw = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = np.ascontiguousarray(array).ravel()
        described.append(entry)
    head = orjson.dumps({**header, "outputs": described}, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return head, None
    return head + b"".join(chunks), len(head)

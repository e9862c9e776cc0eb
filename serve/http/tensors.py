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

DATATYPES: dict[str, np.dtype] = {
    name: np.dtype(t)
    for name, t in {
        "BOOL": np.bool_,
        "UINT8": np.uint8,
        "UINT16": np.uint16,
        "UINT32": np.uint32,
        "UINT64": np.uint64,
        "INT8": np.int8,
        "INT16": np.int16,
        "INT32": np.int32,
        "INT64": np.int64,
        "FP16": np.float16,
        "FP32": np.float32,
        "FP64": np.float64,
    }.items()
}
DATATYPE_OF = {dtype: name for name, dtype in DATATYPES.items()}


@dataclass(frozen=True)
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: dict[str, bool] | None  # requested output -> send as binary; None: all outputs
    binary_by_default: bool


def _tensor(spec: Any, binary: memoryview, offset: int) -> tuple[str, np.ndarray, int]:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise MalformedRequest("each input needs a 'name'")
    name = spec["name"]
    shape, datatype = spec.get("shape"), spec.get("datatype")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise MalformedRequest(f"input {name}: 'shape' must be a list of non-negative integers")
    if datatype not in DATATYPES:
        raise InvalidInput(
            f"input {name}: datatype {datatype!r} is not supported (use one of {sorted(DATATYPES)})"
        )
    dtype = DATATYPES[datatype]
    params = spec.get("parameters") or {}
    size = params.get("binary_data_size") if isinstance(params, dict) else None
    if size is not None:
        expected = math.prod(shape) * dtype.itemsize
        if size != expected or offset + size > len(binary):
            raise MalformedRequest(
                f"input {name}: binary_data_size {size} does not match shape "
                f"{shape} of {datatype} ({expected} bytes) or the body"
            )
        array = np.frombuffer(binary[offset : offset + size], dtype.newbyteorder("<")).reshape(
            shape
        )
        return name, array, offset + size
    if "data" not in spec:
        raise MalformedRequest(f"input {name}: needs 'data' or parameters.binary_data_size")
    try:
        values = np.asarray(spec["data"])
    except (ValueError, TypeError):
        raise MalformedRequest(f"input {name}: 'data' is not a rectangular array") from None
    if values.size != math.prod(shape):
        raise MalformedRequest(f"input {name}: {values.size} values for shape {shape}")
    wanted = "b" if dtype.kind == "b" else ("iu" if dtype.kind in "iu" else "iuf")
    if values.size and values.dtype.kind not in wanted:
        raise InvalidInput(f"input {name}: values do not fit datatype {datatype}")
    return name, values.astype(dtype).reshape(shape), offset


def decode_request(body: bytes, header_length: str | None) -> InferRequest:
    if header_length is None:
        head, binary = body, memoryview(b"")
    else:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise MalformedRequest("Inference-Header-Content-Length does not fit the body")
        head, binary = body[: int(header_length)], memoryview(body)[int(header_length) :]
    header = parse_json(head)
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise MalformedRequest("an infer request is a JSON object with an 'inputs' list")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for spec in header["inputs"]:
        name, array, offset = _tensor(spec, binary, offset)
        if name in inputs:
            raise MalformedRequest(f"input {name} given twice")
        inputs[name] = array
    params = header.get("parameters") or {}
    binary_default = (
        bool(params.get("binary_data_output", False)) if isinstance(params, dict) else False
    )
    outputs = None
    if header.get("outputs") is not None:
        if not isinstance(header["outputs"], list):
            raise MalformedRequest("'outputs' must be a list")
        outputs = {}
        for out in header["outputs"]:
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise MalformedRequest("each requested output needs a 'name'")
            out_params = out.get("parameters") or {}
            outputs[out["name"]] = bool(out_params.get("binary_data", binary_default))
    request_id = header.get("id")
    return InferRequest(
        str(request_id) if request_id is not None else None, inputs, outputs, binary_default
    )


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

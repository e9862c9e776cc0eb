"""A `ModelInferRequest` message decoded into the v2 request that HTTP's infer makes too
(`bucketserve.edges.kserve.V2Request`): each input tensor raw or in its typed contents, the
request's parameters with the type each was sent as (its `parameter_choice`), so that the
checks both protocols share see a double where a client sent a double."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bucketserve.edges.kserve import Unsigned, V2Request, priority, timeout_ms, truncation
from bucketserve.edges.tensors import DATATYPES, WireTensor
from bucketserve.errors import InvalidInput, MalformedRequest, quoted

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
    "BYTES": "bytes_contents",
}


def parameter_values(parameters: Mapping[str, Any]) -> dict[str, object]:
    """A map of `InferParameter`s as Python values of the type each was sent as (None for
    one with no value set)."""
    values: dict[str, Any] = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        value: Any = None if choice is None else getattr(parameter, choice)
        values[key] = Unsigned(value) if choice == "uint64_param" else value
    return values


def _no_parameters(what: str, parameters: Mapping[str, Any]) -> None:
    """Tensors take no parameters here (Triton's are for shared memory and classification)."""
    for key in parameters:
        raise MalformedRequest(f"{what}: parameter {quoted(key)} is not supported")


def decode_request(request: Any) -> V2Request:
    """The message's tensors as sent, with every raw byte and typed value accounted for."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(
            f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: send every input "
            "raw, or none"
        )
    inputs = []
    for index, tensor in enumerate(request.inputs):
        name = quoted(tensor.name)
        _no_parameters(f"input {name}", tensor.parameters)
        wire = WireTensor(tensor.name, tensor.datatype, tuple(tensor.shape))
        if raw:
            if tensor.HasField("contents"):
                raise InvalidInput(f"input {name}: both contents and raw_input_contents")
            inputs.append(replace(wire, raw=raw[index]))
            continue
        field = CONTENTS.get(tensor.datatype)
        if field is None and tensor.datatype in DATATYPES:  # (FP16)
            raise InvalidInput(f"input {name}: {tensor.datatype} travels as raw contents only")
        values = getattr(tensor.contents, field) if field is not None else None
        inputs.append(replace(wire, values=values))
    for output in request.outputs:
        _no_parameters(f"output {quoted(output.name)}", output.parameters)
    parameters = parameter_values(request.parameters)
    return V2Request(
        request.model_name,
        request.model_version or None,
        tuple(inputs),
        tuple(out.name for out in request.outputs) or None,
        request.id or None,
        timeout_ms(parameters),
        truncation(parameters),
        priority(parameters),
    )

"""Tensors as the KServe v2 protocols carry them (`WireTensor`: bytes or values, not yet
checked), the datatypes they may have, and the checks that turn one into an array of numbers,
or a BYTES tensor into its texts: the bottom of the v2 path that HTTP and gRPC share
(`bucketserve.edges.kserve`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from bucketserve.core.layout import Tensor
from bucketserve.core.model import nesting
from bucketserve.errors import InvalidInput, MalformedRequest, quoted

Datatype = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16",
    "FP32", "FP64", "BYTES",
]  # fmt: skip
TEXT = "BYTES"  # strings, each as its UTF-8 bytes (Triton's TYPE_STRING)
TEXT_INPUT = "text"  # the input a model with a tokenizer takes texts in


def little_endian(array: np.ndarray) -> bytes:
    """An output tensor's raw bytes as both protocols send them: C order, little-endian."""
    return np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()


LENGTH_PREFIX = 4  # each BYTES element sent raw follows its length, a little-endian uint32
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
assert {*DATATYPES, TEXT} == set(get_args(Datatype))


@dataclass(frozen=True)
class WireTensor:
    """One input tensor as a protocol carried it, not yet checked: its bytes (little-endian,
    row-major) or its values (JSON `data`, gRPC's typed contents)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes | memoryview | None = None
    values: Any = None

    @property
    def wire_bytes(self) -> int:
        if self.raw is not None:
            return len(self.raw)
        if self.datatype == TEXT and isinstance(self.values, Sequence):
            return sum(len(v) for v in self.values if isinstance(v, str | bytes))
        return 8 * max(0, math.prod(self.shape))


def fitted(values: np.ndarray, dtype: np.dtype, name: str, datatype: str) -> np.ndarray:
    """Values sent as numbers (JSON, gRPC's typed contents) converted to `dtype`, or
    InvalidInput when one would change on the way: an integer out of range (INT8 300 would
    wrap to 44), a float that overflows to infinity."""
    if values.size == 0:
        return values.astype(dtype)
    kinds = "b" if dtype.kind == "b" else ("iu" if dtype.kind in "iu" else "iuf")
    if values.dtype.kind not in kinds:
        raise InvalidInput(f"input {name}: values do not fit datatype {datatype}")
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise InvalidInput(
                f"input {name}: values must lie in [{info.min}, {info.max}] for {datatype}"
            )
    with np.errstate(over="ignore"):  # an overflow shows as infinity, refused just below
        converted = values.astype(dtype)
    if dtype.kind == "f" and not np.isfinite(converted).all():
        raise InvalidInput(f"input {name}: values must be finite {datatype} numbers")
    return converted


def _shape_text(shape: Sequence[int]) -> str:
    return str(list(shape)) if len(shape) <= 8 else f"of rank {len(shape)}"


def tensor_array(wire: WireTensor, expected: Tensor | None) -> np.ndarray:
    """The tensor as an array, every check made once for both protocols and before anything
    is reshaped: a datatype we take; a shape of the rank and fixed sizes of the model's input
    (`expected`; None: a rank-1 lengths input); not empty; as many bytes or values as the
    shape holds; values that fit the datatype."""
    name, datatype, shape = quoted(wire.name), wire.datatype, wire.shape
    if datatype == TEXT:
        raise InvalidInput(
            f"input {name}: BYTES is for texts: send them as input {TEXT_INPUT!r}, to a model "
            "with a tokenizer"
        )
    if datatype not in DATATYPES:
        raise InvalidInput(
            f"input {name}: datatype {quoted(datatype, 16)} is not supported "
            f"(use one of {', '.join(DATATYPES)})"
        )
    dims = (None,) if expected is None else expected.dims
    if len(shape) != len(dims) or any(
        s < 0 or d not in (None, s) for s, d in zip(shape, dims, strict=True)
    ):
        wanted = ["n" if d is None else d for d in dims]
        raise InvalidInput(
            f"input {name}: expected a shape like {wanted}, got {_shape_text(shape)}"
        )
    dtype, count = DATATYPES[datatype], math.prod(shape)
    if count == 0:
        raise InvalidInput(f"input {name}: empty (shape {list(shape)})")
    if wire.raw is not None:
        if len(wire.raw) != count * dtype.itemsize:
            raise InvalidInput(
                f"input {name}: {len(wire.raw)} raw bytes for shape {list(shape)} of {datatype} "
                f"({count * dtype.itemsize} bytes)"
            )
        return np.frombuffer(wire.raw, dtype.newbyteorder("<")).reshape(shape)
    given = wire.values
    if nesting(given, len(shape) + 1) > len(shape):  # (before numpy walks millions of lists)
        raise InvalidInput(f"input {name}: 'data' nests deeper than shape {list(shape)}")
    try:
        values = np.asarray(given)
    except (ValueError, TypeError):
        raise InvalidInput(f"input {name}: 'data' is not a rectangular array") from None
    if values.size != count:
        raise InvalidInput(f"input {name}: {values.size} values for shape {list(shape)}")
    return fitted(values, dtype, name, datatype).reshape(shape)


def tensor_texts(wire: WireTensor, widths: tuple[int, ...] = (1,)) -> list[list[str]]:
    """A BYTES tensor of shape [n] or [n, w] (w one of `widths`: 2 for text pairs) as its n
    rows of w texts: JSON strings (flat, or a list a row), gRPC's `bytes_contents`, or raw
    elements each after its length (the binary extension, gRPC's raw contents), every one
    strict UTF-8."""
    name, shape = quoted(wire.name), wire.shape
    if wire.datatype != TEXT:
        raise InvalidInput(
            f"input {name}: texts are sent as BYTES, not {quoted(wire.datatype, 16)}"
        )
    if len(shape) not in (1, 2) or min(shape) < 0 or shape[1:] not in {(), *((w,) for w in widths)}:
        forms = ["[n]", *(f"[n, {w}]" for w in widths)]
        raise InvalidInput(
            f"input {name}: expected a shape like {', '.join(forms[:-1])} or {forms[-1]}, got "
            f"{_shape_text(shape)}"
        )
    if shape[0] == 0:
        raise InvalidInput(f"input {name}: empty (shape {list(shape)})")
    width = shape[1] if len(shape) == 2 else 1
    if wire.raw is not None:
        elements = _length_prefixed(memoryview(wire.raw), name)
    elif isinstance(wire.values, Sequence) and not isinstance(wire.values, str | bytes):
        elements = [e for v in wire.values for e in (v if isinstance(v, list) else [v])]
    else:
        raise InvalidInput(f"input {name}: 'data' must be a list of strings")
    if len(elements) != shape[0] * width:
        raise InvalidInput(f"input {name}: {len(elements)} texts for shape {list(shape)}")
    texts = [_text(element, name, i) for i, element in enumerate(elements)]
    return [texts[i : i + width] for i in range(0, len(texts), width)]


def _length_prefixed(raw: memoryview, name: str) -> list[bytes]:
    elements: list[bytes] = []
    offset = 0
    while offset < len(raw):
        if offset + LENGTH_PREFIX > len(raw):
            raise MalformedRequest(f"input {name}: BYTES element {len(elements)} has no length")
        size = int.from_bytes(raw[offset : offset + LENGTH_PREFIX], "little")
        offset += LENGTH_PREFIX
        if offset + size > len(raw):
            raise MalformedRequest(
                f"input {name}: BYTES element {len(elements)} of {size} bytes runs past the end"
            )
        elements.append(bytes(raw[offset : offset + size]))
        offset += size
    return elements


def _text(element: Any, name: str, index: int) -> str:
    if isinstance(element, str):
        return element
    if not isinstance(element, bytes):
        raise InvalidInput(f"input {name}: element {index} is not a string")
    try:
        return element.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedRequest(f"input {name}: element {index} is not valid UTF-8") from None

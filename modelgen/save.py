"""Save an ONNX model with its weights in one external `.data` file, each tensor 64-byte aligned.

Aligned external weights are what lets `runtime.weights` memory-map them and hand the same pages
to every session of a model.
"""

from __future__ import annotations

from pathlib import Path

import onnx

ALIGN = 64
INLINE_BELOW = 1024  # bytes; tiny tensors (shapes, scalars) stay in the graph


def save_model(model: onnx.ModelProto, onnx_path: Path) -> None:
    """Write `model.onnx` and `model.onnx.data` beside it; `model` holds its weights inline."""
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    data_name = onnx_path.name + ".data"
    offset = 0
    with open(onnx_path.parent / data_name, "wb") as data:
        for tensor in model.graph.initializer:
            raw = tensor.raw_data
            if len(raw) < INLINE_BELOW:
                continue
            gap = -offset % ALIGN
            data.write(b"\0" * gap)
            offset += gap
            data.write(raw)
            del tensor.external_data[:]
            for key, value in (("location", data_name), ("offset", offset), ("length", len(raw))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, str(value)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            tensor.ClearField("raw_data")
            offset += len(raw)
    onnx.save_model(model, str(onnx_path))

"""Weights memory-mapped once and shared by every session of a model.

ONNX Runtime shares a weight between sessions when it is handed in as an OrtValue through
`SessionOptions.add_initializer` and prepacking is off; each session would otherwise copy it.
The OrtValues point into an `np.memmap` of the external `.data` file, so the pages are the
file's, counted once however many sessions use them. Keep this object alive as long as any
session built with it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper


class SharedWeights:
    def __init__(self, onnx_path: Path) -> None:
        proto = onnx.load(str(onnx_path), load_external_data=False)
        self._maps: dict[str, np.memmap] = {}
        self.values: dict[str, ort.OrtValue] = {}
        for tensor in proto.graph.initializer:
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = {e.key: e.value for e in tensor.external_data}
            location = info["location"]
            if location not in self._maps:
                self._maps[location] = np.memmap(
                    onnx_path.parent / location, dtype=np.uint8, mode="r"
                )
            start = int(info.get("offset", 0))
            raw = self._maps[location][start : start + int(info["length"])]
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
            array = raw.view(dtype).reshape(tuple(tensor.dims))
            self.values[tensor.name] = ort.OrtValue.ortvalue_from_numpy(array)

    def add_to(self, options: ort.SessionOptions) -> None:
        for name, value in self.values.items():
            options.add_initializer(name, value)

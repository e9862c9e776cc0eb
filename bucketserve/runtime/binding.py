"""IOBinding over preallocated buffers: MXNet's bind, and MutableModule's rebind on a new shape.

One flat buffer per tensor, sized for the largest shape the binding will serve. A run binds
views of each buffer's start at the exact shape (ONNX Runtime rejects an output bound at a
larger shape than the run produces) and rebinds only when the shape changes.

On a CPU a bound input is read where it lies, so a run writes its feeds into the bound views
and runs. On a GPU binding a host buffer queues its copy to the device there and then: a run
that only rewrote the buffer would compute on the feeds of the run that bound it (seen on an
H100: answers off by 2, which the load-time check refused). There each run binds its inputs
again and waits for their copies, and waits for its outputs' copies back before reading them.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping

import numpy as np
import onnxruntime as ort

from bucketserve.core.layout import Layout


class BufferBinding:
    def __init__(
        self, session: ort.InferenceSession, layout: Layout, shapes: Iterable[tuple[int, int]]
    ) -> None:
        """`shapes` are the (rows, length) pairs this binding must hold; buffers fit the largest."""
        shapes = list(shapes)
        self.session = session
        self.lock = threading.Lock()  # one run at a time: the buffers are reused
        self._binding = session.io_binding()
        self._specs = {tensor.name: tensor for tensor in layout.tensors}
        self._inputs = [i.tensor.name for i in layout.inputs]
        self._buffers = {
            name: np.empty(max(math.prod(spec.shape(*s)) for s in shapes), spec.dtype)
            for name, spec in self._specs.items()
        }
        self._views: dict[str, np.ndarray] = {}
        self._shape: tuple[int, int] | None = None
        self._on_device = session.get_providers()[0] != "CPUExecutionProvider"

    def _view(self, name: str, rows: int, length: int) -> np.ndarray:
        shape = self._specs[name].shape(rows, length)
        return self._buffers[name][: math.prod(shape)].reshape(shape)

    def _rebind(self, rows: int, length: int) -> None:
        self._binding.clear_binding_inputs()
        self._binding.clear_binding_outputs()
        self._views = {name: self._view(name, rows, length) for name in self._specs}
        for name, view in self._views.items():
            bind = self._binding.bind_input if name in self._inputs else self._binding.bind_output
            bind(name, "cpu", 0, view.dtype, list(view.shape), view.ctypes.data)
        self._shape = (rows, length)

    def _bind_inputs(self) -> None:
        """Each input bound again (on a GPU: its copy to the device queued now), then waited
        for."""
        for name in self._inputs:
            view = self._views[name]
            self._binding.bind_input(name, "cpu", 0, view.dtype, list(view.shape), view.ctypes.data)
        self._binding.synchronize_inputs()

    def run(self, feeds: Mapping[str, np.ndarray], rows: int, length: int) -> dict[str, np.ndarray]:
        """Run on `feeds` of shape (rows, length); returns fresh copies of the outputs."""
        if self._shape != (rows, length):
            self._rebind(rows, length)
        for name in self._inputs:
            np.copyto(self._views[name], feeds[name])
        if self._on_device:
            self._bind_inputs()
        self.session.run_with_iobinding(self._binding)
        if self._on_device:
            self._binding.synchronize_outputs()
        return {name: view.copy() for name, view in self._views.items() if name not in self._inputs}


def run_bound(
    session: ort.InferenceSession,
    layout: Layout,
    feeds: Mapping[str, np.ndarray],
    rows: int,
    length: int,
) -> dict[str, np.ndarray]:
    """One run the way serving runs it, into buffers bound at exactly this shape (the check)."""
    return BufferBinding(session, layout, [(rows, length)]).run(feeds, rows, length)

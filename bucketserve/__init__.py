"""bucketserve: length-bucketed inference for variable-length sequence models on ONNX Runtime.

The rooms, in the order a request meets them: `process` (the command, and the server process
that wires every part once and runs the protocols) -> `edges` (HTTP and gRPC: where a request
enters, decoded at the edge) -> `core` (where it is decided: the engine's one call, the
registry of what is served, each model's scheduler with its length-bucket queues, the model's
collate -> run -> split) -> `runtime` (where it runs: ONNX Runtime executors). Beside the
request path: `loading` turns a model repository into ready models (checked, bound, warm), and
`control` loads, replaces and unloads them while serving. `settings`, `metrics`, `tracing`,
`logs` and `errors` are shared by all. Each room's docstring says what it may import; the
import contracts in pyproject.toml hold it.

`load_engine("models")` is the Python entry point: its `model(name).predict(...)` answers.
The names below are imported when first used, so that the command (a container's health probe
among its uses) starts without ONNX Runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from bucketserve.about import VERSION

if TYPE_CHECKING:
    from bucketserve.core.engine import Engine
    from bucketserve.core.model import Model
    from bucketserve.errors import BucketserveError
    from bucketserve.loading import load_engine

__all__ = ["BucketserveError", "Engine", "Model", "load_engine"]
__version__ = VERSION  # pyproject.toml's

_HOMES = {
    "BucketserveError": "bucketserve.errors",
    "Engine": "bucketserve.core.engine",
    "Model": "bucketserve.core.model",
    "load_engine": "bucketserve.loading",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'bucketserve' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)

"""bucketserve: length-bucketed inference for variable-length sequence models on ONNX Runtime.

The rooms, in the order a request meets them: `process` (the command and the server process)
-> `edges` (HTTP and gRPC: where a request enters, decoded at the edge) -> `core` (where it is
decided: the engine, each model's scheduler with its length-bucket queues, the model's collate
-> run -> split) -> `runtime` (where it runs: ONNX Runtime executors). Load time, `loading`,
turns a model repository into ready models (checked, bound, warm) before the first request.
`settings`, `metrics`, `logs` and `errors` are shared by all.

`load_engine("models")` is the Python entry point: its `model(name).predict(...)` answers.
"""

from importlib.metadata import version

from bucketserve.core.engine import Engine
from bucketserve.core.model import Model
from bucketserve.errors import BucketserveError
from bucketserve.loading import load_engine

__all__ = ["BucketserveError", "Engine", "Model", "load_engine"]
__version__ = version("bucketserve")  # pyproject.toml's

"""bucketserve: length-bucketed inference for variable-length sequence models on ONNX Runtime.

Three rooms. Load time, `serve.loading`: a model repository becomes ready models (checked,
bound, warm). The request path, top to bottom: `http` (decode and validate at the edge) ->
`engine` (which model) -> `scheduler` (admission, the length-bucket `queues`, the instances)
-> `model` (collate -> run -> split, with `layout` and `bucketing`) -> `runtime` (ONNX
Runtime executors). The process around them:
`app`, `server`, `cli`, with `settings`, `metrics`, `logs` and `errors` shared by all.

`load_engine("models")` is the Python entry point: its `model(name).predict(...)` answers.
"""

from importlib.metadata import version

from serve.engine import Engine
from serve.errors import BucketserveError
from serve.loading import load_engine
from serve.model import Model

__all__ = ["BucketserveError", "Engine", "Model", "load_engine"]
__version__ = version("bucketserve")  # pyproject.toml's

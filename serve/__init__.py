"""bucketserve: length-bucketed inference for variable-length sequence models on ONNX Runtime.

The flow, top to bottom: HTTP -> admission -> batcher -> collate -> executor -> split -> response.
`Engine` is the Python entry point: it loads a model repository and answers `predict` calls.
"""

from serve.engine import Engine
from serve.errors import BucketserveError
from serve.model import Model

__all__ = ["BucketserveError", "Engine", "Model"]
__version__ = "0.1.0"

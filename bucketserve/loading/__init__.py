"""Load time, apart from the request path: a model repository becomes ready models in a registry.

config (config.toml, validated) -> signature (the graph's tensors as declared) -> axes (which
is the batch, which is time) -> repository (folders, versions, files: a `ModelSpec`; planner
fits bucket edges) -> served_file (what sessions load) -> layouts (layout and rules; probe:
what running the model says of its outputs and shortest length) -> check (what padding and
batching do to its answers) -> pad_safe (an RNN given each row's length, checked again) ->
report (the verdict, said) -> builder (spec -> checked, bound, warm `Model`) -> loader (every
model of the repository into a registry, `open_repository` and `load_engine`; one model again
by name for model control, `Loader`). Imports the core and the runtime below it, never an edge.
"""

from bucketserve.loading.builder import build_model
from bucketserve.loading.loader import Loader, load_engine, open_repository
from bucketserve.loading.repository import ModelSpec, load_model_spec, load_repository

__all__ = [
    "Loader",
    "ModelSpec",
    "build_model",
    "load_engine",
    "load_model_spec",
    "load_repository",
    "open_repository",
]

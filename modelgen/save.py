"""Save an ONNX model with its weights in one external `.data` file, each tensor 64-byte aligned.

Aligned external weights are what lets the server memory-map them and hand the same pages to
every session of a model; the format is the server's (`bucketserve.loading.served_file`), which
writes the same file for models that arrive with their weights inline.
"""

from __future__ import annotations

from bucketserve.loading.served_file import save_with_external_weights as save_model

__all__ = ["save_model"]

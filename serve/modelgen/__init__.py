"""Builders for the bundled models: small graphs written with `onnx.helper`, and the minilm export.

Used by `bucketserve models build` and by tests that need a model of a given shape or size.
"""

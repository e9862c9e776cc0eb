"""ONNX builders, kept out of the served package: the bundled models' small graphs written with
`onnx.helper`, and the minilm export.

Used by `bucketserve models build` (the only place the server's package reaches in here) and by
tests that need a model of a given shape or size.
"""

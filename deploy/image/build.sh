#!/bin/sh
# The image's build stage (Dockerfile), also run outside Docker by deploy/image/smoke.py.
# Run from the build context's root. $1: where to create the build's virtual environment.
# Leaves the wheel in dist/ and the exported minilm ONNX in models/minilm/1/.
set -eu
venv="$1"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
# TORCH_INDEX (optional): an extra index with CPU-only torch wheels, so that the export extra
# does not pull the CUDA build of torch; the Dockerfile sets it.
"$venv/bin/pip" install --quiet ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} '.[export]'
"$venv/bin/bucketserve" models build minilm --models models
"$venv/bin/pip" wheel --quiet --no-deps --wheel-dir dist .

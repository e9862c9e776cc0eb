#!/bin/sh
# The image's runtime install (Dockerfile, runtime stage), also run by deploy/image/smoke.py.
# $1: where to create the server's virtual environment; $2: cpu or gpu; the wheel is in dist/.
# Only the runtime dependencies: no torch, no transformers, no compilers.
set -eu
venv="$1"
variant="${2:-cpu}"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
wheel="$(ls dist/bucketserve-*.whl)"
if [ "$variant" = gpu ]; then
    # CUDA and cuDNN from their pip packages, at the versions onnxruntime-gpu was built with.
    "$venv/bin/pip" install --quiet "$wheel" "onnxruntime-gpu[cuda,cudnn]"
else
    "$venv/bin/pip" install --quiet "$wheel"
fi

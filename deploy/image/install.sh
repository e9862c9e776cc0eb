#!/bin/sh
# The image's runtime install (Dockerfile, runtime stage), also run by deploy/image/smoke.py.
# $1: where to create the server's virtual environment; $2: cpu or gpu; the wheel is in dist/.
# Only the runtime dependencies and the grpc extra (KServe v2 over gRPC: grpcio and protobuf):
# no torch, no transformers, no compilers.
set -eu
venv="$1"
variant="${2:-cpu}"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
wheel="$(ls dist/bucketserve-*.whl)"
if [ "$variant" = gpu ]; then
    # CUDA and cuDNN from their pip packages, at the versions onnxruntime-gpu was built with.
    "$venv/bin/pip" install --quiet "$wheel[grpc]" "onnxruntime-gpu[cuda,cudnn]"
else
    # On linux x86_64 the wheel asks for onnxruntime-gpu, so that a plain pip install can use a
    # GPU. A CPU image takes the CPU-only onnxruntime instead: the same API without the CUDA
    # kernels (about 300 MB). The two cannot be installed together, so the wheel goes in without
    # its dependencies and they follow from its metadata, onnxruntime-gpu renamed.
    "$venv/bin/pip" install --quiet --no-deps "$wheel"
    requirements="$(mktemp)"
    "$venv/bin/python" - > "$requirements" <<'PY'
import importlib.metadata

wanted = set()
for requirement in importlib.metadata.requires("bucketserve") or []:
    spec, _, marker = requirement.partition(";")
    if "extra" not in marker or marker.strip() == 'extra == "grpc"':
        wanted.add(spec.strip().replace("onnxruntime-gpu", "onnxruntime"))
print("\n".join(sorted(wanted)))
PY
    "$venv/bin/pip" install --quiet -r "$requirements"
    rm -f "$requirements"
fi

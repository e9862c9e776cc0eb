# bucketserve image.
#   docker build -t bucketserve .                                  # CPU
#   docker build --build-arg VARIANT=gpu -t bucketserve:gpu .      # CUDA (run with --gpus all)
#   docker run -p 8000:8000 -p 8001:8001 bucketserve               # minilm: HTTP, gRPC
# The build and install steps live in deploy/image/*.sh, which deploy/image/smoke.py also runs
# in fresh virtual environments, so what this file does is tested without a Docker engine.
ARG VARIANT=cpu
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04

# --- build: the export extra (CPU torch, transformers) exports minilm to ONNX; the wheel.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TORCH_INDEX=https://download.pytorch.org/whl/cpu
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bucketserve/ bucketserve/
COPY modelgen/ modelgen/
COPY models/ models/
COPY deploy/image/ deploy/image/
RUN sh deploy/image/build.sh /opt/build-venv

# --- the two runtime bases: Python on Debian, or the CUDA runtime on Ubuntu with its Python.
FROM ${PYTHON_IMAGE} AS base-cpu

FROM ${CUDA_IMAGE} AS base-gpu
# The distribution's own Python, whatever patch release it ships (the project needs >= 3.11).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

# --- runtime: the wheel and its runtime dependencies only, and the model repository.
# hadolint ignore=DL3006
FROM base-${VARIANT} AS runtime
ARG VARIANT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY --from=build /src/dist/ dist/
COPY deploy/image/install.sh deploy/image/install.sh
RUN sh deploy/image/install.sh /opt/venv "$VARIANT" && rm -rf dist deploy
COPY --from=build /src/models/ models/

# --- loadtest: the runtime plus locust and the users (docker-compose's load generator).
FROM runtime AS loadtest
RUN pip install --no-cache-dir "locust==2.47.0"
COPY loadtest/ loadtest/
ENTRYPOINT ["locust", "-f", "loadtest/locustfile.py"]

# --- server (the default target).
FROM runtime AS server
RUN useradd --system --uid 10001 --no-create-home bucketserve
USER 10001
# The user has no home: the server's own copy of each model it serves is written under /tmp
# (in Kubernetes, the pod's writable emptyDir).
ENV BUCKETSERVE_MODELS=/app/models \
    BUCKETSERVE_CACHE_DIR=/tmp/bucketserve-cache \
    BUCKETSERVE_DEFAULT_MODEL=minilm \
    BUCKETSERVE_HOST=0.0.0.0 \
    BUCKETSERVE_PORT=8000 \
    BUCKETSERVE_GRPC_PORT=8001 \
    BUCKETSERVE_LOG_JSON=true
EXPOSE 8000 8001
# Ready means loaded, warm and not draining; the probe is the CLI, so the image needs no curl.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["bucketserve", "probe", "ready"]
# SIGTERM: unready at once, every admitted request answered, then exit 0 (within the drain
# timeout, 30 s by default: give `docker stop` a longer --time).
STOPSIGNAL SIGTERM
CMD ["bucketserve", "serve"]

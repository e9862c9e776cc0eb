"""The ONNX file a model's sessions load: always the server's own copy, so that a file an
operator changes, truncates or replaces in the repository changes nothing that is served (ONNX
Runtime maps external weights from the file: a file that shrinks under a mapping kills the
process, one rewritten in place changes the answers), and so that every export shares its
weights.

Every model's files are copied into a cache the server owns, named by what was copied; a load
reads the repository once, then only its copy. Only session-per-key has several sessions per
model, and sessions share a weight only when it
comes from an external file that `runtime.weights` memory-maps. A weight kept inside
model.onnx (most exporters write them so) is copied by every session that parses it, and a
weight that graph optimisation folds (a Transpose on a Keras kernel) is folded by every
session into a copy of its own. So for session-per-key the model is written out once, into a
cache the server owns: weights held by Constant nodes made initializers, the inputs' unnamed
batch and time dims named (static sessions fix them by name), foldable weights folded by ONNX
Runtime's basic optimizer, and every weight in one aligned `.data` file. The cache is keyed by
the files' content; the user's repository is never written. Other bindings run one session
on the plain copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx
from onnx import numpy_helper

from bucketserve.errors import ConfigError
from bucketserve.loading.repository import ModelSpec
from bucketserve.loading.signature import LARGE_TENSOR, tensor_bytes
from bucketserve.runtime.sessions import GraphFile, write_folded

log = logging.getLogger(__name__)

ALIGN = 64  # bytes: each external weight starts aligned, so its memmap view is too
FORMAT = "1"  # bumped when what the cache holds changes
BATCH_NAME, TIME_NAME = "bucketserve_batch", "bucketserve_time"


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/bucketserve, else ~/.cache/bucketserve (read when a model loads)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "bucketserve"


def save_with_external_weights(model: onnx.ModelProto, onnx_path: Path) -> None:
    """Write `model.onnx` and `model.onnx.data` beside it, every weight of at least 1 KiB in
    the data file at a 64-byte aligned offset; `model` holds its weights inline."""
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    data_name = onnx_path.name + ".data"
    offset = 0
    with open(onnx_path.parent / data_name, "wb") as data:
        for tensor in model.graph.initializer:
            if tensor_bytes(tensor) < LARGE_TENSOR:
                continue
            raw = numpy_helper.to_array(tensor).tobytes()  # whichever field held the data
            gap = -offset % ALIGN
            data.write(b"\0" * gap)
            offset += gap
            data.write(raw)
            tensor.ClearField("raw_data")
            for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                tensor.ClearField(field)
            del tensor.external_data[:]
            for key, value in (("location", data_name), ("offset", offset), ("length", len(raw))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, str(value)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            offset += len(raw)
    onnx.save_model(model, str(onnx_path))


def _anonymous(spec: ModelSpec) -> tuple[bool, bool]:
    """Whether some input's batch axis, and some input's time axis, is a dim without a name."""
    batch = time = False
    for name, axes in spec.axes.inputs.items():
        dims = spec.signature.inputs[name].dims
        batch |= axes.batch is not None and dims[axes.batch] is None
        time |= axes.time is not None and dims[axes.time] is None
    return batch, time


def served_graph(spec: ModelSpec, cache_dir: Path, sessions_per_key: bool) -> GraphFile:
    """What the model's sessions load: the server's copy in `cache_dir` (for session-per-key,
    rewritten to share its weights), the providers, and the names of the inputs' batch and
    time dims."""
    path = private_copy(spec, cache_dir)
    names = spec.axes.batch_names, spec.axes.time_names
    if sessions_per_key:
        copied = moved_to(spec, path)  # (rewritten from the copy: the repository may change)
        path = cached(copied, cache_dir, content_key(copied), _write_copy)
        unnamed = _anonymous(spec)
        names = (
            names[0] + ((BATCH_NAME,) if unnamed[0] else ()),
            names[1] + ((TIME_NAME,) if unnamed[1] else ()),
        )
    options = tuple(
        (provider, tuple((k, str(int(v) if isinstance(v, bool) else v)) for k, v in given.items()))
        for provider, given in spec.config.provider_options.items()
    )
    return GraphFile(path, tuple(spec.config.providers), *names, options)


def cached(
    spec: ModelSpec, cache_dir: Path, key: str, write: Callable[[ModelSpec, Path], None]
) -> Path:
    """The copy of `spec`'s model under `key` in `cache_dir`, written by `write` unless an
    earlier load (or another process) did."""
    folder = cache_dir / key
    target = folder / spec.onnx_path.name
    if target.is_file():
        return target
    with _writing(spec, cache_dir) as scratch:
        write(spec, scratch / spec.onnx_path.name)
        _keep(scratch, folder)
    log.info("model %s: its served copy written once, in %s", spec.name, folder)
    return target


def private_copy(spec: ModelSpec, cache_dir: Path) -> Path:
    """The model's files (the graph and its external weights) copied as they are into
    `cache_dir`, named by the bytes that were copied (hashed from the copy, not the
    repository, which may be changing meanwhile); an earlier identical copy is reused."""
    source = spec.onnx_path.parent
    with _writing(spec, cache_dir) as scratch:
        for path in (spec.onnx_path, *spec.signature.external_files):
            target = scratch / path.relative_to(source)  # (ValueError: outside the folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        copied = moved_to(spec, scratch / spec.onnx_path.name)
        folder = cache_dir / f"{spec.name}-v{spec.version}-{_digest(copied)}"
        _keep(scratch, folder)
    return folder / spec.onnx_path.name


@contextlib.contextmanager
def _writing(spec: ModelSpec, cache_dir: Path) -> Iterator[Path]:
    """A scratch folder in `cache_dir` to write `spec`'s copy in; what stops the writing
    becomes the ConfigError that says how to fix it."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        yield Path(tempfile.mkdtemp(prefix=".writing-", dir=cache_dir))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{cache_dir}: cannot write the server's copy of model {spec.name} ({exc}): set "
            "--cache-dir (BUCKETSERVE_CACHE_DIR) to a writable folder"
        ) from None


def _keep(scratch: Path, folder: Path) -> None:
    """`scratch` as `folder`, whole or not at all: an identical copy there already (this
    load's, or another process's) wins."""
    try:
        scratch.rename(folder)
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)


def moved_to(spec: ModelSpec, onnx_path: Path) -> ModelSpec:
    """`spec` read from a copy of its files whose graph is at `onnx_path`."""
    source = spec.onnx_path.parent
    files = tuple(onnx_path.parent / f.relative_to(source) for f in spec.signature.external_files)
    signature = dataclasses.replace(spec.signature, external_files=files)
    return dataclasses.replace(spec, onnx_path=onnx_path, signature=signature)


def content_key(spec: ModelSpec) -> str:
    """A name for the model's files as they are (a changed file is a new copy)."""
    return f"{spec.name}-{_digest(spec)}"


def _digest(spec: ModelSpec) -> str:
    """What the model's files hold, in 24 hex digits."""
    digest = hashlib.sha256(FORMAT.encode())
    for path in (spec.onnx_path, *spec.signature.external_files):
        with open(path, "rb") as f:
            while chunk := f.read(2**20):
                digest.update(chunk)
    return digest.hexdigest()[:24]


def _write_copy(spec: ModelSpec, onnx_path: Path) -> None:
    model = onnx.load(str(spec.onnx_path))  # external weights, if any, loaded in too
    graph = model.graph
    for node in [n for n in graph.node if n.op_type == "Constant"]:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        if value is not None and tensor_bytes(value) >= LARGE_TENSOR:
            value.name = node.output[0]
            graph.initializer.append(value)
            graph.node.remove(node)
    inputs = {v.name: v for v in graph.input}
    for name, axes in spec.axes.inputs.items():
        dims = inputs[name].type.tensor_type.shape.dim
        if axes.batch is not None:  # (an input without one stays so)
            dims[axes.batch].dim_param = dims[axes.batch].dim_param or BATCH_NAME
        if axes.time is not None:
            dims[axes.time].dim_param = dims[axes.time].dim_param or TIME_NAME
    source, folded = onnx_path.with_name("source.onnx"), onnx_path.with_name("folded.onnx")
    save_with_external_weights(model, source)
    write_folded(source, folded)
    save_with_external_weights(onnx.load(str(folded)), onnx_path)  # ours: aligned offsets
    for stage in (source, folded):
        stage.unlink()
        stage.with_name(stage.name + ".data").unlink(missing_ok=True)

"""Test helpers that run models: a repository's engine, served in-process (the app wired as the
process wires it), a plain ONNX Runtime reference, specs and ONNX files written. They import
ONNX Runtime and load time; `tests.helpers` holds what needs neither."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort

from bucketserve.control import Control
from bucketserve.core.engine import Engine
from bucketserve.edges.http.app import create_app
from bucketserve.jobs.jobs import Jobs
from bucketserve.loading import ModelSpec, load_engine, load_model_spec
from bucketserve.loading.layouts import layout_of
from bucketserve.metrics import Metrics
from bucketserve.process.wiring import api_keys, dispatch, http_options, running
from bucketserve.runtime.sessions import own_pools_allowed, run_all
from bucketserve.settings import Settings
from modelgen.save import save_model
from tests.helpers import copy_bundled


def write_model(root: Path, name: str, model: onnx.ModelProto, config: str) -> Path:
    """A one-model repository entry: `root/name/config.toml` and `root/name/1/model.onnx`."""
    save_model(model, root / name / "1" / "model.onnx")
    (root / name / "config.toml").write_text(config)
    return root / name


class Reference:
    """A plain ONNX Runtime session: each sequence run alone, unpadded."""

    def __init__(self, spec: ModelSpec) -> None:
        # the process-wide pool the engine uses, if it has one (with one thread a batch, none)
        options = ort.SessionOptions()
        options.use_per_session_threads = own_pools_allowed()
        self.session = ort.InferenceSession(
            str(spec.onnx_path), options, providers=["CPUExecutionProvider"]
        )
        self.layout = layout_of(spec, functools.partial(run_all, self.session)).layout
        self.names = self.layout.output_names

    def __call__(self, sequence: np.ndarray) -> dict[str, np.ndarray]:
        feeds = self.layout.collate([sequence], 1, len(sequence))
        outs = dict(zip(self.names, self.session.run(self.names, feeds), strict=True))
        (alone,) = self.layout.split(outs, [len(sequence)])
        return alone


@contextlib.asynccontextmanager
async def serving(
    engine: Engine, control: Control | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """The app around `engine` (and `control`), wired and running as the process runs them
    (the API keys and HTTP's options from the engine's settings, its tracing; bulk jobs where
    its settings name a jobs directory, their lines sent by the process's dispatch), and a
    client talking to it in-process."""
    settings = engine.settings
    control = control or Control(engine, None)
    keys = api_keys(settings)
    metrics = Metrics(keys.tenants | set(settings.weights()))
    options = http_options(settings, engine.tracing)
    bulk = dispatch(engine, options, keys, metrics)
    jobs = (
        None
        if settings.jobs_dir is None
        else Jobs(settings.jobs_dir, engine, metrics, settings, bulk)
    )
    app = create_app(engine, control, metrics, keys, options, jobs=jobs)
    async with running(engine, control, metrics, jobs):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


def make_engine(root: Path, *names: str, **settings: Any) -> Engine:
    """An engine over copies of bundled models, with settings overridden as given."""
    for name in names:
        copy_bundled(root, name)
    return load_engine(Settings(models=root, **settings))


def spec_of(root: Path, name: str) -> ModelSpec:
    """The spec of a model in a test repository (what `Reference` runs)."""
    spec = load_model_spec(root / name)
    assert spec is not None
    return spec

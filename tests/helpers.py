"""Shared test helpers: model repositories in temporary folders, references, random inputs."""

from __future__ import annotations

import contextlib
import functools
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort

from bucketserve.control import Control
from bucketserve.core.engine import Engine
from bucketserve.edges.auth import ApiKeys
from bucketserve.edges.http.app import create_app
from bucketserve.loading import ModelSpec, load_engine, load_model_spec
from bucketserve.loading.layouts import layout_of
from bucketserve.metrics import Metrics
from bucketserve.process.wiring import running
from bucketserve.runtime.sessions import own_pools_allowed, run_all
from bucketserve.settings import Settings
from loadtest.process import running_server
from modelgen.save import save_model

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"


def write_model(root: Path, name: str, model: onnx.ModelProto, config: str) -> Path:
    """A one-model repository entry: `root/name/config.toml` and `root/name/1/model.onnx`."""
    save_model(model, root / name / "1" / "model.onnx")
    (root / name / "config.toml").write_text(config)
    return root / name


def copy_bundled(root: Path, name: str, config: str | None = None) -> Path:
    """A copy of a bundled model, optionally with another config."""
    target = root / name
    shutil.copytree(MODELS / name, target)
    if config is not None:
        (target / "config.toml").write_text(config)
    return target


def lengths_over_buckets(edges: list[int], count: int, seed: int = 0) -> list[int]:
    """`count` lengths spread evenly over the buckets, uniform inside each bucket."""
    rng = np.random.default_rng(seed)
    lows = [1, *[e + 1 for e in edges[:-1]]]
    return [
        int(rng.integers(lows[i % len(edges)], edges[i % len(edges)] + 1)) for i in range(count)
    ]


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


ENCODER_CONFIG = """
binding = "{binding}"
mode = "{mode}"
[inputs.input_ids]
role = "tokens"
vocab_size = {vocab}
[inputs.attention_mask]
role = "mask"
[inputs.token_type_ids]
role = "token_types"
[outputs.last_hidden_state]
per_step = true
[outputs.sentence_embedding]
[batching]
buckets = {buckets}
max_batch_size = {max_batch_size}
max_batch_tokens = {max_batch_tokens}
"""


@contextlib.asynccontextmanager
async def serving(
    engine: Engine, control: Control | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """The app around `engine` (and `control`), wired and running as the process runs them
    (the API keys from the engine's settings), and a client talking to it in-process."""
    settings = engine.settings
    control = control or Control(engine, None)
    keys = ApiKeys(
        settings.api_keys(), settings.open_metrics, settings.docs, settings.tenant_header
    )
    metrics = Metrics(keys.tenants | set(settings.weights()))
    app = create_app(engine, control, metrics, keys)
    async with running(engine, control, metrics):
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


def padded(sequences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token id rows padded with 0 to the longest, and their 0/1 mask."""
    longest = max(len(s) for s in sequences)
    ids = np.zeros((len(sequences), longest), np.int64)
    mask = np.zeros_like(ids)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return ids, mask


@contextlib.contextmanager
def server_process(
    models: Path, *flags: str
) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """`bucketserve serve` in its own process, as a user runs it (the result cache at its
    default), logging JSON lines beside `models`."""
    log_path = models.parent / "server.log"
    env = {"BUCKETSERVE_LOG_JSON": "1"}
    with running_server(models, *flags, log_path=log_path, env=env, result_cache=True) as (
        process,
        url,
    ):
        yield process, url, log_path


def error_of(answer: httpx.Response | dict[str, Any]) -> tuple[str, str]:
    """(code, message) of an error answer, in whichever form its route answers errors: KServe
    v2's (`{"error": message, "code": code}`) or the one error form (OpenAI's adds to it)."""
    body = answer.json() if isinstance(answer, httpx.Response) else answer
    error = body["error"]
    if isinstance(error, str):
        return body["code"], error
    return error["code"], error["message"]


def until(condition: Callable[[], bool], what: str, within_s: float = 120) -> None:
    """Wait (polling, in a thread of the test's own) until `condition` holds: for what the
    test needs to have happened, never for how fast; `within_s` only bounds a hang."""
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)

"""Shared test helpers: model repositories in temporary folders, references, random inputs."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from serve.bucketing import Layout
from serve.modelgen.save import save_model
from serve.repository import ModelSpec

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
        options = ort.SessionOptions()
        options.use_per_session_threads = False  # the engine made a process-wide pool
        self.session = ort.InferenceSession(
            str(spec.onnx_path), options, providers=["CPUExecutionProvider"]
        )
        self.layout = Layout.from_spec(spec)
        self.names = list(spec.config.outputs)

    def __call__(self, sequence: np.ndarray) -> dict[str, np.ndarray]:
        feeds = self.layout.collate([sequence], 1, len(sequence))
        outs = self.session.run(self.names, feeds)
        return {n: o[0] for n, o in zip(self.names, outs, strict=True)}


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

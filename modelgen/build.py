"""`bucketserve models build NAME`: make a bundled model's files in its version folder.

The recipes import what they build with when they run: the command reads their names on every
start (a container's health probe among its uses), which need not import ONNX."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def _tiny_encoder(version_dir: Path) -> None:
    from modelgen import graphs
    from modelgen.save import save_model

    save_model(graphs.encoder(), version_dir / "model.onnx")


def _tiny_lstm(version_dir: Path) -> None:
    from modelgen import graphs
    from modelgen.save import save_model

    save_model(graphs.lstm_tagger(), version_dir / "model.onnx")


def _minilm(version_dir: Path) -> None:
    from modelgen.minilm import build_minilm  # needs the `export` extra

    build_minilm(version_dir)


RECIPES: dict[str, Callable[[Path], None]] = {
    "tiny-encoder": _tiny_encoder,
    "tiny-lstm": _tiny_lstm,
    "minilm": _minilm,
}


def build(name: str, models_dir: Path, version: int = 1) -> Path:
    """Run the recipe for `name`; returns the version folder it wrote."""
    version_dir = models_dir / name / str(version)
    RECIPES[name](version_dir)
    return version_dir

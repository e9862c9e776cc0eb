"""A model version's fingerprint: the same for the same content (after a restart, on a copy
of the repository elsewhere, whatever only changes how it is served), different after each
kind of change that changes answers (weights, tokenizer, pooling, a prompt, truncation); and
shown where a user who keeps answers looks: each inference answer's X-Model-Fingerprint,
/v1/models, KServe v2 metadata, TEI's /info."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

from bucketserve.loading import load_engine
from bucketserve.loading.fingerprint import fingerprint_of
from bucketserve.loading.repository import load_model_spec
from bucketserve.settings import Settings
from tests.engines import serving
from tests.task_exports import TaskRepository as Repository


@pytest.fixture
def entry(task_repository: Repository, tmp_path: Path) -> Path:
    """A copy of the embedder's entry (graph, tokenizer, config with pooling and prompts)."""
    copied = tmp_path / "models" / "embedder"
    shutil.copytree(task_repository.models / "embedder", copied)
    return copied


def fingerprint(entry: Path) -> str:
    spec = load_model_spec(entry)
    assert spec is not None
    return fingerprint_of(spec)


def edit_config(old: str, new: str) -> Callable[[Path], None]:
    def edit(entry: Path) -> None:
        config = entry / "config.toml"
        text = config.read_text()
        assert old in text, text
        config.write_text(text.replace(old, new, 1))

    return edit


def new_weights(entry: Path) -> None:
    """One weight of the graph moved by a little."""
    path = entry / "1" / "model.onnx"
    graph = onnx.load(str(path))
    init = next(i for i in graph.graph.initializer if numpy_helper.to_array(i).size > 100)
    changed = numpy_helper.to_array(init).copy()
    changed.flat[0] += 1e-3
    init.CopyFrom(numpy_helper.from_array(changed, init.name))
    onnx.save(graph, str(path))


def new_tokenizer(entry: Path) -> None:
    """The tokenizer lower-cases no more."""
    path = entry / "1" / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    tokenizer["normalizer"] = None
    path.write_text(json.dumps(tokenizer))


CHANGES = {
    "weights": new_weights,
    "tokenizer": new_tokenizer,
    "pooling": edit_config('pooling = "mean"', 'pooling = "cls"'),
    "prompt": edit_config('"query" = "query: "', '"query" = "search_query: "'),
    "truncation": edit_config("max_length = 64", "max_length = 32"),
}


V2_TEXT = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}


@pytest.mark.parametrize("change", list(CHANGES))
def test_each_change_to_what_answers_changes_it(entry: Path, change: str) -> None:
    before = fingerprint(entry)
    CHANGES[change](entry)
    assert fingerprint(entry) != before


def test_the_same_content_keeps_it(entry: Path, tmp_path: Path) -> None:
    """Read again, copied elsewhere, or served otherwise (batch size, bucket edges, aliases,
    files beside the graph that the model does not read): the same fingerprint."""
    first = fingerprint(entry)
    assert first.startswith("sha256:")
    assert len(first) == len("sha256:") + 64
    assert fingerprint(entry) == first
    elsewhere = tmp_path / "elsewhere" / "another-name"
    shutil.copytree(entry, elsewhere)
    assert fingerprint(elsewhere) == first
    edit_config("max_batch_size = 16", "max_batch_size = 3")(entry)
    edit_config("buckets = [16, 24, 32, 40, 48, 56, 64]", "buckets = [32, 64]")(entry)
    (entry / "config.toml").write_text('aliases = ["e5"]\n' + (entry / "config.toml").read_text())
    (entry / "1" / ".DS_Store").write_bytes(b"\0")
    (entry / "1" / "README.md").write_text("notes on the export")
    (entry / "1" / "old").mkdir()
    shutil.copyfile(entry / "1" / "model.onnx", entry / "1" / "old" / "model.onnx")
    assert fingerprint(entry) == first


async def test_it_is_shown_where_answers_are_kept(entry: Path) -> None:
    engine = load_engine(Settings(models=entry.parent))
    want = fingerprint(entry)
    async with serving(engine) as client:
        answers = [
            await client.post("/v1/embeddings", json={"model": "embedder", "input": "a"}),
            await client.post("/embed", json={"inputs": "a"}),
            await client.post("/predict", json={"text": ["a"]}),
            await client.post("/v2/models/embedder/infer", json=V2_TEXT),
        ]
        listed = (await client.get("/v1/models")).json()["data"][0]
        metadata = (await client.get("/v2/models/embedder")).json()
        info = (await client.get("/info")).json()
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-Model-Fingerprint"] == want
    assert listed["fingerprint"] == metadata["fingerprint"] == info["model_sha"] == want
    # (and again after a restart: the same content, the same fingerprint)
    again = load_engine(Settings(models=entry.parent))
    assert again.registry.resolve("embedder").info.fingerprint == want

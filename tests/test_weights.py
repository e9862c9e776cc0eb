"""Weights shared for every export: session-per-key's sessions share one memory map of the
weights whether the export kept them inside model.onnx, in a .data file, or behind a
Transpose that graph optimisation folds. Measured per extra bound key, in a process of
its own (its private memory: what other processes map beside it moves its Pss, not what a key
costs it); and the copy that makes it so is written once, into the server's cache only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import onnx
import pytest

from bucketserve.errors import ConfigError
from bucketserve.loading import build_model
from modelgen import graphs, zoo
from modelgen.save import save_model
from tests.engines import spec_of
from tests.helpers import ENCODER_CONFIG, ROOT
from tests.zoo import add_to

needs_pss = pytest.mark.skipif(
    not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux Pss"
)
KEYS = "[4, 8, 12, 16, 20, 24, 28, 32]"  # 8 keys, each a static session of its own


def per_key_pss(root: Path, name: str, model: onnx.ModelProto, inline: bool, config: str) -> Any:
    """Memory figures of a process that binds every key of `model` under session-per-key."""
    (zoo.save_inline if inline else save_model)(model, root / name / "1" / "model.onnx")
    (root / name / "config.toml").write_text(config)
    result = subprocess.run(
        [sys.executable, "-m", "tests.pss_probe", str(root / name), "session-per-key"],
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(root.parent / "cache")},
        capture_output=True,
        text=True,
        check=True,
    )
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["bound_keys"] == figures["sessions"] == 8
    figures["per_key"] = (figures["private_all_keys"] - figures["private_one_key"]) / 7
    return figures


def encoder_config(vocab: int) -> str:
    return ENCODER_CONFIG.format(
        binding="session-per-key",
        mode="bucketing",
        vocab=vocab,
        buckets=KEYS,
        max_batch_size=2,
        max_batch_tokens=64,
    )


@pytest.mark.slow
@needs_pss
def test_inline_weights_cost_no_more_per_key_than_external_ones(tmp_models: Path) -> None:
    """A 44 MB encoder, once with its weights inside model.onnx and once beside it."""

    def encoder() -> onnx.ModelProto:
        return graphs.encoder(vocab=4000, dim=512, heads=8, layers=3, ffn=2048, max_positions=64)

    external = per_key_pss(tmp_models, "external", encoder(), False, encoder_config(4000))
    inline = per_key_pss(tmp_models, "inline", encoder(), True, encoder_config(4000))

    weights = inline["weight_bytes"]
    assert weights > 40 * 2**20
    assert abs(weights - external["weight_bytes"]) < 2**20  # the same model, stored two ways
    # A copy of the weights per key would be ~100% of them; a session costs ~1 MiB of its own.
    assert external["per_key"] < 0.05 * weights, external
    assert inline["per_key"] < 0.05 * weights, inline
    assert inline["per_key"] <= max(external["per_key"], 0) + 2**20, (inline, external)


@pytest.mark.slow
@needs_pss
def test_weights_that_graph_optimisation_folds_are_folded_once(tmp_models: Path) -> None:
    """Keras-style kernels stored [out, in] and transposed in the graph: each session would
    fold them into a weight of its own (measured: +25 MiB per key on this 32 MiB model)."""
    config = (
        '[inputs.ids]\nrole = "tokens"\nvocab_size = 4000\n[outputs.states]\n'
        f"[batching]\nbuckets = {KEYS}\nmax_batch_size = 2\nmax_batch_tokens = 64\n"
    )
    figures = per_key_pss(tmp_models, "keras", zoo.transposed_kernels(), False, config)
    assert figures["weight_bytes"] > 30 * 2**20
    assert figures["per_key"] < 0.05 * figures["weight_bytes"], figures


def repository_files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_the_copy_is_written_once_and_only_into_the_cache(tmp_models: Path, tmp_path: Path) -> None:
    folder = add_to(tmp_models, "keras-bilstm")  # weights inline
    before = repository_files(folder)
    spec, cache = spec_of(tmp_models, "keras-bilstm"), tmp_path / "cache"

    first = build_model(spec, "session-per-key", cache).executor.graph.path  # type: ignore[attr-defined]
    written = first.stat().st_mtime_ns
    again = build_model(spec, "session-per-key", cache).executor.graph.path  # type: ignore[attr-defined]

    assert first.is_relative_to(cache)
    assert first.with_name("model.onnx.data").stat().st_size > 100_000  # the weights, outside
    assert again == first
    assert again.stat().st_mtime_ns == written  # read, not written again
    assert repository_files(folder) == before  # the user's repository untouched
    # One session per model loads the server's plain copy (named by content, made once,
    # from which the rewritten one was made): never the user's file, which may change
    shared = build_model(spec, "shared-session", cache).executor.graph.path  # type: ignore[attr-defined]
    assert shared.is_relative_to(cache)
    assert shared.read_bytes() == spec.onnx_path.read_bytes()
    names = sorted(p.name for p in cache.iterdir())
    assert names == sorted([first.parent.name, shared.parent.name])  # no scratch left behind


def test_a_cache_that_cannot_be_written_says_how_to_fix_it(
    tmp_models: Path, tmp_path: Path
) -> None:
    add_to(tmp_models, "keras-bilstm")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match=r"cannot write the server.s copy of model .*--cache-dir"):
        build_model(
            spec_of(tmp_models, "keras-bilstm"), "session-per-key", tmp_path / "a-file" / "c"
        )


def test_unnamed_batch_and_time_dims_are_named_for_static_sessions(
    tmp_models: Path, tmp_path: Path
) -> None:
    """Static sessions fix dims by name: the cached copy names the ones an export left
    anonymous, so every key's session really is static."""
    model = graphs.lstm_tagger()
    for value in model.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.Clear()  # features [?, ?, 16], lengths [?], h0 and c0 [1, ?, 32]
    save_model(model, tmp_models / "lstm" / "1" / "model.onnx")
    config = (ROOT / "models" / "tiny-lstm" / "config.toml").read_text()
    (tmp_models / "lstm" / "config.toml").write_text(config.replace('build = "tiny-lstm"', ""))
    built = build_model(spec_of(tmp_models, "lstm"), "session-per-key", tmp_path / "cache")

    key = built.plan.key_for(10)
    built.predict([[[0.5] * 16] * 10])
    sessions = built.executor.sessions  # type: ignore[attr-defined]
    assert len(sessions) == 2  # the default key's, and this key's
    shapes = [{i.name: i.shape for i in s.get_inputs()} for s in sessions]
    assert {
        "features": [key.rows, key.length, 16],
        "lengths": [key.rows],
        "h0": [1, key.rows, 32],
        "c0": [1, key.rows, 32],
    } in shapes
    assert all(isinstance(d, int) for s in shapes for dims in s.values() for d in dims)

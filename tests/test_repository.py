"""Partial repositories: by default a model that fails to load stops the server, with a message
naming the file, the field and the fix; with `allow_partial` the others are served and the
failed one is reported not ready, with its error, on its own routes and in the metrics."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from bucketserve.errors import ConfigError
from bucketserve.loading import load_engine
from bucketserve.settings import Settings
from modelgen.save import save_model
from tests.engines import serving
from tests.helpers import MODELS, copy_bundled, error_of


def unknown_op() -> onnx.ModelProto:
    """A graph ONNX Runtime refuses: an operator it does not have."""
    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["ids"], ["out"], domain="example.custom")],
        "unknown_op",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)],
    )
    model.ir_version = 9
    return model


@pytest.fixture
def repository(tmp_models: Path) -> Path:
    """tiny-encoder (good), a config with a bad field, and a graph ONNX Runtime refuses."""
    copy_bundled(tmp_models, "tiny-encoder")
    shutil.copytree(MODELS / "tiny-encoder", tmp_models / "bad-field")
    config = (MODELS / "tiny-encoder" / "config.toml").read_text()
    (tmp_models / "bad-field" / "config.toml").write_text(
        config.replace("max_batch_size = 32", "max_batch_size = 0")
    )
    save_model(unknown_op(), tmp_models / "bad-graph" / "1" / "model.onnx")
    (tmp_models / "bad-graph" / "config.toml").write_text(
        '[inputs.ids]\nrole = "tokens"\nvocab_size = 10\n[outputs.out]\n[batching]\nbuckets = [8]\n'
    )
    (tmp_models / "repository.toml").write_text('default_model = "tiny-encoder"\n')
    return tmp_models


def test_by_default_a_bad_field_stops_the_load_naming_file_field_and_fix(repository: Path) -> None:
    with pytest.raises(ConfigError) as error:
        load_engine(Settings(models=repository))
    message = str(error.value)
    assert str(repository / "bad-field" / "config.toml") in message
    assert "batching.max_batch_size:" in message
    assert "start with --allow-partial" in message


def test_by_default_a_graph_onnx_runtime_refuses_stops_the_load(repository: Path) -> None:
    config = (repository / "bad-field" / "config.toml").read_text()
    (repository / "bad-field" / "config.toml").write_text(
        config.replace("max_batch_size = 0", "max_batch_size = 32")
    )
    with pytest.raises(ConfigError) as error:
        load_engine(Settings(models=repository))
    message = str(error.value)
    assert str(repository / "bad-graph" / "1" / "model.onnx") in message
    assert "ONNX Runtime could not load or run the model" in message
    assert "Frobnicate" in message


def test_every_model_that_fails_is_named_in_one_start(repository: Path) -> None:
    """A bad field and a graph ONNX Runtime refuses: one error names both (and the good model
    was built, not skipped), so one restart is enough to see all that must be fixed."""
    with pytest.raises(ConfigError) as error:
        load_engine(Settings(models=repository))
    message = str(error.value)
    assert message.startswith("2 models did not load: bad-field: ")
    assert "batching.max_batch_size:" in message
    assert "; bad-graph: " in message
    assert "Frobnicate" in message
    assert message.endswith("(to serve the other models meanwhile, start with --allow-partial)")


async def test_a_partial_repository_serves_the_rest_and_says_what_failed(
    repository: Path,
) -> None:
    engine = load_engine(Settings(models=repository, allow_partial=True))
    assert list(engine.registry.models) == ["tiny-encoder"]
    assert set(engine.registry.failed) == {"bad-field", "bad-graph"}

    async with serving(engine) as client:
        assert (await client.get("/v2/health/ready")).status_code == 200  # it serves the rest
        assert (await client.get("/v2/models/tiny-encoder/ready")).status_code == 200
        assert (await client.post("/predict", json={"sequences": [[5, 9]]})).status_code == 200

        ready = await client.get("/v2/models/bad-field/ready")
        config = await client.get("/v2/models/bad-field/config")
        metadata = await client.get("/v2/models/bad-graph")
        predict = await client.post("/predict", json={"model": "bad-graph", "sequences": [[1]]})
        infer = await client.post(
            "/v2/models/bad-graph/infer",
            json={"inputs": [{"name": "ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}]},
        )
        index = (await client.post("/v2/repository/index")).json()
        metrics = (await client.get("/metrics")).text

    assert ready.status_code == 503
    assert ready.json()["ready"] is False
    assert "batching.max_batch_size" in ready.json()["error"]
    assert config.status_code == 200
    assert config.json()["error"] == engine.registry.failed["bad-field"]
    for response in (metadata, predict, infer):
        assert response.status_code == 503
        assert error_of(response)[0] == "model_not_ready"
        assert "Frobnicate" in error_of(response)[1]
    assert [(m["name"], m["state"]) for m in index] == [
        ("bad-field", "UNAVAILABLE"),
        ("bad-graph", "UNAVAILABLE"),
        ("tiny-encoder", "READY"),
    ]
    assert 'bucketserve_model_load_failed{model="bad-graph"} 1.0' in metrics
    assert 'bucketserve_model_load_failed{model="tiny-encoder"}' not in metrics


def test_a_partial_repository_with_nothing_that_loads_stops(repository: Path) -> None:
    shutil.rmtree(repository / "tiny-encoder")
    (repository / "repository.toml").unlink()
    with pytest.raises(ConfigError, match="no model loaded"):
        load_engine(Settings(models=repository, allow_partial=True))


async def test_a_model_not_built_yet_says_how_to_build_it(tmp_models: Path) -> None:
    """minilm is built on demand: asked for before that, it is a 404 that names the command,
    and the index lists it as not built."""
    copy_bundled(tmp_models, "tiny-encoder")
    (tmp_models / "minilm").mkdir()
    shutil.copy(MODELS / "minilm" / "config.toml", tmp_models / "minilm" / "config.toml")
    engine = load_engine(Settings(models=tmp_models, default_model="tiny-encoder"))
    async with serving(engine) as client:
        asked = await client.post("/predict", json={"model": "minilm", "text": ["a text"]})
        index = (await client.post("/v2/repository/index")).json()
    assert asked.status_code == 404
    assert "`bucketserve models build minilm`" in error_of(asked)[1]
    assert {"name": "minilm", "state": "UNAVAILABLE"}.items() <= index[0].items()
    assert "not built" in index[0]["reason"]

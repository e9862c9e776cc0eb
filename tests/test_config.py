"""Bad configs and missing files fail at start with a message naming the file and the field."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from bucketserve.errors import ConfigError
from bucketserve.loading import load_model_spec, load_repository
from bucketserve.loading.repository import load_model_specs
from bucketserve.settings import Settings
from tests.helpers import MODELS, copy_bundled

GOOD = (MODELS / "tiny-encoder" / "config.toml").read_text()


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        (
            ("max_batch_size = 32", "max_batch_size = 0"),
            "batching.max_batch_size",
            "greater than 0",
        ),
        (("buckets = [8, 16,", "buckets = [16, 8,"), "batching.buckets", "strictly increasing"),
        (("buckets = [8,", "buckets = [-8,"), "batching.buckets", "positive"),
        (("max_batch_tokens = 4096", "max_batch_tokens = 100"), "batching", "longest bucket"),
        (('mode = "bucketing"', 'mode = "fast"'), "mode", "bucketing"),
        (('binding = "shared-session"', 'binding = "per-key"'), "binding", "session-per-key"),
        (('role = "mask"', 'role = "maskk"'), "inputs.attention_mask.role", "mask"),
        (("vocab_size = 2000\n", ""), "inputs.input_ids", "vocab_size"),
        (('role = "tokens"', 'role = "state"'), "(top level)", "exactly one input"),
        (
            (
                '[inputs.token_type_ids]\nrole = "token_types"',
                '[inputs.token_type_ids]\nrole = "row_lengths"',
            ),
            "(top level)",
            "the server's own",
        ),
        (("[batching]", "colour = 'red'\n[batching]"), "colour", "Extra inputs"),
        (('output = "sentence_embedding"', 'output = "pooled"'), "(top level)", "not one of"),
        (("normalize = true", "normalize = true\ndimensions = []"), "embedding.dimensions", "one"),
        (('pooling = "none"', 'pooling = "median"'), "embedding.pooling", "mean"),
        (
            ("queue_capacity = 2048", "queue_capacity = 'lots'"),
            "batching.queue_capacity",
            "integer",
        ),
    ],
)
def test_bad_field_names_file_and_field(
    tmp_models: Path, change: tuple[str, str], field: str, says: str
) -> None:
    assert change[0] in GOOD
    model_dir = copy_bundled(tmp_models, "tiny-encoder", GOOD.replace(*change, 1))
    with pytest.raises(ConfigError) as error:
        load_model_spec(model_dir)
    message = str(error.value)
    assert str(model_dir / "config.toml") in message
    assert f"{field}:" in message
    assert says in message


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("[inputs.token_type_ids]", "[inputs.segment_ids]"), "inputs.segment_ids"),
        (("[outputs.sentence_embedding]", "[outputs.pooled]"), "outputs.pooled"),
        (
            (
                "[outputs.sentence_embedding]\nper_step = false",
                "[outputs.sentence_embedding]\nper_step = true",
            ),
            "outputs.sentence_embedding",
        ),
        (
            (
                '[inputs.token_type_ids]\nrole = "token_types"',
                '[inputs.token_type_ids]\nrole = "lengths"',
            ),
            "inputs.token_type_ids",
        ),
    ],
)
def test_config_that_disagrees_with_the_graph(
    tmp_models: Path, change: tuple[str, str], field: str
) -> None:
    assert change[0] in GOOD
    # (the embedding made of the per-token states: an output every case keeps)
    config = GOOD.replace('output = "sentence_embedding"', 'output = "last_hidden_state"')
    model_dir = copy_bundled(tmp_models, "tiny-encoder", config.replace(*change, 1))
    with pytest.raises(ConfigError) as error:
        load_model_spec(model_dir)
    assert str(model_dir / "1" / "model.onnx") in str(error.value)
    assert f"{field}:" in str(error.value)


def test_graph_input_without_a_role(tmp_models: Path) -> None:
    config = GOOD.replace('[inputs.attention_mask]\nrole = "mask"\n', "")
    model_dir = copy_bundled(tmp_models, "tiny-encoder", config)
    with pytest.raises(ConfigError, match="inputs: graph input 'attention_mask' has no role"):
        load_model_spec(model_dir)


def test_not_toml(tmp_models: Path) -> None:
    model_dir = copy_bundled(tmp_models, "tiny-encoder", "mode = [unclosed")
    with pytest.raises(ConfigError, match=r"config\.toml: not valid TOML"):
        load_model_spec(model_dir)


def test_missing_model_file(tmp_models: Path) -> None:
    model_dir = copy_bundled(tmp_models, "tiny-encoder")
    (model_dir / "1" / "model.onnx").unlink()
    with pytest.raises(ConfigError, match=r"1/model\.onnx: file not found"):
        load_model_spec(model_dir)


def test_missing_weights_file(tmp_models: Path) -> None:
    model_dir = copy_bundled(tmp_models, "tiny-encoder")
    (model_dir / "1" / "model.onnx.data").unlink()
    with pytest.raises(
        ConfigError, match=r"model\.onnx: external data: weights file model\.onnx\.data is missing"
    ):
        load_model_spec(model_dir)


def test_corrupt_model_file(tmp_models: Path) -> None:
    model_dir = copy_bundled(tmp_models, "tiny-encoder")
    (model_dir / "1" / "model.onnx").write_bytes(b"not a protobuf at all")
    with pytest.raises(ConfigError, match=r"model\.onnx: not a readable ONNX model"):
        load_model_spec(model_dir)


def test_missing_version_folder(tmp_models: Path) -> None:
    model_dir = copy_bundled(
        tmp_models, "tiny-encoder", GOOD.replace('build = "tiny-encoder"\n', "")
    )
    shutil.rmtree(model_dir / "1")
    with pytest.raises(ConfigError, match="no version folder"):
        load_model_spec(model_dir)


def test_pinned_version_that_does_not_exist(tmp_models: Path) -> None:
    model_dir = copy_bundled(tmp_models, "tiny-encoder", "version = 3\n" + GOOD)
    with pytest.raises(ConfigError, match=r"config\.toml: version: no version folder \[3\]"):
        load_model_spec(model_dir)


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        ("[version_policy]\nlatest = 2", [2, 3]),
        ("[version_policy]\nall = true", [1, 2, 3]),
        ("[version_policy]\nspecific = [3, 1]", [1, 3]),
        ("", [3]),
    ],
)
def test_version_policy(tmp_models: Path, policy: str, served: list[int]) -> None:
    model_dir = copy_bundled(tmp_models, "tiny-encoder", GOOD + "\n" + policy + "\n")
    for version in (2, 3):
        shutil.copytree(model_dir / "1", model_dir / str(version))
    assert [spec.version for spec in load_model_specs(model_dir)] == served


def test_version_policy_names_one_rule(tmp_models: Path) -> None:
    policy = "\n[version_policy]\nlatest = 2\nall = true\n"
    model_dir = copy_bundled(tmp_models, "tiny-encoder", GOOD + policy)
    with pytest.raises(ConfigError, match="exactly one of"):
        load_model_specs(model_dir)


def test_missing_tokenizer_file(tmp_models: Path) -> None:
    config = GOOD + '\n[tokenizer]\nfile = "tokenizer.json"\n'
    model_dir = copy_bundled(tmp_models, "tiny-encoder", config)
    with pytest.raises(
        ConfigError, match=r"config\.toml: tokenizer\.file: .*tokenizer\.json not found"
    ):
        load_model_spec(model_dir)


def test_unbuilt_on_demand_model_is_skipped_not_fatal(tmp_models: Path) -> None:
    copy_bundled(tmp_models, "tiny-encoder")
    (tmp_models / "minilm").mkdir()
    shutil.copyfile(MODELS / "minilm" / "config.toml", tmp_models / "minilm" / "config.toml")
    repository = load_repository(tmp_models)
    assert list(repository.models) == ["tiny-encoder"]
    assert repository.default_model == "tiny-encoder"


def test_unknown_default_model(tmp_models: Path) -> None:
    copy_bundled(tmp_models, "tiny-encoder")
    (tmp_models / "repository.toml").write_text('default_model = "nope"\n')
    with pytest.raises(
        ConfigError, match=r"repository\.toml: default_model: 'nope' is not a servable"
    ):
        load_repository(tmp_models)


def test_missing_repository(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model repository folder not found"):
        load_repository(tmp_path / "nowhere")


def test_an_old_setting_name_still_works_and_says_it_is_deprecated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`--strategy` became `--binding`: the old spelling, flag or variable, sets the new one
    and logs one deprecation line; given both, they must agree."""
    with caplog.at_level(logging.WARNING, logger="bucketserve.settings"):
        from_flag = Settings.from_env({}, strategy="mutable")
        from_variable = Settings.from_env({"BUCKETSERVE_STRATEGY": "session-per-key"})
    assert (from_flag.binding, from_flag.strategy) == ("mutable", None)
    assert from_variable.binding == "session-per-key"
    said = [r.getMessage() for r in caplog.records]
    assert (
        said
        == ["--strategy (BUCKETSERVE_STRATEGY) is deprecated: use --binding (BUCKETSERVE_BINDING)"]
        * 2
    )
    assert Settings(binding="mutable", strategy="mutable").binding == "mutable"
    with pytest.raises(ConfigError, match="contradicts binding"):
        Settings(binding="mutable", strategy="session-per-key")
    with pytest.raises(ConfigError, match="binding: 'static'"):
        Settings(strategy="static")

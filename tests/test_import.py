"""`bucketserve models import`: export folders as optimum and sentence-transformers write them,
turned into repository entries, served, and embedding what the folder's pooling config
prescribes, computed here from the export's own graph run alone."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from bucketserve.core.task import Task
from bucketserve.errors import ConfigError
from bucketserve.loading import load_engine
from bucketserve.loading.importer import MODULE, bucket_edges, import_model
from bucketserve.runtime.sessions import own_pools_allowed
from bucketserve.settings import Settings
from modelgen.graphs import encoder
from modelgen.save import save_model
from modelgen.wordpiece import vocabulary
from tests.engines import serving
from tests.exports import (
    MAX_SEQ_LENGTH,
    WIDTH,
    add_dense,
    dense_reference,
    pooled_reference,
    texts,
    tokenizer,
    write_export,
)


def states_alone(folder: Path, text: str, longest: int = MAX_SEQ_LENGTH) -> np.ndarray:
    """The export's own graph, on one text tokenised by its own tokenizer without padding:
    per-token states [T, W]."""
    onnx_path = next(
        p for p in (folder / "model.onnx", folder / "onnx" / "model.onnx") if p.exists()
    )
    options = ort.SessionOptions()
    options.use_per_session_threads = own_pools_allowed()  # (as the engine's process allows)
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(longest)
    ids = np.asarray([tokenizer.encode(text).ids], np.int64)
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "token_type_ids": np.zeros_like(ids),
    }
    (states,) = session.run(["last_hidden_state"], feeds)
    return np.asarray(states[0])


async def embeddings(models: Path, name: str, batch: list[str]) -> list[np.ndarray]:
    engine = load_engine(Settings(models=models))
    async with serving(engine) as client:
        response = await client.post(
            "/v1/embeddings", json={"model": name, "input": batch, "encoding_format": "float"}
        )
    assert response.status_code == 200, response.text
    return [np.asarray(d["embedding"]) for d in response.json()["data"]]


@pytest.mark.parametrize(
    ("pooling", "normalize"),
    [("mean", True), ("cls", False), ("max", True), ("mean_sqrt_len", False), ("last", True)],
)
async def test_each_pooling_the_folder_prescribes(
    tmp_path: Path, pooling: str, normalize: bool
) -> None:
    folder = write_export(tmp_path / "export", pooling=pooling, normalize=normalize)
    imported = import_model(folder, tmp_path / "models", "st")
    embedding = imported.model.info.rule(Task.EMBED)
    assert embedding is not None
    assert (embedding.output, embedding.pooling.value, embedding.normalize) == (
        "last_hidden_state",
        pooling,
        normalize,
    )
    batch = texts(12, seed=2)
    served = await embeddings(tmp_path / "models", "st", batch)
    for text, got in zip(batch, served, strict=True):
        want = pooled_reference(states_alone(folder, text), pooling, normalize)
        np.testing.assert_allclose(got, want, atol=1e-5)


def dense_layers(seed: int = 5) -> list[tuple[np.ndarray, np.ndarray | None, str]]:
    """Two Dense modules: WIDTH -> 48 with a bias and tanh, 48 -> 16 without either."""
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(0, 0.3, (48, WIDTH)), rng.normal(0, 0.1, 48), "Tanh"),
        (rng.normal(0, 0.3, (16, 48)), None, "Identity"),
    ]


@pytest.mark.parametrize(
    ("pooling", "normalize"),
    [("mean", True), ("cls", False), ("max", True), ("mean_sqrt_len", False), ("last", True)],
)
async def test_dense_modules_after_the_pooling_are_folded_into_the_graph(
    tmp_path: Path, pooling: str, normalize: bool
) -> None:
    """The pooling and each Dense module (weights, bias, activation) as ONNX nodes answering
    sentence_embedding, served as it is: each text's vector is sentence-transformers' modules
    computed here from the export's own states, alone."""
    layers = dense_layers()
    folder = add_dense(write_export(tmp_path / "export", pooling=pooling, normalize=normalize),
                       layers)  # fmt: skip
    imported = import_model(folder, tmp_path / "models", "st")
    embedding = imported.model.info.rule(Task.EMBED)
    assert embedding is not None
    assert (embedding.output, embedding.pooling.value, embedding.normalize, embedding.width) == (
        "sentence_embedding",
        "none",
        normalize,
        16,
    )
    assert f"#   pooling: {pooling} (1_Pooling/config.json)" in imported.config
    assert "#   Dense: 2_Dense 32 -> 48 Tanh, 3_Dense 48 -> 16, folded" in imported.config
    assert ("#   Normalize: applied" in imported.config) == normalize
    batch = texts(12, seed=3)
    served = await embeddings(tmp_path / "models", "st", batch)
    for text, got in zip(batch, served, strict=True):
        pooled = pooled_reference(states_alone(folder, text), pooling, normalize=False)
        np.testing.assert_allclose(got, dense_reference(pooled, layers, normalize), atol=1e-5)


async def test_a_long_models_fused_graph_is_folded_too(tmp_path: Path) -> None:
    """Past 512 tokens the export's attention is fused first (`fusion`), then the head folded
    onto that copy: a text of 900 tokens as the modules compute it from the export's states."""
    layers = dense_layers()
    folder = add_dense(write_export(tmp_path / "export"), layers)
    axes = ("batch_size", "sequence_length")
    graph = encoder(vocab=len(vocabulary()), dim=WIDTH, heads=4, ffn=64, pooled=False, axes=axes,
                    seed=7, max_positions=1024)  # fmt: skip
    save_model(graph, folder / "model.onnx")
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 1000}))
    imported = import_model(folder, tmp_path / "models", "st")
    assert any("flash path" in note for note in imported.notes)
    batch = [*texts(3, seed=4), " ".join(["cat"] * 900)]
    served = await embeddings(tmp_path / "models", "st", batch)
    for text, got in zip(batch, served, strict=True):
        pooled = pooled_reference(states_alone(folder, text, 1000), "mean", normalize=False)
        np.testing.assert_allclose(got, dense_reference(pooled, layers, True), atol=1e-5)


@pytest.mark.parametrize("saved_as", ["pytorch_model.bin", "float16", "bfloat16"])
async def test_dense_weights_as_older_releases_and_half_precision_hold_them(
    tmp_path: Path, saved_as: str
) -> None:
    """A Dense module's weights in pytorch_model.bin (LaBSE's and distiluse's releases before
    safetensors; read through torch), or in float16 or bfloat16 safetensors: folded as
    float32, each answer the modules' on those weights."""
    torch = pytest.importorskip("torch")
    from safetensors.numpy import load_file
    from safetensors.torch import save_file

    dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16}
    layers = dense_layers()
    folder = add_dense(write_export(tmp_path / "export"), layers)
    for module in ("2_Dense", "3_Dense"):
        weights = folder / module / "model.safetensors"
        tensors = {k: torch.from_numpy(v) for k, v in load_file(str(weights)).items()}
        if saved_as == "pytorch_model.bin":
            torch.save(tensors, folder / module / "pytorch_model.bin")
            weights.unlink()
        else:
            save_file({k: v.to(dtypes[saved_as]) for k, v in tensors.items()}, str(weights))

    def stored(array: np.ndarray) -> np.ndarray:  # (as the file holds it)
        dtype = dtypes.get(saved_as, torch.float32)
        return torch.from_numpy(array.astype(np.float32)).to(dtype).float().numpy()

    layers = [(stored(w), None if b is None else stored(b), a) for w, b, a in layers]
    import_model(folder, tmp_path / "models", "st")
    batch = texts(4, seed=6)
    served = await embeddings(tmp_path / "models", "st", batch)
    for text, got in zip(batch, served, strict=True):
        pooled = pooled_reference(states_alone(folder, text), "mean", normalize=False)
        np.testing.assert_allclose(got, dense_reference(pooled, layers, True), atol=1e-5)


def test_dense_modules_that_cannot_be_folded_are_said(tmp_path: Path) -> None:
    """An activation the fold has no operator for, missing weights, a pooling that leaves the
    prompt out: no embedding, and the note names the module and why."""
    weight, bias, _ = dense_layers()[0]
    gelu = add_dense(write_export(tmp_path / "gelu"), [(weight, bias, "GELU")])
    said = import_model(gelu, tmp_path / "m").notes
    assert (
        "not folded: 2_Dense's activation GELU (folded: Identity, Tanh, Sigmoid, ReLU)" in said[0]
    )
    missing = add_dense(write_export(tmp_path / "missing"), [(weight, bias, "Tanh")])
    (missing / "2_Dense" / "model.safetensors").unlink()
    imported = import_model(missing, tmp_path / "m")
    assert imported.model.info.rule(Task.EMBED) is None
    assert "2_Dense: no weights (model.safetensors or pytorch_model.bin)" in imported.notes[0]
    prompt = add_dense(write_export(tmp_path / "prompt"), [(weight, bias, "Tanh")])
    pooling = json.loads((prompt / "1_Pooling" / "config.json").read_text())
    (prompt / "1_Pooling" / "config.json").write_text(
        json.dumps(pooling | {"include_prompt": False})
    )
    assert "include_prompt false" in import_model(prompt, tmp_path / "m").notes[0]


def test_the_pad_id_is_the_tokenizers_where_the_config_has_none(tmp_path: Path) -> None:
    """`pad_token_id: null` in config.json (Qwen3-Embedding's): the tokenizer's pad token
    (tokenizer_config.json's, an AddedToken's form here) is the pad, and the heading says
    which; with neither, tokenizer.json's padding."""
    folder = write_export(tmp_path / "export")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"pad_token_id": None}))
    pad = {"content": "[SEP]", "special": True, "__type": "AddedToken"}
    (folder / "tokenizer_config.json").write_text(json.dumps({"pad_token": pad}))
    imported = import_model(folder, tmp_path / "models", "one")
    read = tomllib.loads(imported.config)["inputs"]["input_ids"]["pad_value"]
    assert read == tokenizer().token_to_id("[SEP]") == 3
    assert "#   pad: id 3, [SEP] (tokenizer_config.json's pad_token)" in imported.config
    (folder / "tokenizer_config.json").unlink()
    again = import_model(folder, tmp_path / "models", "two")
    assert "#   pad: id 0 (tokenizer.json's padding)" in again.config


def test_the_config_it_writes(tmp_path: Path) -> None:
    imported = import_model(write_export(tmp_path / "My Export"), tmp_path / "models")
    assert imported.entry == tmp_path / "models" / "my-export"
    config = tomllib.loads((imported.entry / "config.toml").read_text())
    assert {n: i["role"] for n, i in config["inputs"].items()} == {
        "input_ids": "tokens",
        "attention_mask": "mask",
        "token_type_ids": "token_types",
    }
    assert config["inputs"]["input_ids"]["vocab_size"] > 100
    assert config["tokenizer"]["max_length"] == MAX_SEQ_LENGTH  # sentence_bert_config's
    assert config["batching"]["buckets"] == [16, 24, 32, 40, 48, 56, 64]
    assert config["embedding"] == {
        "output": "last_hidden_state",
        "pooling": "mean",
        "normalize": True,
    }
    assert sorted(p.name for p in (imported.entry / "1").iterdir()) == [
        "model.onnx",
        "model.onnx.data",
        "tokenizer.json",
    ]
    # The saved tokenizer pads every text to 128: served, a text is its own tokens only, and
    # truncated at the model's 64.
    model = imported.model
    assert len(model.encode(["a cat"])[0]) == 4  # [CLS] a cat [SEP]
    assert len(model.encode(["cat " * 200])[0]) == MAX_SEQ_LENGTH


def test_an_onnx_subfolder_and_an_optimum_folder_without_pooling(tmp_path: Path) -> None:
    sub = import_model(write_export(tmp_path / "st", onnx_in_subfolder=True), tmp_path / "m")
    assert sub.model.info.rule(Task.EMBED) is not None
    plain = import_model(
        write_export(tmp_path / "plain", sentence_transformers=False), tmp_path / "m"
    )
    assert (
        plain.model.info.rule(Task.EMBED) is None
    )  # served for /predict and v2, not /v1/embeddings
    assert "1_Pooling" in plain.notes[0]
    assert plain.model.info.rules.max_length == 512  # config.json's max_position_embeddings


def test_what_the_graph_does_not_hold_is_not_served_as_an_embedding(tmp_path: Path) -> None:
    weighted = import_model(write_export(tmp_path / "w", pooling="weightedmean"), tmp_path / "m")
    assert weighted.model.info.rule(Task.EMBED) is None
    assert "pooling_mode_weightedmean_tokens" in weighted.notes[0]
    dense = write_export(tmp_path / "dense")
    modules = json.loads((dense / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": MODULE + "Dense"})
    (dense / "modules.json").write_text(json.dumps(modules))
    imported = import_model(dense, tmp_path / "m")
    assert imported.model.info.rule(Task.EMBED) is None
    assert "not folded: 2_Dense/config.json is missing" in imported.notes[0]
    (dense / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        import_model(dense, tmp_path / "m", "again")


def test_the_one_onnx_file_under_another_name_and_no_config_json(tmp_path: Path) -> None:
    """A folder whose one graph is named otherwise is imported from it; with two, the import
    names both; without config.json, the tokenizer's vocabulary bounds the ids, said in a
    note, never 'config.json: vocab_size: needed'."""
    folder = write_export(tmp_path / "renamed", onnx_in_subfolder=True)
    (folder / "onnx" / "model.onnx").rename(folder / "onnx" / "model_fp32.onnx")
    (folder / "config.json").unlink()
    imported = import_model(folder, tmp_path / "m")
    assert imported.model.info.rules.vocab_size == tokenizer().get_vocab_size(True)
    assert any("no config.json" in note for note in imported.notes)
    shutil.copyfile(folder / "onnx" / "model_fp32.onnx", folder / "model_quantized.onnx")
    with pytest.raises(ConfigError, match=r"2 ONNX files .*model_quantized\.onnx, onnx/model_f"):
        import_model(folder, tmp_path / "m", "again")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match="no ONNX file"):
        import_model(empty, tmp_path / "m", "empty")


def test_refusals_leave_nothing_behind(tmp_path: Path) -> None:
    models = tmp_path / "models"
    folder = write_export(tmp_path / "export")
    import_model(folder, models, "one")
    with pytest.raises(ConfigError, match="already in the repository"):
        import_model(folder, models, "one")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match=r"no tokenizer\.json"):
        import_model(folder, models, "two")
    broken = write_export(tmp_path / "broken")
    config = (broken / "config.json").read_text()
    (broken / "config.json").write_text(config.replace('"vocab_size": 157', '"vocab_size": 50000'))
    with pytest.raises(Exception, match=r"(?i)index|gather|out of|indices"):
        import_model(broken, models, "broken")  # ids past the graph's table fail the check
    assert sorted(p.name for p in models.iterdir()) == ["one"]  # no half-written entry


def test_the_command_prints_what_it_wrote_and_the_verdict(tmp_path: Path) -> None:
    folder = write_export(tmp_path / "export", pooling="cls")
    command = [sys.executable, "-m", "bucketserve", "models", "import", str(folder)]
    command += ["--name", "cls-model", "--models", str(tmp_path / "models")]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "[embedding]" in result.stdout
    assert 'pooling = "cls"' in result.stdout
    assert "buckets: padding moves its outputs by 0" in result.stdout
    assert "served as buckets" in result.stdout
    again = subprocess.run(command, capture_output=True, text=True, check=False)
    assert again.returncode == 2
    assert "already in the repository" in again.stderr


def test_edges_reach_the_longest_length() -> None:
    assert bucket_edges(64) == [16, 24, 32, 40, 48, 56, 64]
    assert bucket_edges(256)[-5:] == [128, 160, 192, 224, 256]
    assert bucket_edges(200)[-2:] == [192, 200]
    assert bucket_edges(8) == [8]
    ladder = bucket_edges(512)
    assert ladder[:8] == [16, 24, 32, 40, 48, 56, 64, 80]
    assert ladder[-3:] == [384, 448, 512]
    assert all(1.125 <= b / a <= 1.25 for a, b in itertools.pairwise(ladder[6:]))


# -- the full tier: all-MiniLM-L6-v2's own folder, exported here as optimum exports it --------


def export_minilm(folder: Path) -> Any:
    """all-MiniLM-L6-v2's files (from the package the minilm build reads), with its BERT
    exported to ONNX as optimum's feature-extraction does: per-token states only. Returns
    the torch model (for the reference numbers)."""
    import torch
    from transformers import AutoModel

    from modelgen.minilm import _model_source

    source = _model_source()
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    bert = AutoModel.from_pretrained(source, local_files_only=True, attn_implementation="eager")
    bert.eval()

    class States(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    ids = torch.randint(1000, 30000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 9:] = 0
    axes = {0: "batch_size", 1: "sequence_length"}
    torch.onnx.export(
        States().eval(),
        (ids, mask, torch.zeros_like(ids)),
        str(folder / "model.onnx"),
        dynamo=False,
        opset_version=17,
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state"],
        dynamic_axes={
            n: axes for n in ("input_ids", "attention_mask", "token_type_ids", "last_hidden_state")
        },
    )
    return bert


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")  # the exporter's own deprecation and tracer warnings
async def test_minilm_folder_imported_embeds_as_sentence_transformers(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    import torch

    folder = tmp_path / "all-MiniLM-L6-v2"
    bert = export_minilm(folder)
    imported = import_model(folder, tmp_path / "models")
    embedding = imported.model.info.rule(Task.EMBED)
    assert embedding is not None
    assert (embedding.pooling.value, embedding.normalize) == ("mean", True)
    assert imported.model.info.rules.max_length == 256  # sentence_bert_config's max_seq_length
    batch = [*texts(10, seed=4), "A man is eating food.", "word " * 300]
    served = await embeddings(tmp_path / "models", imported.entry.name, batch)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(256)
    with torch.no_grad():
        for text, got in zip(batch, served, strict=True):
            ids = torch.tensor([tokenizer.encode(text).ids])
            states = bert(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
            want = torch.nn.functional.normalize(states.mean(dim=1), p=2, dim=1)[0].numpy()
            np.testing.assert_allclose(got, want, atol=1e-5)


def test_names_an_exporter_made_up_are_quoted_and_said(tmp_path: Path) -> None:
    """An output named `onnx::Identity_7` (an exporter's own name): written quoted, so the
    config it writes parses and loads, and the import says whose name it is."""
    import onnx
    from onnx import helper

    folder = write_export(tmp_path / "export")
    graph = onnx.load(str(folder / "model.onnx"))
    graph.graph.node.append(
        helper.make_node("Identity", ["last_hidden_state"], ["onnx::Identity_7"])
    )
    states = next(o for o in graph.graph.output if o.name == "last_hidden_state")
    made_up = onnx.ValueInfoProto()
    made_up.CopyFrom(states)
    made_up.name = "onnx::Identity_7"
    graph.graph.output.append(made_up)
    onnx.save(graph, str(folder / "model.onnx"))
    imported = import_model(folder, tmp_path / "models", "made-up")
    assert '[outputs."onnx::Identity_7"]' in imported.config
    assert "onnx::Identity_7" in tomllib.loads(imported.config)["outputs"]
    assert any("'onnx::Identity_7'" in note and "made up" in note for note in imported.notes)
    assert "onnx::Identity_7" in imported.model.info.layout.output_names

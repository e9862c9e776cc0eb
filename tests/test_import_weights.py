"""`bucketserve models import` of a folder of weights and no ONNX graph (safetensors, as the
Hub holds most models and TEI loads them): a sentence-transformers model and a CrossEncoder
saved by sentence-transformers itself, imported by the command as a user runs it (exported
and checked against the original), then served; every answer equal to sentence-transformers'
own on each input alone. Without the export extra, the refusal names optimum's command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bucketserve.errors import ConfigError
from bucketserve.loading import load_engine
from bucketserve.loading.importer import read_export
from bucketserve.settings import Settings
from tests.engines import serving
from tests.exports import texts, tokenizer
from tests.task_exports import MAX_POSITIONS, _bert_config

pytestmark = [pytest.mark.timeout(600), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TOLERANCE = 1e-5
QUERY = "where do the cats sleep"


def hf_folder(folder: Path, model: Any) -> Path:
    """`model` saved as transformers saves one (config.json, model.safetensors), with the
    test vocabulary's fast tokenizer."""
    from transformers import PreTrainedTokenizerFast

    model.save_pretrained(folder)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer(),
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        unk_token="[UNK]",
        model_max_length=MAX_POSITIONS,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
    fast.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A sentence-transformers model (BERT, mean pooling, normalised) and a CrossEncoder (a
    one-label BERT classifier), each saved by sentence-transformers to its own folder."""
    pytest.importorskip("torch")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from sentence_transformers import CrossEncoder, SentenceTransformer
    from sentence_transformers import models as modules
    from transformers import BertForSequenceClassification, BertModel

    root = tmp_path_factory.mktemp("weights")
    torch.manual_seed(21)
    bert = hf_folder(root / "bert", BertModel(_bert_config(), add_pooling_layer=False))
    transformer = modules.Transformer(str(bert), max_seq_length=48)
    pooling = modules.Pooling(32, "mean")
    embedder = SentenceTransformer(modules=[transformer, pooling, modules.Normalize()])
    embedder.save(str(root / "st-embedder"))
    torch.manual_seed(22)
    classifier = BertForSequenceClassification(_bert_config(num_labels=1))
    cross = CrossEncoder(str(hf_folder(root / "classifier", classifier)), num_labels=1)
    cross.save(str(root / "st-cross-encoder"))
    return {"root": root, "embedder": embedder, "cross": cross}


def imported(folder: Path, models: Path) -> str:
    """`bucketserve models import FOLDER` as a user runs it: its output."""
    command = [sys.executable, "-m", "bucketserve", "models", "import", str(folder)]
    result = subprocess.run(
        [*command, "--models", str(models)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


async def test_a_sentence_transformers_folder_of_weights_is_imported_and_exact(
    saved: dict[str, Any],
) -> None:
    root, models = saved["root"], saved["root"] / "models"
    said = imported(root / "st-embedder", models)
    assert "exported" in said
    assert "(feature-extraction) and checked it against the original: 3 texts of 1 to 48" in said
    assert 'pooling = "mean"' in said
    assert not list((models / "st-embedder").glob("**/*.safetensors"))
    long = " ".join(["bucket"] * 80)  # (past max_seq_length 48: cut as the model cuts)
    batch = [*texts(6, seed=21), long]
    engine = load_engine(Settings(models=models))
    async with serving(engine) as client:
        openai = await client.post("/v1/embeddings", json={"model": "st-embedder", "input": batch})
        tei = await client.post("/embed", json={"model": "st-embedder", "inputs": batch})
    assert openai.status_code == tei.status_code == 200, openai.text
    want = [saved["embedder"].encode([text])[0] for text in batch]  # (each alone)
    np.testing.assert_allclose([d["embedding"] for d in openai.json()["data"]], want,
                               atol=TOLERANCE)  # fmt: skip
    np.testing.assert_allclose(tei.json(), want, atol=TOLERANCE)


async def test_a_cross_encoder_folder_of_weights_reranks_as_sentence_transformers(
    saved: dict[str, Any],
) -> None:
    root, models = saved["root"], saved["root"] / "cross-models"
    said = imported(root / "st-cross-encoder", models)
    assert "(text-classification) and checked it against the original" in said
    assert "rerank_label = 0" in said
    docs = [*texts(5, seed=22), " ".join(["bucket"] * 200)]
    engine = load_engine(Settings(models=models))
    async with serving(engine) as client:
        ranked = await client.post("/rerank", json={"query": QUERY, "texts": docs})
    assert ranked.status_code == 200, ranked.text
    want = [float(saved["cross"].predict([(QUERY, doc)])[0]) for doc in docs]  # (each alone)
    for result in ranked.json():
        assert result["score"] == pytest.approx(want[result["index"]], abs=TOLERANCE)


def test_without_the_export_extra_the_refusal_names_optimums_command(tmp_path: Path) -> None:
    """What a user without torch is told: the exact command that exports the folder."""
    folder = tmp_path / "weights-only"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["BertForSequenceClassification"]}')
    (folder / "model.safetensors").write_bytes(b"\0")
    with pytest.raises(ConfigError) as refused:
        read_export(folder)
    command = (
        f"optimum-cli export onnx --model {folder} --task text-classification "
        f"{tmp_path / 'weights-only-onnx'}"
    )
    assert command in str(refused.value)
    assert "pip install 'bucketserve[export]'" in str(refused.value)


def test_a_model_the_exporter_cannot_trace_is_refused_in_one_line(
    saved: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The trace failing as EmbeddingGemma's did under transformers 5 (`unordered_map::at`):
    the command exits 2 with one line naming the model, the cause and what to try, never a
    traceback, and leaves nothing in the repository."""
    import modelgen.hf_folder
    from bucketserve.process.cli import main

    def failing(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("unordered_map::at")

    monkeypatch.setattr(modelgen.hf_folder, "export_text_model", failing)
    models = tmp_path / "models"
    assert main(["models", "import", str(saved["root"] / "bert"), "--models", str(models)]) == 2
    (error,) = [r for r in caplog.records if r.levelname == "ERROR"]
    said = error.getMessage()
    assert "\n" not in said
    assert error.exc_info is None
    assert "BertModel (bert) could not be exported to ONNX" in said
    assert "RuntimeError: unordered_map::at" in said
    assert "dynamo=True" in said
    assert not models.exists() or not any(models.iterdir())

"""Task exports as optimum writes them, made here from transformers' own classes (the export
extra): small BERT sequence classifiers with seeded weights exported to ONNX
(`input_ids`, `attention_mask`, `token_type_ids` -> `logits`), their `config.json` as
`save_pretrained` writes it (architectures, id2label, problem_type; a sentence-transformers
CrossEncoder's `activation_fn` for the cross-encoder), and the WordPiece tokenizer of
`tests.exports`, which pairs texts as BERT does (the second text in segment 1).

`Reference` answers from the transformers model itself, on one input alone: the
classification pipeline's label scores, and CrossEncoder.predict's score (the sigmoid of a
one-label head's logit).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from modelgen.hf_export import export_text_model
from tests.exports import tokenizer, vocabulary

MAX_POSITIONS = 128
SENTIMENT = ["negative", "neutral", "positive"]
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
CROSS_ENCODER = {"activation_fn": "torch.nn.modules.activation.Sigmoid", "version": "5.0.0"}


def write_classifier(
    folder: Path,
    labels: list[str],
    *,
    problem_type: str | None = None,
    cross_encoder: bool = False,
    seed: int = 0,
) -> Any:
    """An export folder of a BERT sequence classifier with these labels; the transformers
    model it was exported from is returned (the reference)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(seed)
    config = _bert_config(**_labelled(labels), problem_type=problem_type)
    model = BertForSequenceClassification(config).eval()
    _export(model, folder, {"logits": {0: "batch_size"}})
    model.config.architectures = [type(model).__name__]  # (as save_pretrained sets it)
    model.config.save_pretrained(folder)
    if cross_encoder:
        written = json.loads((folder / "config.json").read_text())
        written["sentence_transformers"] = CROSS_ENCODER
        (folder / "config.json").write_text(json.dumps(written, indent=2))
    return model


def _labelled(labels: list[str]) -> dict[str, Any]:
    """A classification head's labels, as transformers' config holds them."""
    return {
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)},
    }


def _bert_config(**extra: Any) -> Any:
    from transformers import BertConfig

    config = BertConfig(
        vocab_size=len(vocabulary()),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=0.3,  # (outputs well apart: 0.02's are all near one value)
        **extra,
    )
    config._attn_implementation = "eager"
    return config


def _export(model: Any, folder: Path, outputs: dict[str, dict[int, str]]) -> None:
    """`model` exported as optimum exports it, beside the export's tokenizer."""
    folder.mkdir(parents=True)
    export_text_model(model, folder / "model.onnx", outputs, len(vocabulary()))
    tokenizer().save(str(folder / "tokenizer.json"))


def write_token_classifier(folder: Path, labels: list[str], seed: int = 0) -> Any:
    """A tagger's export (NER): BERT's token classification head, logits per token."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import BertForTokenClassification

    torch.manual_seed(seed)
    config = _bert_config(**_labelled(labels))
    model = BertForTokenClassification(config).eval()
    _export(model, folder, {"logits": {0: "batch_size", 1: "sequence_length"}})
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    return model


def write_masked_lm(folder: Path, seed: int = 0) -> Any:
    """A SPLADE-shaped export: BERT's masked-LM head, logits over the vocabulary per token."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import BertForMaskedLM

    torch.manual_seed(seed)
    model = BertForMaskedLM(_bert_config()).eval()
    _export(model, folder, {"logits": {0: "batch_size", 1: "sequence_length"}})
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    return model


def write_colbert(folder: Path, width: int = 16, seed: int = 0) -> Any:
    """A ColBERT-shaped export as PyLate writes one: BERT's per-token states through a linear
    projection to `width`, one vector per token (normalised, as ColBERT does), its modules
    and its query and document prefixes."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import BertModel

    torch.manual_seed(seed)
    bert = BertModel(_bert_config(), add_pooling_layer=False).eval()

    class Projected(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert, self.linear = bert, torch.nn.Linear(32, width, bias=False)

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            states = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
            return self.linear(states)

    model = Projected().eval()
    _export(model, folder, {"token_vectors": {0: "batch_size", 1: "sequence_length"}})
    bert.config.architectures = ["BertModel"]
    bert.config.save_pretrained(folder)
    modules = [  # (as PyLate lists a ColBERT's modules: no pooling)
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    prefixes = {"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 32}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(prefixes))
    return model


class Reference:
    """The transformers model on one text or pair alone, tokenised by the export's tokenizer
    without padding."""

    def __init__(self, model: Any) -> None:
        from transformers import PreTrainedTokenizerFast

        tok = tokenizer()
        tok.no_padding()
        tok.enable_truncation(MAX_POSITIONS)
        self.fast = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            pad_token="[PAD]",
            model_max_length=MAX_POSITIONS,
            model_input_names=["input_ids", "token_type_ids", "attention_mask"],  # (BERT's)
        )
        self.model = model

    def logits(self, text: str, pair: str | None = None) -> np.ndarray:
        import torch

        encoded = self.fast(text, pair, return_tensors="pt", truncation=True)
        with torch.no_grad():
            return self.model(**encoded).logits[0].numpy()  # type: ignore[no-any-return]

    def cross_encoder_score(self, query: str, document: str) -> float:
        """CrossEncoder.predict's score: its Sigmoid activation over a one-label logit."""
        import torch

        return float(torch.sigmoid(torch.from_numpy(self.logits(query, document)))[0])

    def entities(self, text: str, aggregation: str) -> list[dict[str, Any]]:
        """The token-classification pipeline's entities of `text`."""
        from transformers import pipeline

        tag = pipeline(
            "token-classification",
            model=self.model,
            tokenizer=self.fast,
            aggregation_strategy=aggregation,
        )
        return list(tag(text))

    def pipeline_scores(self, text: str, pair: str | None = None) -> dict[str, float]:
        """The text-classification pipeline's score of every label."""
        from transformers import pipeline

        classify = pipeline("text-classification", model=self.model, tokenizer=self.fast)
        given: Any = text if pair is None else {"text": text, "text_pair": pair}
        return {r["label"]: r["score"] for r in classify(given, top_k=None)}


class TaskRepository:
    """The task exports, made and imported once for the session (conftest's
    `task_repository`): a cross-encoder (`reranker`), a classifier of three labels
    (`sentiment`), a sentence embedder with prompts (`embedder`), a masked LM pooled as SPLADE
    (`splade`), a tagger (`tagger`) and a ColBERT (`colbert`); `references` of each, and the
    configs `models import` wrote."""

    def __init__(self, root: Path) -> None:
        from bucketserve.loading.importer import import_model
        from tests.exports import write_export

        exports, self.models = root / "exports", root / "models"
        self.exports = exports
        self.reranker = Reference(
            write_classifier(exports / "reranker", ["LABEL_0"], cross_encoder=True, seed=3)
        )
        self.sentiment = Reference(
            write_classifier(
                exports / "sentiment", SENTIMENT, problem_type="single_label_classification"
            )
        )
        write_export(exports / "embedder")
        prompts = {"prompts": {"query": "query: ", "passage": "passage: "}}
        (exports / "embedder" / "config_sentence_transformers.json").write_text(json.dumps(prompts))
        self.splade = write_masked_lm(exports / "splade", seed=5)
        self.tagger = Reference(write_token_classifier(exports / "tagger", TAGS, seed=8))
        self.colbert = write_colbert(exports / "colbert", seed=6)
        self.configs = {
            name: import_model(exports / name, self.models, name).config
            for name in ("reranker", "sentiment", "embedder", "splade", "tagger", "colbert")
        }

"""Long-context models of 2026, tiny, made here and saved as their releases are laid out
(sentence-transformers folders of safetensors weights, by sentence-transformers itself): a
ModernBERT embedder at its real 8,192 tokens (local attention windows of 128, mean pooling)
and a Qwen3-Embedding-shaped decoder at its real 32,768 (last-token pooling). Their weights
are random and their widths tiny; their lengths, attention and layouts are the real ones, so
what a long sequence costs in memory grows as the real models' does. Used by the suite and
the long-context load test; needs the export extra (torch, transformers) and
sentence-transformers; texts through `wordpiece`'s tokenizer.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from modelgen.wordpiece import WORDS, tokenizer

MODERNBERT_CONTEXT = 8192
QWEN3_CONTEXT = 32768


def _libraries() -> tuple[Any, Any, Any]:
    """torch, transformers and sentence-transformers (untyped here: their own checks)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return tuple(  # type: ignore[return-value]
        importlib.import_module(name) for name in ("torch", "transformers", "sentence_transformers")
    )


def _fast_tokenizer(folder: Path, context: int, **tokens: Any) -> None:
    _, transformers, _ = _libraries()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer(),
        unk_token="[UNK]",
        pad_token="[PAD]",
        model_max_length=context,
        **tokens,
    )
    fast.save_pretrained(folder)


def modernbert_config(vocab_size: int) -> Any:
    """A ModernBERT's config: 3 layers 32 wide, one of global attention, two of local windows
    over 128 tokens (as ModernBERT lays them out), 8,192 positions."""
    _, transformers, _ = _libraries()
    return transformers.ModernBertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        max_position_embeddings=MODERNBERT_CONTEXT,
        local_attention=128,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        pad_token_id=0,
        cls_token_id=2,
        sep_token_id=3,
        bos_token_id=2,
        eos_token_id=3,
    )


def modernbert(root: Path, seed: int = 0) -> Any:
    """A ModernBERT embedder (`modernbert_config`; mean pooling, normalised) saved by
    sentence-transformers to `root`/modernbert: the SentenceTransformer, the reference."""
    torch, transformers, sentence_transformers = _libraries()
    torch.manual_seed(seed)
    config = modernbert_config(len(tokenizer().get_vocab()))
    weights = root / "modernbert-weights"
    transformers.ModernBertModel(config).eval().save_pretrained(weights)
    _fast_tokenizer(weights, MODERNBERT_CONTEXT, cls_token="[CLS]", sep_token="[SEP]")
    return _saved(sentence_transformers, weights, MODERNBERT_CONTEXT, "mean", root / "modernbert")


def qwen3_embedding(root: Path, seed: int = 0) -> Any:
    """A Qwen3-Embedding-shaped decoder (2 layers of causal attention, grouped keys; the
    last token pooled, normalised) saved by sentence-transformers to `root`/qwen3,
    its context 32,768 as the release declares it: the SentenceTransformer, the reference."""
    torch, transformers, sentence_transformers = _libraries()
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(
        vocab_size=len(tokenizer().get_vocab()),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=QWEN3_CONTEXT,
        pad_token_id=None,  # (as the release: no pad id in its config)
        tie_word_embeddings=True,
    )
    weights = root / "qwen3-weights"
    transformers.Qwen3Model(config).eval().save_pretrained(weights)
    _fast_tokenizer(weights, QWEN3_CONTEXT)
    return _saved(sentence_transformers, weights, QWEN3_CONTEXT, "lasttoken", root / "qwen3")


def _saved(library: Any, weights: Path, context: int, pooling: str, folder: Path) -> Any:
    """The model in `weights` as sentence-transformers' module list (the transformer at
    `context`, `pooling`, Normalize), saved to `folder` by sentence-transformers."""
    modules = importlib.import_module("sentence_transformers.models")
    transformer = modules.Transformer(str(weights), max_seq_length=context)
    pooled = modules.Pooling(transformer.get_embedding_dimension(), pooling)
    embedder = library.SentenceTransformer(modules=[transformer, pooled, modules.Normalize()])
    embedder.save(str(folder))
    return embedder


def text_of(tokens: int, seed: int) -> str:
    """A text of about `tokens` tokens of the test vocabulary (each word one token)."""
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, size=max(1, tokens)).tolist())


def reference(embedder: Any, text: str) -> np.ndarray:
    """The reference library's vector of `text` alone."""
    return np.asarray(embedder.encode([text], batch_size=1)[0], np.float64)

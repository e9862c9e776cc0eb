"""Embedders of 2026 whose module list goes on past pooling, tiny, made here and saved as their
releases are laid out (sentence-transformers folders of safetensors weights, by
sentence-transformers itself): an EmbeddingGemma (Gemma3 text, transformers 5's
`Gemma3TextModel`: bidirectional attention, sliding windows of 512 on five layers of six, its
2,048 tokens; mean pooling, two Dense projections, Normalize; the release's `query` and
`document` prompts) and a LaBSE (BERT; the CLS token, one Dense with tanh, Normalize; 256
tokens). Their widths are tiny and their weights random; their configs, module lists, special
tokens and padding side are the releases'. Used by the suite and benchmarks; needs the export
extra (torch, transformers) and sentence-transformers.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from modelgen.wordpiece import WORDS, word_level
from modelgen.wordpiece import tokenizer as wordpiece

GEMMA_CONTEXT = 2048  # EmbeddingGemma's max_seq_length
GEMMA_WINDOW = 512  # its sliding window
LABSE_CONTEXT = 256
# EmbeddingGemma's special tokens at their ids (`<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3,
# `<mask>` 4), then its turn markers
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
# config_sentence_transformers.json's prompts, as EmbeddingGemma's release names them
GEMMA_PROMPTS = {
    "query": "task: search result | query: ",
    "document": "title: none | text: ",
    "BitextMining": "task: search result | query: ",
    "Clustering": "task: clustering | query: ",
    "Classification": "task: classification | query: ",
    "InstructionRetrieval": "task: code retrieval | query: ",
    "MultilabelClassification": "task: classification | query: ",
    "PairClassification": "task: sentence similarity | query: ",
    "Reranking": "task: search result | query: ",
    "Retrieval": "task: search result | query: ",
    "Retrieval-query": "task: search result | query: ",
    "Retrieval-document": "title: none | text: ",
    "STS": "task: sentence similarity | query: ",
    "Summarization": "task: summarization | query: ",
}


def _libraries() -> tuple[Any, Any, Any]:
    """torch, transformers and sentence-transformers (untyped here: their own checks)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return tuple(  # type: ignore[return-value]
        importlib.import_module(name) for name in ("torch", "transformers", "sentence_transformers")
    )


def gemma_tokenizer() -> Any:
    """Gemma's special tokens at their ids, then the test vocabulary and the prompts' words,
    each word one token; `<bos>` before a text and `<eos>` after it, as EmbeddingGemma's
    tokenizer adds them; case kept (Gemma's tokenizer does not lower case)."""
    prompt_words = " ".join(GEMMA_PROMPTS.values()).replace(":", " : ").replace("|", " | ")
    words = [*WORDS, *prompt_words.split(), ".", ",", "?", "!"]
    return word_level(GEMMA_SPECIALS, words, "<bos>", "<eos>")


def embeddinggemma_config(vocab_size: int) -> Any:
    """EmbeddingGemma's config.json (google/embeddinggemma-300m) narrowed: 6 layers of its
    pattern (five sliding windows of 512, then one of full attention), 32 wide, one key head;
    its attention scale, rope bases, activation, bidirectional attention and 2,048 positions
    as released."""
    _, transformers, _ = _libraries()
    return transformers.Gemma3TextConfig(
        architectures=["Gemma3TextModel"],
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=GEMMA_CONTEXT,
        query_pre_attn_scalar=256,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        },
        sliding_window=GEMMA_WINDOW,
        layer_types=[*["sliding_attention"] * 5, "full_attention"],
        use_bidirectional_attention=True,
        rms_norm_eps=1e-6,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )


def embeddinggemma(root: Path, seed: int = 0) -> Any:
    """An EmbeddingGemma (`embeddinggemma_config`; mean pooling, Dense 32 -> 128 and
    128 -> 32 without bias or activation, as the release's 768 -> 3,072 -> 768; Normalize;
    its prompts) saved by sentence-transformers to `root`/embeddinggemma: the
    SentenceTransformer, the reference."""
    torch, transformers, sentence_transformers = _libraries()
    modules = importlib.import_module("sentence_transformers.models")
    torch.manual_seed(seed)
    tokenizer = gemma_tokenizer()
    config = embeddinggemma_config(tokenizer.get_vocab_size(with_added_tokens=True))
    weights = root / "embeddinggemma-weights"
    transformers.Gemma3TextModel(config).eval().save_pretrained(weights)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        padding_side="right",
        model_max_length=GEMMA_CONTEXT,
    ).save_pretrained(weights)
    transformer = modules.Transformer(str(weights), max_seq_length=GEMMA_CONTEXT)
    identity = torch.nn.Identity()
    embedder = sentence_transformers.SentenceTransformer(
        modules=[
            transformer,
            modules.Pooling(32, "mean"),
            modules.Dense(32, 128, bias=False, activation_function=identity),
            modules.Dense(128, 32, bias=False, activation_function=identity),
            modules.Normalize(),
        ],
        prompts=GEMMA_PROMPTS,
        similarity_fn_name="cosine",
    )
    embedder.save(str(root / "embeddinggemma"))
    return embedder


def labse(root: Path, seed: int = 0) -> Any:
    """A LaBSE (sentence-transformers/LaBSE narrowed: BERT of 2 layers 32 wide, 512 positions,
    two segments, its pooler kept; the CLS token pooled, one Dense 32 -> 32 with bias and tanh,
    Normalize; 256 tokens, case kept) saved by sentence-transformers to `root`/labse: the
    SentenceTransformer, the reference."""
    torch, transformers, sentence_transformers = _libraries()
    modules = importlib.import_module("sentence_transformers.models")
    torch.manual_seed(seed)
    tokenizer = wordpiece(lowercase=False)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    config = transformers.BertConfig(
        architectures=["BertModel"],
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        type_vocab_size=2,
        pad_token_id=0,
    )
    weights = root / "labse-weights"
    transformers.BertModel(config).eval().save_pretrained(weights)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        do_lower_case=False,
        model_max_length=512,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    ).save_pretrained(weights)
    transformer = modules.Transformer(str(weights), max_seq_length=LABSE_CONTEXT)
    embedder = sentence_transformers.SentenceTransformer(
        modules=[
            transformer,
            modules.Pooling(32, "cls"),
            modules.Dense(32, 32, bias=True, activation_function=torch.nn.Tanh()),
            modules.Normalize(),
        ]
    )
    embedder.save(str(root / "labse"))
    return embedder

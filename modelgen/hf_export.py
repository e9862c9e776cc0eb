"""A transformers text model exported to ONNX as optimum exports one: `input_ids`,
`attention_mask` and `token_type_ids` on `batch_size` and `sequence_length` axes, the outputs
named and their free axes declared. Needs the `export` extra (torch). Used by the suite's task
exports and the rerank benchmark.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import onnx

from modelgen.graphs import IR_VERSION
from modelgen.save import save_model

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
AXES = {0: "batch_size", 1: "sequence_length"}
OPSET = 17


def export_text_model(
    module: Any,
    onnx_path: Path,
    outputs: dict[str, dict[int, str]],
    vocab_size: int,
    inputs: tuple[str, ...] = INPUTS,
) -> None:
    """`module` (`inputs`, of INPUTS in their order -> `outputs`, each with its free axes)
    written to `onnx_path` by the TorchScript exporter (whose graphs ONNX Runtime runs fastest
    on a CPU, `modelgen.minilm` measured)."""
    import torch

    ids = torch.randint(5, vocab_size, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # (padding in the example: with all ones the trace drops the mask)
    example = (ids, mask, torch.zeros_like(ids))[: len(inputs)]
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its deprecation notice, and tracer warnings
        exported = Path(tmp) / "model.onnx"
        torch.onnx.export(
            module,
            example,
            str(exported),
            dynamo=False,
            opset_version=OPSET,
            input_names=list(inputs),
            output_names=list(outputs),
            dynamic_axes=dict.fromkeys(inputs, AXES) | outputs,
        )
        model = onnx.load(str(exported))
    model.ir_version = min(model.ir_version, IR_VERSION)
    save_model(model, onnx_path)

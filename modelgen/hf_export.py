"""A transformers text model exported to ONNX as optimum exports one: `input_ids`,
`attention_mask` and `token_type_ids` on `batch_size` and `sequence_length` axes, the outputs
named and their free axes declared. Needs the `export` extra (torch). Used by the suite's task
exports and the rerank benchmark.

transformers 5 builds a model's attention masks from mask functions of indices (a causal
mask, a window, Gemma3's bidirectional window), which it expands over the batch, heads,
queries and keys with `torch.vmap` wherever a model adds its own function to the defaults;
the TorchScript exporter cannot trace vmap (`RuntimeError: unordered_map::at`, EmbeddingGemma's
failure). Those functions are index arithmetic that broadcasts, as transformers' own default
path expands them: during the trace every mask is built that way (`_masks_by_broadcasting`).
Each export is checked against the original after (`hf_folder.check_export`), so a function
that did not broadcast as vmap maps it would be caught there.
"""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections.abc import Iterator
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
    with (
        tempfile.TemporaryDirectory() as tmp,
        warnings.catch_warnings(),
        _masks_by_broadcasting(),
    ):
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


@contextlib.contextmanager
def _masks_by_broadcasting() -> Iterator[None]:
    """transformers' mask builders (sdpa's, eager's) told to expand every mask function by
    broadcasting its index tensors, never by vmap, until the block ends: what lets the
    TorchScript exporter trace transformers 5's masks. Nothing where transformers has no
    mask registry (before 4.53)."""
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    masks = masking_utils.ALL_MASK_ATTENTION_FUNCTIONS  # (its local overrides, put back after)
    saved = dict(masks._local_mapping)

    def broadcast(build: Any) -> Any:
        def built(*args: Any, **kwargs: Any) -> Any:
            return build(*args, **{**kwargs, "use_vmap": False})

        return built

    for name in ("sdpa", "eager"):
        if name in masks:
            masks[name] = broadcast(masks[name])
    try:
        yield
    finally:
        masks._local_mapping.clear()
        masks._local_mapping.update(saved)

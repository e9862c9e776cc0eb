"""A Hugging Face model folder of weights and no ONNX graph (safetensors: what the Hub holds
for most models, and what text-embeddings-inference loads directly) exported as optimum
exports one, for `bucketserve models import`: the transformers model its config.json names
(optimum's task by its architecture: `importer.task_of`), traced to `model.onnx` by
`hf_export`, beside copies of the folder's tokenizer and configs; then checked against the
original, each text alone, on texts from one token to the longest the import serves (past
every local attention window its config declares), before the import goes on. A module's
own weights (a Dense module's, in 2_Dense/) are copied with its folder: the import folds them
into the graph. A model the exporter cannot trace is refused in one line naming it, the cause
and what to try. Reads the folder only. Needs the export extra (torch, transformers).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bucketserve.errors import ConfigError
from bucketserve.loading.builder import load_tokenizer
from bucketserve.loading.importer import task_of
from bucketserve.runtime.sessions import GraphFile, side_session
from modelgen.hf_export import INPUTS, export_text_model

STEPS = {0: "batch_size", 1: "sequence_length"}
# Traced float32 against eager float32: measured below 1e-5 on BERT and MiniLM states; this
# bound, relative to the output's scale, still tells a wrong graph (a dropped mask) apart.
TOLERANCE = 1e-4
WORDS = ["the", "cat", "sat", "on", "a", "mat", "while", "buckets", "of", "rain", "fell"]
# Not weights, not another graph: copied beside the export (configs, tokenizer, module folders)
LEFT_BEHIND = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.h5", "*.msgpack",
               "*.ot", "*.pt", "*.pth", "*.onnx", "onnx", ".git")  # fmt: skip
# In a module's folder (2_Dense/) its weights are kept; other graphs are not
LEFT_BELOW = ("*.onnx", "onnx", "openvino", ".git")


# config.json's fields that name an attention window narrower than the context (ModernBERT's
# local attention, Gemma's and Mistral's sliding window, Longformer's)
WINDOWS = ("local_attention", "sliding_window", "attention_window")


@dataclass(frozen=True)
class Exported:
    folder: Path  # the export, as `models import` reads one
    task: str  # optimum's name of what was exported


def export_folder(source: Path, into: Path) -> Exported:
    """`source` exported to the new folder `into` (checked by `check_export`, once the
    length it is served at is known); ConfigError when the folder names no model
    transformers has."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    task = task_of(source)
    model, output, axes = _original(source, task)
    inputs = tuple(i for i in INPUTS if i in _inputs_taken(model))
    shutil.copytree(source, into, ignore=_left_behind(source))
    module = _named(model, inputs, output)
    try:
        export_text_model(
            module, into / "model.onnx", {output: axes}, model.config.vocab_size, inputs
        )
    except ModuleNotFoundError:  # (the export extra's: said by the command)
        raise
    except Exception as exc:  # (whatever the trace raised, from torch or the model's code)
        raise ConfigError(_refusal(source, model, exc)) from None
    return Exported(into, task)


def _left_behind(source: Path) -> Callable[[str, list[str]], set[str]]:
    """What copying `source` leaves behind: LEFT_BEHIND at its top, LEFT_BELOW in folders."""
    top, below = shutil.ignore_patterns(*LEFT_BEHIND), shutil.ignore_patterns(*LEFT_BELOW)

    def ignored(folder: str, names: list[str]) -> set[str]:
        return set((top if Path(folder) == source else below)(folder, names))

    return ignored


def _refusal(source: Path, model: Any, exc: BaseException) -> str:
    """Why `model` was not exported, in one line: the model, the cause, what to try."""
    import torch
    import transformers

    architecture = ", ".join(model.config.architectures or [type(model).__name__])
    cause = " ".join(str(exc).split()) or "(no message)"
    return (
        f"{source}: {architecture} ({model.config.model_type}) could not be exported to ONNX by "
        f"torch {torch.__version__}'s TorchScript exporter with transformers "
        f"{transformers.__version__}: {type(exc).__name__}: {cause[:300]}. Try another "
        "transformers release, or export it yourself (torch.onnx.export with dynamo=True and "
        "dynamic sequence lengths, or optimum-cli export onnx) and import the folder holding "
        "that model.onnx"
    )


def check_export(source: Path, exported: Exported, longest: int) -> str:
    """The export's answers against the original's, each text alone, from one token to
    `longest` (the length it is imported at) and past every attention window the config
    declares: what was checked, in a line, or ConfigError past TOLERANCE."""
    model, output, _ = _original(source, exported.task)
    inputs = tuple(i for i in INPUTS if i in _inputs_taken(model))
    lengths = check_lengths(model.config, longest)
    difference = _checked(model, exported.folder, inputs, output, lengths)
    return (
        f"exported to ONNX ({exported.task}) and checked it against the original: {len(lengths)} "
        f"texts of {lengths[0]} to {lengths[-1]} tokens, each alone, within {difference:.2g}"
    )


def check_lengths(model_config: Any, longest: int) -> list[int]:
    """The texts' lengths in tokens: short ones, twice each attention window narrower than
    `longest`, and `longest`."""
    windows = [getattr(model_config, name, None) for name in WINDOWS]
    past = [2 * w for w in windows if isinstance(w, int) and 0 < 2 * w < longest]
    return sorted({n for n in (1, 7, 60) if n < longest} | set(past) | {longest})


def _original(source: Path, task: str) -> tuple[Any, str, dict[int, str]]:
    """The transformers model of the folder, and its output as optimum names it for `task`."""
    import transformers

    loaders = {
        "text-classification": ("AutoModelForSequenceClassification", "logits", {0: "batch_size"}),
        "token-classification": ("AutoModelForTokenClassification", "logits", STEPS),
        "fill-mask": ("AutoModelForMaskedLM", "logits", STEPS),
    }
    loader, output, axes = loaders.get(task, ("AutoModel", "last_hidden_state", STEPS))
    try:
        model = getattr(transformers, loader).from_pretrained(source, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{source}: transformers cannot load it as {task}: {exc}") from None
    return model.float().eval(), output, axes


def _inputs_taken(model: Any) -> set[str]:
    """The inputs the model reads: its ids and mask, and segment ids where it has segments
    (BERT's two; RoBERTa's one is no input, as optimum exports it)."""
    import inspect

    taken = {"input_ids", "attention_mask"}
    has_segments = getattr(model.config, "type_vocab_size", 0) > 1
    if has_segments and "token_type_ids" in inspect.signature(model.forward).parameters:
        taken.add("token_type_ids")
    return taken


def _named(model: Any, inputs: tuple[str, ...], output: str) -> Any:
    """`model` as a module of positional tensors (`inputs`, in order) to its one `output`."""
    import torch

    class Named(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> Any:
            return getattr(self.model(**dict(zip(inputs, tensors, strict=True))), output)

    return Named().eval()


def _checked(
    model: Any, folder: Path, inputs: tuple[str, ...], output: str, lengths: list[int]
) -> float:
    """The export's output against the original's, on one text of each of `lengths` tokens
    (special tokens included) alone; ConfigError past TOLERANCE. The largest difference."""
    import torch

    longest = max(lengths)
    tokenizer = load_tokenizer(folder / "tokenizer.json", longest)
    # (on the process's thread layout: the import's load may have made a global pool)
    session = side_session(GraphFile(folder / "model.onnx", ("CPUExecutionProvider",)))
    largest = 0.0
    for length in lengths:
        tokenizer.enable_truncation(length)  # (a text of more words, cut to this length)
        encoded = tokenizer.encode(" ".join(WORDS[i % len(WORDS)] for i in range(2 * length)))
        fields = {"input_ids": encoded.ids, "attention_mask": encoded.attention_mask,
                  "token_type_ids": encoded.type_ids}  # fmt: skip
        feeds = {name: np.array([fields[name]], np.int64) for name in inputs}
        got = session.run([output], feeds)[0]
        with torch.no_grad():
            want = getattr(model(**{k: torch.from_numpy(v) for k, v in feeds.items()}), output)
        want = want.numpy()
        difference = float(np.abs(got - want).max())
        if difference > TOLERANCE * max(1.0, float(np.abs(want).max())):
            raise ConfigError(
                f"{folder.name}: the exported graph answers {difference:.3g} away from the "
                f"original on a text of {len(encoded.ids)} tokens: not imported"
            )
        largest = max(largest, difference)
    return largest

"""The zoo as a model repository: each export-shaped model of `modelgen.zoo` (and the bundled
ones) with the config a user would write for it, and the serving policy the load-time check
must choose for it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx

from modelgen import graphs, zoo
from modelgen.save import save_model
from tests.helpers import MODELS

BATCHING = """
[batching]
buckets = [4, 8, 16, 32, 64]
max_batch_size = 8
max_batch_tokens = 512
max_queue_delay_ms = 2
"""


@dataclass(frozen=True)
class Exhibit:
    build: Callable[[], onnx.ModelProto] | None  # None: a bundled model, copied
    config: str
    policy: str  # what the invariance check must find
    inline: bool = False  # weights inside model.onnx, as most exporters write them


ZOO: dict[str, Exhibit] = {
    # tf2onnx: generated dim names, int32 ids, the pad id 0 as the mask, weights inline
    "keras-bilstm": Exhibit(
        zoo.keras_bilstm,
        '[inputs.input_1]\nrole = "tokens"\nvocab_size = 800\n[outputs.dense]\n' + BATCHING,
        "buckets",
        inline=True,
    ),
    # quantize_dynamic: the activations' int8 scale is the whole batch's
    "int8-bilstm": Exhibit(
        lambda: zoo.quantized(zoo.bilstm_tagger()),
        '[inputs.ids]\nrole = "tokens"\nvocab_size = 600\n[outputs.tags]\n' + BATCHING,
        "single",
        inline=True,
    ),
    # no mask, no sequence lengths: the backward LSTM reads the padding first
    "unmasked-bilstm": Exhibit(
        zoo.bilstm_tagger,
        '[inputs.ids]\nrole = "tokens"\nvocab_size = 600\n[outputs.tags]\n' + BATCHING,
        "exact-length",
    ),
    # time-major frames, every dim anonymous, an unmasked mean over time
    "frames": Exhibit(
        zoo.time_major_frames,
        '[inputs.frames]\nrole = "features"\nbatch_axis = 1\ntime_axis = 0\n'
        "[outputs.frame_logits]\n[outputs.utterance]\n" + BATCHING,
        "exact-length",
    ),
    # the bundled encoder with its weights inline
    "encoder-inline": Exhibit(
        graphs.encoder,
        (MODELS / "tiny-encoder" / "config.toml").read_text().replace('build = "tiny-encoder"', ""),
        "buckets",
        inline=True,
    ),
    # features + sequence_lens + initial states (external weights)
    "tiny-lstm": Exhibit(None, (MODELS / "tiny-lstm" / "config.toml").read_text(), "buckets"),
}


def add_to(root: Path, name: str) -> Path:
    """`root/name/`: the exhibit's config.toml and 1/model.onnx (inline or with a .data file)."""
    exhibit = ZOO[name]
    folder = root / name
    if exhibit.build is None:
        shutil.copytree(MODELS / name, folder)
    else:
        model, onnx_path = exhibit.build(), folder / "1" / "model.onnx"
        (zoo.save_inline if exhibit.inline else save_model)(model, onnx_path)
    (folder / "config.toml").write_text(exhibit.config)
    return folder

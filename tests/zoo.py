"""The zoo as a model repository: each export-shaped model of `modelgen.zoo` (and the bundled
ones) with the config a user would write for it, and the serving policy the load-time check
must choose for it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from modelgen import families, graphs, zoo
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
    steps: Callable[[int], int] | None = None  # a strided output's steps for T input steps
    min_length: int = 1  # the shortest input the model runs on
    batch_axes: dict[str, int | None] = field(default_factory=dict)  # outputs' where not 0
    mask_alone: int = 1  # the mask on a sequence alone, as the package's own code passes it
    multiple: int = 1  # the widths the model runs at: alone, a sequence is padded up to one


MASKED_TAGGER = (
    '[inputs.input_ids]\nrole = "tokens"\nvocab_size = 400\n[inputs.{mask}]\nrole = "mask"\n'
    "[outputs.tags]\n[outputs.states]\n[outputs.pooled]\n" + BATCHING
)


def batching(buckets: list[int], max_batch_tokens: int) -> str:
    return BATCHING.replace("[4, 8, 16, 32, 64]", str(buckets)).replace(
        "max_batch_tokens = 512", f"max_batch_tokens = {max_batch_tokens}"
    )


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
    # no mask, no sequence lengths: the backward LSTM reads the padding first, until the
    # server's copy gives it each row's length
    "unmasked-bilstm": Exhibit(
        zoo.bilstm_tagger,
        '[inputs.ids]\nrole = "tokens"\nvocab_size = 600\n[outputs.tags]\n' + BATCHING,
        "buckets",
    ),
    # time-major frames, every dim anonymous, an unmasked mean over time
    "frames": Exhibit(
        zoo.time_major_frames,
        '[inputs.frames]\nrole = "features"\nbatch_axis = 1\ntime_axis = 0\n'
        "[outputs.frame_logits]\n[outputs.utterance]\n" + BATCHING,
        "exact-length",
        batch_axes={"frame_logits": 1},
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
    # CTC over fbank frames [B, T, 80] -> [B, ceil(T / 4), 29]; biased convolutions read the
    # padding at a row's end
    "ctc-fbank": Exhibit(
        families.ctc_fbank,
        '[inputs.features]\nrole = "features"\n[outputs.log_probs]\n' + BATCHING,
        "exact-length",
        steps=lambda t: -(-t // 4),
    ),
    # an OCR line [B, 3, 32, W], width as time -> [B, W / 8, 40], attention over every column
    "ocr-line": Exhibit(
        families.line_recogniser,
        '[inputs.image]\nrole = "features"\n[outputs.logits]\n' + batching([32, 64, 128], 1024),
        "exact-length",
        inline=True,
        steps=lambda w: w // 8,
        min_length=8,
    ),
    # the same, declared [N, 3, H, W] (three free dims): the config names time, fixes H
    "ocr-line-free-height": Exhibit(
        lambda: families.line_recogniser(free_height=True),
        '[inputs.image]\nrole = "features"\ntime_axis = 3\nshape = [-1, 3, 32, -1]\n'
        "[outputs.logits]\n" + batching([32, 64, 128], 1024),
        "exact-length",
        inline=True,
        steps=lambda w: w // 8,
        min_length=8,
    ),
    # raw samples [B, S] -> frames [B, F, 16]; frames read only real samples: buckets
    "raw-audio": Exhibit(
        families.raw_audio,
        '[inputs.audio]\nrole = "features"\n[outputs.frames]\n'
        + batching([800, 1600, 3200], 25600),
        "buckets",
        steps=lambda s: ((s - 400) // 160 + 1 - 3) // 2 + 1,
        min_length=720,
    ),
    # a dB floor from the loudest value of the whole batch: rows change each other
    "batch-db": Exhibit(
        families.batch_db, '[inputs.mel]\nrole = "features"\n[outputs.db]\n' + BATCHING, "single"
    ),
    # inputs free, outputs declared [1, ?, 1]: bound at a batch of 2, ONNX Runtime refuses
    "declared-batch-one": Exhibit(
        families.declared_batch_one,
        '[inputs.audio]\nrole = "features"\n[outputs.speech]\n' + batching([512, 1024], 8192),
        "single",
        steps=lambda s: (s - 256) // 128 + 1,
        min_length=256,
    ),
    # torch dynamo without dynamic batch: ids [1, s0], tags flattened [s0]
    "dynamo-batch-one": Exhibit(
        families.dynamo_batch_one,
        '[inputs.input_ids]\nrole = "tokens"\nvocab_size = 300\n[outputs.logits]\n'
        "[outputs.tags]\n" + BATCHING,
        "single",
        batch_axes={"tags": None},
    ),
    # a BOOL mask True at the padding (the package passes ids == pad_id), the config silent
    # on which way it points: found at load; the BiGRU given each row's length
    "padding-mask-bigru": Exhibit(
        families.padding_mask_bigru,
        '[inputs.input_ids]\nrole = "tokens"\nvocab_size = 400\n[inputs.padding_mask]\n'
        'role = "mask"\n[outputs.states]\n[outputs.pooled]\n' + BATCHING,
        "buckets",
        inline=True,
        mask_alone=0,
    ),
    # a BiLSTM over every second step without sequence_lens: its copy is given each row's
    # length in the LSTM's own steps, floor((T + 1) / 2), learned at load
    "strided-bilstm": Exhibit(
        families.strided_bilstm,
        '[inputs.ids]\nrole = "tokens"\nvocab_size = 300\n[outputs.tags]\n' + BATCHING,
        "buckets",
        inline=True,
        steps=lambda t: (t + 1) // 2,
    ),
    # a CRNN line [N, 3, 32, W] -> CTC [N, floor(W / 4), 30], its BiLSTM over the columns of a
    # stride-4 convolution: given each row's length in columns, floor(W / 4), and batched
    "crnn-line": Exhibit(
        families.crnn_line,
        '[inputs.image]\nrole = "features"\n[outputs.log_probs]\n' + batching([32, 64, 128], 1024),
        "buckets",
        inline=True,
        steps=lambda w: w // 4,
        min_length=4,
    ),
    # exact in any batch, its cost the square of the rows: batching measured to lose at load
    "pairwise-cost": Exhibit(
        families.pairwise_cost,
        '[inputs.ids]\nrole = "tokens"\nvocab_size = 300\n[outputs.states]\n'
        + batching([512, 1024], 8192),
        "single",
        inline=True,
    ),
    # a scalar sample rate beside the samples: a constant the config gives, fed on every run
    "sample-rate": Exhibit(
        families.sample_rate_scaled,
        '[inputs.audio]\nrole = "features"\n[inputs.sr]\nrole = "constant"\nvalue = 16000\n'
        "[outputs.frames]\n" + BATCHING,
        "buckets",
        inline=True,
    ),
    # declared for a batch of 1 (a trace's shapes), computed row by row: freed, and batched
    "declared-one-encoder": Exhibit(
        families.declared_one_encoder,
        '[inputs.input_ids]\nrole = "tokens"\nvocab_size = 300\n[inputs.attention_mask]\n'
        'role = "mask"\n[outputs.states]\n[outputs.pooled]\n' + BATCHING,
        "buckets",
        inline=True,
    ),
    # a head over the first max(1, floor((T + 3) / 8)) steps: its rule holds from 5 steps on
    "clamped-head": Exhibit(
        families.clamped_head,
        '[inputs.ids]\nrole = "tokens"\nvocab_size = 300\n[outputs.head]\n' + BATCHING,
        "buckets",
        inline=True,
        steps=lambda t: (t + 3) // 8,
        min_length=5,
    ),
    # frames [T, 40] with no batch axis at all: found, served one utterance a run
    "unbatched-frames": Exhibit(
        families.unbatched_frames,
        '[inputs.frames]\nrole = "features"\n[outputs.score]\n[outputs.logits]\n' + BATCHING,
        "single",
        inline=True,
        batch_axes={"score": None, "logits": None},
    ),
    # a page-image detector [N, 3, H, W] -> [N, 1, H, W] that runs only at multiples of 32:
    # the config fixes H, each width is padded up to a multiple and its map cut back
    "text-detector": Exhibit(
        families.text_detector,
        '[inputs.image]\nrole = "features"\ntime_axis = 3\nshape = [-1, 3, 64, -1]\n'
        "[outputs.maps]\n" + batching([64, 128, 256], 1024),
        "exact-length",
        inline=True,
        multiple=32,
    ),
    # a BOOL mask True at the padding read only by a mean over it, beside a BiGRU without
    # lengths and a path that reads the tokens either way; the config silent. Fed the mask
    # the other way, only the mean stops reading the input: decided on the original graph,
    # output by output, before the BiGRU is given each row's length
    "mask-pooled-bigru": Exhibit(
        lambda: families.masked_bigru(padding_true=True, lengths_from_mask=False),
        MASKED_TAGGER.format(mask="padding_mask"),
        "buckets",
        inline=True,
        mask_alone=0,
    ),
    # each row's RNN length counted from its own mask, the mask pointing each way (a BOOL
    # True at the padding; INT64 ones on the tokens), the config silent on both
    "mask-lengths-bigru": Exhibit(
        lambda: families.masked_bigru(padding_true=True, lengths_from_mask=True),
        MASKED_TAGGER.format(mask="padding_mask"),
        "buckets",
        inline=True,
        mask_alone=0,
    ),
    "attention-lengths-bigru": Exhibit(
        lambda: families.masked_bigru(padding_true=False, lengths_from_mask=True),
        MASKED_TAGGER.format(mask="attention_mask"),
        "buckets",
        inline=True,
    ),
    # a BiGRU without sequence_lens: the server's copy is given each row's length
    "unmasked-bigru": Exhibit(
        families.unmasked_bigru,
        '[inputs.ids]\nrole = "tokens"\nvocab_size = 500\n[outputs.tags]\n' + BATCHING,
        "buckets",
        inline=True,
    ),
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

"""`bucketserve models import PATH`: a folder that `optimum-cli export onnx` or
sentence-transformers wrote (`model.onnx` or `onnx/model.onnx`, `tokenizer.json`,
`config.json`, and for a sentence-transformers model `modules.json`, `sentence_bert_config.json`
and `1_Pooling/config.json`) turned into a repository entry, then loaded and checked as the
server loads it at start. It reads the local folder only; nothing is downloaded. A folder of
weights and no graph (safetensors, as the Hub holds most models) is exported by the command
first (`modelgen.hf_folder`, the export extra), or refused naming optimum's command for it.

What the folder says becomes the config: input roles from their names, the tokenizer's
truncation from `sentence_bert_config.json` (else the model's maximum positions), bucket edges
up to that length, the pad id (config.json's, else the tokenizer's pad token), and the
embedding: a graph's own `sentence_embedding`, or the per-token states pooled as `1_Pooling`
says and normalised when the module list has `Normalize`. Where the module list has `Dense`
modules after the pooling (EmbeddingGemma's two, LaBSE's one), the pooling and each Dense
layer (its weights, bias and activation) are folded into the graph as ONNX nodes answering
`sentence_embedding`, which the config serves as it is (`pooling = "none"`). A
sequence classifier (`architectures` ending in ForSequenceClassification, a `logits` output)
gets a classifier instead: its labels from `id2label`, its activation from `problem_type`
(or a sentence-transformers CrossEncoder's `activation_fn`), and, with one label (a
cross-encoder), the rerank task. A masked-LM export (`ForMaskedLM`, a `logits` output over
the vocabulary: SPLADE) gets sparse weights, a token classifier (`ForTokenClassification`)
its labels per token. Named prompts in `config_sentence_transformers.json` become `[prompts]`.
What was read, and from which file (pooling, Dense modules, Normalize, prompts, pad), heads
the config it writes.

A model that takes more than 512 tokens gets its attention on ONNX Runtime's flash path where
it fuses (`fusion`), and it is imported at the longest length whose batch of one fits the
memory budget where its own is longer (`room`), each said in the import's notes.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from bucketserve.core.budget import MemoryBudget
from bucketserve.core.model import Model
from bucketserve.errors import ConfigError
from bucketserve.loading import room
from bucketserve.loading.builder import build_model, load_tokenizer
from bucketserve.loading.fusion import fuse_attention
from bucketserve.loading.planner import bucket_edges
from bucketserve.loading.repository import CONFIG_FILE, MODEL_FILE, load_model_spec
from bucketserve.loading.served_file import default_cache_dir
from bucketserve.loading.st_modules import POOLED_OUTPUT, Head, described, fold, head_of, read_json
from bucketserve.settings import Settings

# Attention is fused where the model takes more tokens than this: there its scores (heads x
# length x length a row) are most of what a long batch holds (a tiny BERT at 8,192 tokens:
# 2,466 MiB plain, 36 fused, loadtest.attention_bench); at minilm's 256 tokens fusion saved
# nothing (0.96-1.07x the time at 1 x 16 to 4 x 256), so shorter models stay as exported.
FUSED_FROM = 512
DATA_FILE = MODEL_FILE + ".data"
ROLES = {"input_ids": "tokens", "attention_mask": "mask", "token_type_ids": "token_types"}
POOLING_MODES = {  # 1_Pooling/config.json's flags -> the embedding rule's pooling
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "last",
}
POOLING_NAMES = {"mean": "mean_tokens", "cls": "cls_token", "max": "max_tokens"}  # (6.0's)
STEP_OUTPUTS = ("token_embeddings", "last_hidden_state")  # what 1_Pooling pools
# RoBERTa-style position tables start past the padding index: two of their rows are not
# positions a text can reach.
POSITION_OFFSET = {"roberta": 2, "xlm-roberta": 2, "camembert": 2, "mpnet": 2, "longformer": 2}
# sentence-transformers' module class names, as modules.json names them: before 6.0 all in
# this package; since, each in its own (`...base.modules.normalize.Normalize`): read by class.
MODULE = "sentence_transformers.models."


@dataclass(frozen=True)
class Export:
    """What an export folder says, read and checked."""

    onnx_path: Path
    weights: list[Path]  # the files beside it that hold its weights (external data)
    tokenizer_path: Path
    inputs: dict[str, str]  # name -> role
    outputs: list[str]
    vocab_size: int
    pad_id: int
    max_length: int
    embedding: dict[str, Any] | None
    notes: list[str]  # what the folder left out, said to the user
    classifier: dict[str, Any] | None = None
    sparse: bool = False  # a masked-LM's logits, pooled as SPLADE pools them
    token_labels: list[str] | None = None  # a token classifier's labels
    prompts: dict[str, str] | None = None  # sentence-transformers' named prompts
    multi_vector: str | None = None  # a late-interaction model's per-token output (ColBERT)
    head: Head | None = None  # pooling and Dense modules to fold into the graph
    read: tuple[str, ...] = ()  # what was read, from which file: the config's heading


def _onnx_file(folder: Path) -> Path:
    """The folder's ONNX graph: model.onnx at the top (optimum) or in onnx/
    (sentence-transformers), else the one .onnx file either holds; ConfigError naming the
    candidates when there are several, or saying there is none."""
    for candidate in (folder / MODEL_FILE, folder / "onnx" / MODEL_FILE):
        if candidate.is_file():
            return candidate
    found = sorted([*folder.glob("*.onnx"), *(folder / "onnx").glob("*.onnx")])
    if len(found) == 1:
        return found[0]
    if found:
        names = ", ".join(str(f.relative_to(folder)) for f in found)
        raise ConfigError(
            f"{folder}: {len(found)} ONNX files and no {MODEL_FILE} ({names}): import the one "
            f"to serve from a folder that holds it alone, or name it {MODEL_FILE}"
        )
    if weights_of(folder):
        raise ConfigError(
            f"{folder}: weights ({weights_of(folder)[0].name}) and no ONNX file: `bucketserve "
            "models import` exports it when the export extra is installed (pip install "
            f"'bucketserve[export]'); or export it with optimum: {optimum_command(folder)}, "
            "then import that folder"
        )
    raise ConfigError(
        f"{folder}: no ONNX file (optimum writes {MODEL_FILE} at the top, sentence-transformers "
        "in onnx/): export the model to ONNX first"
    )


WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
# optimum's task for what config.json's `architectures` name (else the per-token states)
TASKS = {
    "ForSequenceClassification": "text-classification",
    "ForTokenClassification": "token-classification",
    "ForMaskedLM": "fill-mask",
}


def weights_of(folder: Path) -> list[Path]:
    """The weights files of a Hugging Face model folder that holds no ONNX graph (what the
    Hub holds for most models, and what TEI loads): empty when it has a graph or no weights."""
    graphs = [*folder.glob("*.onnx"), *(folder / "onnx").glob("*.onnx")]
    return [] if graphs else [folder / w for w in WEIGHTS if (folder / w).is_file()]


def task_of(folder: Path) -> str:
    """optimum's export task of the model in `folder`, by its config.json."""
    model_config = read_json(folder / "config.json")
    kinds = [task for kind, task in TASKS.items() if _is(model_config, kind)]
    return kinds[0] if kinds else "feature-extraction"


def optimum_command(folder: Path) -> str:
    """The one command that exports `folder` to ONNX with optimum, beside it."""
    return (
        f"optimum-cli export onnx --model {folder} --task {task_of(folder)} "
        f"{folder.with_name(folder.name + '-onnx')}"
    )


def read_export(folder: Path) -> Export:
    """The folder's files, read into what the config will say; ConfigError naming the file
    when something needed is missing or wrong."""
    if not folder.is_dir():
        raise ConfigError(f"{folder}: not a folder")
    onnx_path = _onnx_file(folder)
    places = (folder / "tokenizer.json", onnx_path.parent / "tokenizer.json")
    tokenizer_path = next((p for p in places if p.is_file()), None)
    if tokenizer_path is None:
        raise ConfigError(f"{folder}: no tokenizer.json (a fast tokenizer's file is needed)")
    model_config = read_json(folder / "config.json")
    notes: list[str] = []
    graph = onnx.load(str(onnx_path), load_external_data=False)
    initialised = {init.name for init in graph.graph.initializer}
    names = [i.name for i in graph.graph.input if i.name not in initialised]
    unknown = [n for n in names if n not in ROLES]
    if unknown or "input_ids" not in names:
        raise ConfigError(
            f"{onnx_path}: inputs {names}: import knows {sorted(ROLES)} (input_ids needed); "
            "write this model's config.toml by hand"
        )
    vocab_size = model_config.get("vocab_size")
    if not (folder / "config.json").is_file():  # (ids are the tokenizer's: its vocabulary)
        vocab_size = load_tokenizer(tokenizer_path, 1).get_vocab_size(with_added_tokens=True)
        notes.append(
            f"no config.json (transformers' config of the model): vocab_size {vocab_size} is "
            "tokenizer.json's, and no task head (labels, pooling) could be read"
        )
    elif not isinstance(vocab_size, int) or vocab_size <= 0:
        raise ConfigError(f"{folder / 'config.json'}: vocab_size: needed, a positive integer")
    outputs = [o.name for o in graph.graph.output]
    made_up = [name for name in outputs if "::" in name or name.startswith("/")]
    if made_up:  # (an exporter's own names for tensors the model's code did not name)
        notes.append(
            f"outputs {', '.join(map(repr, made_up))}: names the exporter made up, not the "
            "model's: served under them (quoted in config.toml); name them when you export"
        )
    classifier = _classifier(model_config, outputs)
    sparse = "logits" in outputs and _is(model_config, "ForMaskedLM")
    tagger = "logits" in outputs and _is(model_config, "ForTokenClassification")
    colbert = _late_interaction(folder, outputs)
    read: list[str] = []
    embedding, head = None, None
    if not (classifier or sparse or tagger or colbert):
        embedding, head = _embedding(folder, outputs, names, notes, read)
    prompts = _prompts(folder)
    if prompts:
        read.append(f"prompts: {', '.join(prompts)} (config_sentence_transformers.json)")
    pad_id, pad_said = _pad(folder, model_config, tokenizer_path)
    read.append(f"pad: {pad_said}")
    return Export(
        onnx_path,
        _external_files(graph, onnx_path.parent),
        tokenizer_path,
        {name: ROLES[name] for name in names},
        [*outputs, POOLED_OUTPUT] if head else outputs,
        vocab_size,
        pad_id,
        _max_length(folder, model_config),
        embedding,
        notes,
        classifier,
        sparse,
        _labels(model_config) if tagger else None,
        prompts,
        colbert,
        head,
        tuple(read),
    )


def _pad(folder: Path, model_config: dict[str, Any], tokenizer_path: Path) -> tuple[int, str]:
    """The id rows are padded with, and where it was read: config.json's `pad_token_id`
    (RoBERTa's is 1), else the tokenizer's pad token (tokenizer_config.json's `pad_token`:
    Qwen3-Embedding's config has none and its tokenizer pads with `<|endoftext|>`), else
    tokenizer.json's padding, else 0 (read behind the mask only)."""
    said = model_config.get("pad_token_id")
    if isinstance(said, int) and not isinstance(said, bool) and said >= 0:
        return said, f"id {said} (config.json's pad_token_id)"
    token = read_json(folder / "tokenizer_config.json").get("pad_token")
    token = token.get("content") if isinstance(token, dict) else token
    if isinstance(token, str):
        found = load_tokenizer(tokenizer_path, 1).token_to_id(token)
        if found is not None:
            return found, f"id {found}, {token} (tokenizer_config.json's pad_token)"
    padding = read_json(tokenizer_path).get("padding")
    if isinstance(padding, dict) and isinstance(padding.get("pad_id"), int):
        return int(padding["pad_id"]), f"id {padding['pad_id']} (tokenizer.json's padding)"
    return 0, "id 0: neither config.json nor the tokenizer names one (read behind the mask)"


def _late_interaction(folder: Path, outputs: list[str]) -> str | None:
    """The one output of a late-interaction export (ColBERT as PyLate writes it: a module
    list of a Transformer and a Dense projection, no pooling), or None for any other."""
    modules = [m for m in read_json(folder / "modules.json", list) if isinstance(m, dict)]
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds[:1] != ["Transformer"] or "Dense" not in kinds or "Pooling" in kinds:
        return None
    return outputs[0] if len(outputs) == 1 else None


def _prompts(folder: Path) -> dict[str, str] | None:
    """config_sentence_transformers.json's named prompts (e5's query = 'query: '), or
    PyLate's query and document prefixes, if any."""
    config = read_json(folder / "config_sentence_transformers.json")
    prompts = config.get("prompts")
    named = {str(k): v for k, v in prompts.items()} if isinstance(prompts, dict) else {}
    for kind in ("query", "document"):
        named.setdefault(kind, config.get(f"{kind}_prefix"))
    found = {name: text for name, text in named.items() if isinstance(text, str) and text}
    return found or None


def _is(model_config: dict[str, Any], kind: str) -> bool:
    """Whether config.json's `architectures` name a model of `kind` (ForSequenceClassification)."""
    return any(str(a).endswith(kind) for a in model_config.get("architectures") or [])


ACTIVATIONS = {  # a CrossEncoder's activation_fn, and transformers' problem_type
    "Sigmoid": "sigmoid",
    "Identity": "none",
    "Softmax": "softmax",
    "multi_label_classification": "sigmoid",
    "single_label_classification": "softmax",
    "regression": "none",
}


def _labels(model_config: dict[str, Any]) -> list[str]:
    """The labels' names in order, from `id2label` (else LABEL_0...)."""
    id2label = model_config.get("id2label") or {}
    count = len(id2label) or int(model_config.get("num_labels") or 2)
    return [str(id2label.get(str(i), f"LABEL_{i}")) for i in range(count)]


def _classifier(model_config: dict[str, Any], outputs: list[str]) -> dict[str, Any] | None:
    """The classifier a sequence classification export is, or None for any other."""
    if "logits" not in outputs or not _is(model_config, "ForSequenceClassification"):
        return None
    labels = _labels(model_config)
    count = len(labels)
    cross_encoder = model_config.get("sentence_transformers") or {}
    said = str(cross_encoder.get("activation_fn") or model_config.get("problem_type") or "")
    activation = ACTIVATIONS.get(said.rsplit(".", 1)[-1])
    rule: dict[str, Any] = {"output": "logits", "labels": labels}
    if activation is not None:
        rule["activation"] = activation
    if count == 1:  # a cross-encoder's relevance, or a one-label score
        rule["rerank_label"] = 0
    return rule


def _max_length(folder: Path, model_config: dict[str, Any]) -> int:
    """Texts are cut to sentence-transformers' `max_seq_length` (sentence_bert_config.json's,
    or since 6.0 the tokenizer's `model_max_length`), else to the positions the model has."""
    bert = read_json(folder / "sentence_bert_config.json")
    if isinstance(bert.get("max_seq_length"), int) and bert["max_seq_length"] > 0:
        return int(bert["max_seq_length"])
    positions = model_config.get("max_position_embeddings")
    if not isinstance(positions, int) or positions <= 0:
        raise ConfigError(
            f"{folder}: neither sentence_bert_config.json's max_seq_length nor config.json's "
            "max_position_embeddings says how long a text may be"
        )
    reachable = positions - POSITION_OFFSET.get(str(model_config.get("model_type")), 0)
    # (a tokenizer that sets no limit says 10^30, transformers' "very large")
    tokenizers = read_json(folder / "tokenizer_config.json").get("model_max_length")
    shorter = isinstance(tokenizers, int) and 0 < tokenizers < reachable
    return int(tokenizers) if shorter else reachable


def _embedding(
    folder: Path, outputs: list[str], inputs: list[str], notes: list[str], read: list[str]
) -> tuple[dict[str, Any] | None, Head | None]:
    """The embedding rule the folder prescribes and the head to fold into the graph for it
    (where Dense modules follow the pooling), or None (with a note saying why); what was read
    goes to `read`."""
    modules = [m for m in read_json(folder / "modules.json", list) if isinstance(m, dict)]
    types = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    normalize = "Normalize" in types
    if POOLED_OUTPUT in outputs:
        read.append(f"embedding: the graph's own {POOLED_OUTPUT}, as the export computed it")
        read += ["Normalize: applied"] if normalize else []
        return {"output": POOLED_OUTPUT, "pooling": "none", "normalize": normalize}, None
    step_output = next((o for o in STEP_OUTPUTS if o in outputs), None)
    pooling_path = next(
        (m.get("path") for m in modules if str(m.get("type", "")).endswith("Pooling")), None
    )
    pooling_file = f"{pooling_path or '1_Pooling'}/config.json"
    pooling_config = read_json(folder / pooling_file)
    if step_output is None or not pooling_config:
        notes.append(
            "no embedding: the folder has no sentence_embedding output, or no pooling config "
            "(1_Pooling/config.json) for its per-token states; add [embedding] by hand"
        )
        return None, None
    after = types[types.index("Pooling") + 1 :] if "Pooling" in types else []
    left = [t for t in types if t not in ("Transformer", "Pooling", "Normalize", "Dense")]
    if left or "Normalize" in after[:-1] or "Dense" in types[: len(types) - len(after)]:
        notes.append(
            f"no embedding: the module list has {left or types} after pooling, which the ONNX "
            "graph does not hold and import does not fold (Dense, then Normalize, it does)"
        )
        return None, None
    chosen = _pooling_modes(pooling_config)
    if len(chosen) != 1 or chosen[0] not in POOLING_MODES:
        notes.append(
            f"no embedding: pooling {chosen or 'none'}; one of {sorted(POOLING_MODES)} is served"
        )
        return None, None
    pooling = POOLING_MODES[chosen[0]]
    read.append(f"pooling: {pooling} ({pooling_file})")
    dense_paths = [
        str(m.get("path", "")) for m, t in zip(modules, types, strict=True) if t == "Dense"
    ]
    head = None
    if dense_paths:
        head = head_of(folder, step_output, pooling, pooling_config, inputs, dense_paths, notes)
        if head is None:
            return None, None
        layers = ", ".join(described(d) for d in head.dense)
        read.append(f"Dense: {layers}, folded with the pooling into the graph's {POOLED_OUTPUT}")
    read += ["Normalize: applied"] if normalize else []
    if head is not None:
        return {"output": POOLED_OUTPUT, "pooling": "none", "normalize": normalize}, head
    return {"output": step_output, "pooling": pooling, "normalize": normalize}, None


def _pooling_modes(pooling_config: dict[str, Any]) -> list[str]:
    """The pooling modes 1_Pooling/config.json turns on, as `pooling_mode_*` flags (before
    sentence-transformers 6.0) or as its `pooling_mode`, a name or a list (since)."""
    named = pooling_config.get("pooling_mode")
    if isinstance(named, str | list):
        names = [named] if isinstance(named, str) else named
        return [f"pooling_mode_{POOLING_NAMES.get(str(n), str(n))}" for n in names]
    return [f for f, on in pooling_config.items() if f.startswith("pooling_mode_") and on is True]


def config_text(export: Export, source: Path) -> str:
    """The entry's config.toml."""
    edges = bucket_edges(export.max_length)
    lines = [
        f"# Imported by `bucketserve models import` from the export folder {source.name}.",
        *(["# What it read there:"] if export.read else []),
        *(f"#   {line}" for line in export.read),
        "",
    ]
    for name, role in export.inputs.items():
        lines += [f"[inputs.{_key(name)}]", f'role = "{role}"']
        if role == "tokens":
            lines += [f"vocab_size = {export.vocab_size}", f"pad_value = {export.pad_id}"]
        if role == "mask":  # (transformers' attention_mask: ones on the tokens, 0 at padding)
            lines += ["pad_value = 0"]
        lines.append("")
    for name in export.outputs:
        lines += [f"[outputs.{_key(name)}]", ""]
    if export.embedding is not None:
        rule = export.embedding
        lines += [
            "[embedding]",
            f'output = "{rule["output"]}"',
            f'pooling = "{rule["pooling"]}"',
            f"normalize = {str(rule['normalize']).lower()}",
            "",
        ]
    if export.classifier is not None:
        rule = export.classifier
        lines += [
            "[classifier]",
            f'output = "{rule["output"]}"',
            f"labels = {_toml(rule['labels'])}",
        ]
        lines += [f'activation = "{rule["activation"]}"'] if "activation" in rule else []
        lines += [f"rerank_label = {rule['rerank_label']}"] if "rerank_label" in rule else []
        lines.append("")
    if export.sparse:
        lines += ["[sparse]", 'output = "logits"', 'pooling = "splade"', ""]
    if export.prompts:
        lines.append("[prompts]")
        lines += [
            f"{json.dumps(k)} = {json.dumps(v, ensure_ascii=False)}"
            for k, v in export.prompts.items()
        ]
        lines.append("")
    if export.multi_vector is not None:  # (ColBERT's vectors are normalised)
        lines += ["[multi_vector]", f'output = "{export.multi_vector}"', "normalize = true", ""]
    if export.token_labels is not None:
        lines += ["[token_classifier]", 'output = "logits"']
        lines += [f"labels = {_toml(export.token_labels)}", ""]
    lines += [
        "[batching]",
        f"buckets = {edges}",
        "max_batch_size = 16",
        f"max_batch_tokens = {max(4096, edges[-1])}",
        "max_queue_delay_ms = 0",
        "",
        "[tokenizer]",
        'file = "tokenizer.json"',
        f"max_length = {export.max_length}",
        "",
    ]
    return "\n".join(lines)


def _key(name: str) -> str:
    """A graph's tensor name as a TOML key: bare where TOML allows it, else quoted (an
    exporter's `onnx::Shape_422`)."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def _toml(strings: list[str]) -> str:
    """A list of strings as TOML writes it (JSON's escapes are TOML's basic strings')."""
    return "[" + ", ".join(json.dumps(s, ensure_ascii=False) for s in strings) + "]"


def _external_files(graph: onnx.ModelProto, folder: Path) -> list[Path]:
    """The files an ONNX graph keeps its weights in beside it (external data)."""
    locations = set()
    for init in graph.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            locations |= {e.value for e in init.external_data if e.key == "location"}
    return [folder / location for location in sorted(locations)]


def entry_name(folder: Path) -> str:
    """A repository name from the folder's: lower case, [a-z0-9._-] only."""
    name = re.sub(r"[^a-z0-9._-]+", "-", folder.resolve().name.lower()).strip("-.")
    if not name:
        raise ConfigError(f"{folder}: no name can be made of it; give one with --name")
    return name


@dataclass(frozen=True)
class Imported:
    entry: Path
    config: str
    model: Model
    notes: list[str]


def import_model(
    folder: Path,
    models: Path,
    name: str | None = None,
    memory_budget: str | None = None,
    verify: Callable[[int], str] | None = None,
) -> Imported:
    """Write the entry `models/<name>` (config.toml, 1/model.onnx with its weights, 1/
    tokenizer.json) and load it as the server would at start, within the memory budget
    (`memory_budget`, as --memory-budget says it; default: what the machine or container
    leaves): a model whose context is longer than a batch of one fits is imported at the
    longest length that fits, and said. `verify`: a check of the export up to the length
    imported (a note back, or ConfigError). When it does not load, nothing is left behind
    and ConfigError says why."""
    export = read_export(folder)
    name = name or entry_name(folder)
    entry = models / name
    if entry.exists():
        raise ConfigError(f"{entry}: already in the repository; choose another --name")
    config = config_text(export, folder)
    models.mkdir(parents=True, exist_ok=True)
    # Written aside, under a name the server skips (no config.toml yet), then moved in whole.
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=models))
    notes = list(export.notes)
    try:
        version = staging / "1"
        version.mkdir()
        fused = _fused(export, staging / "fused") if export.max_length > FUSED_FROM else None
        if fused is not None:
            notes.append(fused[1])
        if export.head is not None:
            fold(fused[0] if fused else export.onnx_path, export.head, version / MODEL_FILE)
        elif fused is not None:
            shutil.copyfile(fused[0], version / MODEL_FILE)
            shutil.copyfile(fused[0].with_name(fused[0].name + ".data"), version / DATA_FILE)
        else:
            shutil.copyfile(export.onnx_path, version / MODEL_FILE)
            for weights in export.weights:
                target = version / weights.relative_to(export.onnx_path.parent)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(weights, target)
        shutil.rmtree(staging / "fused", ignore_errors=True)
        shutil.copyfile(export.tokenizer_path, version / "tokenizer.json")
        (staging / CONFIG_FILE).write_text(config, encoding="utf-8")
        staging.rename(entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    try:
        spec = load_model_spec(entry)
        assert spec is not None  # (it has a version folder)
        budget = room.memory_budget(Settings(memory_budget=memory_budget), [spec])
        fits = room.Room(
            budget.total,
            room.footprint_of(spec, spec.config.binding, default_cache_dir(), budget.total),
        )
        longest = fits.longest(spec)
        if longest < export.max_length:
            notes.append(_cut_note(export.max_length, longest, fits, budget))
            export = dataclasses.replace(export, max_length=longest)
            config = config_text(export, folder)
            (entry / CONFIG_FILE).write_text(config, encoding="utf-8")
            spec = load_model_spec(entry)
            assert spec is not None
        if verify is not None:
            notes.append(verify(longest))
        model = build_model(spec, budget=budget.total)
    except BaseException:
        shutil.rmtree(entry, ignore_errors=True)
        raise
    return Imported(entry, config, model, notes)


def _fused(export: Export, scratch: Path) -> tuple[Path, str] | None:
    """The export with its attention on ONNX Runtime's flash path (`fusion`), where any of
    it fuses and the copy answers as the export: the copy, and what import says of it."""
    report = fuse_attention(export.onnx_path, scratch / MODEL_FILE)
    if report is None:
        return None
    left = f"; {len(report.left)} left as exported ({report.left[0]})" if report.left else ""
    return scratch / MODEL_FILE, (
        f"attention of {report.fused} layer{'s' * (report.fused != 1)} runs on ONNX Runtime's "
        "flash path, which holds no "
        f"length x length scores{left}; it answers within {report.largest_difference:.2g} of "
        "the export"
    )


def _cut_note(declared: int, longest: int, fits: room.Room, budget: MemoryBudget) -> str:
    """What import says of a context cut to what the memory budget allows, and the fix."""
    assert fits.footprint is not None
    assert budget.total is not None
    need = fits.footprint.need(1, declared)
    return (
        f"the model takes {declared} tokens, but one text that long would need about "
        f"{need / 2**30:.1f} GiB to run, more than the memory budget here "
        f"({budget.total / 2**30:.2f} GiB, from {budget.source}): imported at {longest} "
        "tokens, the longest that fits. To serve longer texts, give the server more memory "
        "(--memory-budget, or the container's limit), then raise [tokenizer] max_length and "
        f"the last of [batching] buckets in config.toml (up to {declared})"
    )

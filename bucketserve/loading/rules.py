"""Each task's rule, built at load from its section of the model's config and checked against
the output it reads: one row a task in `RULES`, in `Task`'s order (a rule may read one built
before it: a per-token embedding serves `embed_all`, a classifier with a rerank label
`rerank`). A new task is its module in the core (its rule and its head), its row here, and its
route.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bucketserve.core.labels import Activation, Classifier
from bucketserve.core.layout import SAME_STEPS, Layout
from bucketserve.core.quantize import SCALED, EmbeddingType
from bucketserve.core.task import Task
from bucketserve.core.tasks.embedding import Embedding, Pooling
from bucketserve.core.tasks.fill_mask import MaskedLM
from bucketserve.core.tasks.sparse import MultiVector, SparsePooling, SparseRule
from bucketserve.errors import ConfigError
from bucketserve.loading.repository import ModelSpec


@dataclass(frozen=True)
class Sources:
    """What the rules are built from: the spec, its layout, and what its tokenizer says."""

    spec: ModelSpec
    layout: Layout
    special_tokens: Mapping[str, int]  # the tokenizer's, by their text ([CLS], [MASK]...)
    pad_id: int
    tokenizes: bool  # whether it takes text (its config names a tokenizer)

    @property
    def special_ids(self) -> tuple[int, ...]:
        """The vocabulary entries no answer of a text's tokens holds: the special tokens and
        the pad."""
        return tuple(sorted({*self.special_tokens.values(), self.pad_id}))


MASKS = ("[MASK]", "<mask>")  # the mask token of BERT's and of RoBERTa's tokenizers
# (the sources, the rules built so far) -> the task's rule, or None where it is not served
Rule = Callable[[Sources, dict[Task, Any]], Any]


def task_rules(sources: Sources) -> dict[Task, Any]:
    """The rule of each task the model serves beside its outputs, by task."""
    built: dict[Task, Any] = {}
    for task, build in RULES.items():
        rule = build(sources, built)
        if rule is not None:
            built[task] = rule
    return built


def embedding_of(spec: ModelSpec, layout: Layout) -> Embedding | None:
    """The config's `[embedding]`, checked against the output it names: one vector per
    sequence for pooling "none", one vector per step for the others."""
    config = spec.config.embedding
    if config is None:
        return None
    tensor = layout.output(config.output)
    row = [d for i, d in enumerate(tensor.dims) if i not in (tensor.batch_axis, tensor.time_axis)]
    pooling = Pooling(config.pooling)
    wanted = "one vector per sequence" if pooling is Pooling.NONE else "one vector per step"
    if len(row) != 1 or tensor.per_step == (pooling is Pooling.NONE):
        shape = ["T" if i == tensor.time_axis else d for i, d in enumerate(tensor.dims)]
        raise ConfigError(
            f"model {spec.name}: embedding: pooling {pooling.value!r} needs {wanted}, but "
            f"output {tensor.name} is {shape} per batch"
        )
    width = row[0]
    widths = config.dimensions
    if isinstance(widths, list) and width is not None and max(widths) > width:
        raise ConfigError(
            f"model {spec.name}: embedding.dimensions: {max(widths)} is wider than the "
            f"embedding ({width})"
        )
    dimensions = tuple(sorted(set(widths))) if isinstance(widths, list) else widths or ()
    answer_type = EmbeddingType(config.answer_type)
    if answer_type in SCALED and spec.tokenizer_path is None:
        raise ConfigError(
            f"model {spec.name}: embedding.answer_type: {answer_type.value} scales over ranges "
            "fitted on texts, and this model has no tokenizer to read them: answer float, "
            "binary or ubinary"
        )
    return Embedding(
        config.output, pooling, config.normalize, width, dimensions, answer_type=answer_type
    )


def classifier_of(spec: ModelSpec, layout: Layout) -> Classifier | None:
    """The config's `[classifier]`, checked against the output it names: one row of logits
    per sequence, as wide as the labels named, the rerank label among them."""
    config = spec.config.classifier
    if config is None:
        return None
    field = functools.partial(ConfigError.at, spec.onnx_path)
    tensor = layout.output(config.output)
    row = [d for i, d in enumerate(tensor.dims) if i not in (tensor.batch_axis, tensor.time_axis)]
    if tensor.per_step or len(row) > 1:
        shape = ["T" if i == tensor.time_axis else d for i, d in enumerate(tensor.dims)]
        raise field(
            "classifier.output",
            f"output {tensor.name} is {shape} per batch: a classifier reads one row of logits "
            "per sequence",
        )
    width = row[0] if row else 1
    if width is None:
        raise field("classifier.output", f"output {tensor.name} leaves its width free")
    labels = _labels(spec, "classifier", config.labels, config.output, width)
    if config.rerank_label is not None and config.rerank_label >= width:
        raise field(
            "classifier.rerank_label", f"{config.rerank_label}: the labels are 0 to {width - 1}"
        )
    if config.activation is not None:
        activation = Activation(config.activation)
    else:
        activation = Activation.SIGMOID if width == 1 else Activation.SOFTMAX
    return Classifier(config.output, labels, activation, config.rerank_label)


def _labels(
    spec: ModelSpec, section: str, given: list[str] | None, output: str, width: int
) -> tuple[str, ...]:
    """A classifier's labels, one a logit (LABEL_0... unless named); ConfigError otherwise,
    or when the model takes no text."""
    labels = given or [f"LABEL_{i}" for i in range(width)]
    if len(labels) != width:
        raise ConfigError.at(
            spec.onnx_path,
            f"{section}.labels",
            f"{len(labels)} labels for output {output}'s {width} logits",
        )
    if spec.config.tokenizer is None:
        raise ConfigError.at(
            spec.onnx_path, section, "it reads texts: name the model's [tokenizer]"
        )
    return tuple(labels)


def _per_token_row(spec: ModelSpec, layout: Layout, section: str, output: str) -> int | None:
    """The width of a per-token output's row (None: no row dim), or ConfigError."""
    tensor = layout.output(output)
    row = [d for i, d in enumerate(tensor.dims) if i not in (tensor.batch_axis, tensor.time_axis)]
    if not tensor.per_step or len(row) > 1 or tensor.steps != SAME_STEPS:
        shape = ["T" if i == tensor.time_axis else d for i, d in enumerate(tensor.dims)]
        raise ConfigError.at(
            spec.onnx_path,
            f"{section}.output",
            f"output {output} is {shape} per batch: this reads one row per input token",
        )
    return row[0] if row else None


def sparse_of(spec: ModelSpec, layout: Layout, special_ids: tuple[int, ...]) -> SparseRule | None:
    """The config's `[sparse]`, checked against its output: SPLADE reads logits as wide as
    the vocabulary, token weights one number per token."""
    config = spec.config.sparse
    if config is None:
        return None
    width = _per_token_row(spec, layout, "sparse", config.output)
    pooling = SparsePooling(config.pooling)
    vocab = spec.config.inputs[spec.config.sequence_input].vocab_size
    if pooling is SparsePooling.SPLADE and width != vocab:
        raise ConfigError.at(
            spec.onnx_path,
            "sparse.output",
            f"splade reads logits over the vocabulary ({vocab}); output {config.output} has "
            f"{width} per token",
        )
    if pooling is SparsePooling.TOKEN_WEIGHTS and width not in (None, 1):
        raise ConfigError.at(
            spec.onnx_path,
            "sparse.output",
            f"token_weights reads one weight per token; output {config.output} has {width}",
        )
    return SparseRule(config.output, pooling, special_ids)


def multi_vector_of(
    spec: ModelSpec, layout: Layout, embedding: Embedding | None
) -> MultiVector | None:
    """The config's `[multi_vector]`, checked; else a per-token embedding output as it is."""
    config = spec.config.multi_vector
    if config is not None:
        _per_token_row(spec, layout, "multi_vector", config.output)
        return MultiVector(config.output, config.normalize)
    if embedding is not None and embedding.pooling is not Pooling.NONE:
        return MultiVector(embedding.output, normalize=False)
    return None


def token_classifier_of(spec: ModelSpec, layout: Layout) -> Classifier | None:
    """The config's `[token_classifier]`, checked: a row of logits per token, one a label."""
    config = spec.config.token_classifier
    if config is None:
        return None
    width = _per_token_row(spec, layout, "token_classifier", config.output)
    if width is None:
        raise ConfigError.at(
            spec.onnx_path,
            "token_classifier.output",
            f"output {config.output} gives one number per token, not a row of logits",
        )
    labels = _labels(spec, "token_classifier", config.labels, config.output, width)
    return Classifier(config.output, labels, Activation(config.activation))


def masked_lm_of(sources: Sources, sparse: SparseRule | None) -> MaskedLM | None:
    """A model served for SPLADE weights gives logits over the vocabulary at every token: a
    masked LM, which fills masks where its tokenizer has a mask token."""
    if sparse is None or sparse.pooling is not SparsePooling.SPLADE:
        return None
    mask = next((sources.special_tokens[m] for m in MASKS if m in sources.special_tokens), None)
    return None if mask is None else MaskedLM(sparse.output, mask)


def reranker_of(classifier: Classifier | None) -> Classifier | None:
    """A classifier that names a rerank label also reranks."""
    return classifier if classifier is not None and classifier.rerank_label is not None else None


RULES: dict[Task, Rule] = {
    Task.EMBED: lambda s, _: embedding_of(s.spec, s.layout),
    Task.EMBED_ALL: lambda s, built: multi_vector_of(s.spec, s.layout, built.get(Task.EMBED)),
    Task.EMBED_SPARSE: lambda s, _: sparse_of(s.spec, s.layout, s.special_ids),
    Task.CLASSIFY: lambda s, _: classifier_of(s.spec, s.layout),
    Task.CLASSIFY_TOKENS: lambda s, _: token_classifier_of(s.spec, s.layout),
    Task.RERANK: lambda s, built: reranker_of(built.get(Task.CLASSIFY)),
    Task.TOKENIZE: lambda s, _: True if s.tokenizes else None,
    Task.FILL_MASK: lambda s, built: masked_lm_of(s, built.get(Task.EMBED_SPARSE)),
}

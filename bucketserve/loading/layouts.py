"""From a spec, what the request path will read: the layout of every tensor (roles, dtypes,
batch and time axes, each output's steps; what the dim names leave open found by running the
model, `probe`), the rules one valid sequence follows (vocabulary, reserved ids, the shape of
a step, the shortest length), and the task heads' rules (embedding, classifiers, sparse
weights, vectors per token), each checked against the output it reads.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from bucketserve.core.classifier import Activation, Classifier
from bucketserve.core.embedding import Embedding, Pooling
from bucketserve.core.layout import SAME_STEPS, Input, InputRole, Layout, Tensor
from bucketserve.core.model import SequenceRules
from bucketserve.core.sparse import MultiVector, SparsePooling, SparseRule
from bucketserve.errors import ConfigError
from bucketserve.loading.axes import Axes
from bucketserve.loading.check import Run
from bucketserve.loading.probe import probe
from bucketserve.loading.repository import ModelSpec
from bucketserve.loading.signature import GraphTensor
from bucketserve.runtime.sessions import GraphFile, run_all, side_session


def _tensor(graph: GraphTensor, axes: Axes) -> Tensor:
    fixed = tuple(None if i in axes.free() else d for i, d in enumerate(graph.dims))
    return Tensor(graph.name, graph.dtype, fixed, axes.batch, axes.time)  # type: ignore[arg-type]


def _constant(graph: GraphTensor, value: float) -> Input:
    """A constant input: its whole shape fixed in the graph (a scalar, a [1]), no batch or
    time axis, `value` everywhere."""
    if not all(isinstance(d, int) for d in graph.dims):
        raise ConfigError(
            f"inputs.{graph.name}: a constant input's dims are fixed; got {list(graph.dims)}"
        )
    tensor = Tensor(graph.name, graph.dtype, tuple(graph.dims), batch_axis=None)  # type: ignore[arg-type]
    return Input(tensor, InputRole.CONSTANT, value)


@dataclass(frozen=True)
class Served:
    """What the request path reads of a model, from its graph and from running it."""

    layout: Layout
    rules: SequenceRules
    single: str | None  # why it must run one sequence at a time, if it must (`probe`)


def layout_of(spec: ModelSpec, run: Run) -> Served:
    """The request path's view of the graph's tensors (roles, dtypes, batch and time axes,
    each output's steps) and the rules a sequence follows, from the graph and from running the
    model (`run`, a plain run of every output)."""
    sig, axes, config = spec.signature, spec.axes, spec.config
    inputs = tuple(
        _constant(sig.inputs[name], cfg.value)
        if cfg.value is not None
        else Input(
            _tensor(sig.inputs[name], axes.inputs[name]),
            cfg.role,
            cfg.fill if cfg.role is InputRole.STATE else cfg.pad_value,
        )
        for name, cfg in config.inputs.items()
    )
    rules = sequence_rules(spec)
    found = probe(spec, run, Layout(inputs, ()), rules)
    layout = Layout(inputs, tuple(found.outputs[name] for name in config.outputs))
    rules = dataclasses.replace(rules, min_length=found.min_length, multiple=found.multiple)
    return Served(layout, rules, found.single)


def layout_alone(spec: ModelSpec) -> Served:
    """`layout_of`, running the model on a session of its own (benchmarks, tests)."""
    session = side_session(GraphFile(spec.onnx_path, tuple(spec.config.providers)))
    return layout_of(spec, functools.partial(run_all, session))


def sequence_rules(spec: ModelSpec) -> SequenceRules:
    """What a valid sequence is for this model, checked at the edge."""
    config = spec.config
    name = config.sequence_input
    cfg, tensor = config.inputs[name], spec.signature.inputs[name]
    axes = spec.axes.inputs[name]
    if cfg.role is InputRole.FEATURES:
        step = tuple(int(d) for i, d in enumerate(tensor.dims) if i not in axes.free())  # type: ignore[arg-type]
        row = _tensor(tensor, axes)
        return SequenceRules(
            tensor.dtype, config.batching.longest, step_shape=step, time_axis=row.row_time_axis
        )
    return SequenceRules(
        tensor.dtype,
        config.batching.longest,
        vocab_size=cfg.vocab_size,
        reserved_ids=tuple(reserved_ids(spec)),
    )


def reserved_ids(spec: ModelSpec) -> list[int]:
    """Token ids refused inside a sequence: the config's, or by default the pad id when no mask
    or lengths input tells the model where padding is (then the pad id is how it knows)."""
    cfg = spec.config.inputs[spec.config.sequence_input]
    if cfg.reserved_ids is not None:
        return sorted(set(cfg.reserved_ids))
    told = {InputRole.MASK, InputRole.LENGTHS} & {i.role for i in spec.config.inputs.values()}
    return [] if told else [int(cfg.pad_value)]


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
    return Embedding(config.output, pooling, config.normalize, width, dimensions)


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

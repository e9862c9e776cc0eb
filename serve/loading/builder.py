"""The builder: a model spec becomes a ready model, and a repository an engine.

spec -> layout and rules (what the request path reads) -> the pad-safety check -> the bucket
plan -> an executor over the graph -> the keys the config asks for bound and warm -> `Model`.
`load_engine` does it for every model of a repository, after sizing ONNX Runtime's threads.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from pydantic import ValidationError
from tokenizers import Tokenizer

from serve.bucketing import BucketPlan
from serve.engine import Engine
from serve.errors import ConfigError
from serve.layout import Input, InputRole, Layout, Tensor
from serve.loading.check import is_pad_sensitive
from serve.loading.config import BatchingConfig
from serve.loading.repository import ModelSpec, load_repository
from serve.loading.signature import TensorSpec
from serve.model import Model, ModelInfo, SequenceRules
from serve.runtime.executors import make_executor
from serve.runtime.sessions import GraphFile, init_process, runs_on_cpu, thread_layout
from serve.settings import Settings

log = logging.getLogger(__name__)


def load_tokenizer(path: Path, max_length: int) -> Tokenizer:
    """The tokenizer, with any padding it carries turned off and truncation at `max_length`.

    (all-MiniLM's tokenizer.json pads every text to 128: that would make every request cost
    128 tokens whatever its length.)
    """
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    return tokenizer


def layout_of(spec: ModelSpec) -> Layout:
    """The request path's view of the graph's tensors: roles, dtypes, batch and time axes."""
    sig = spec.signature

    def tensor(t: TensorSpec) -> Tensor:
        time_axis = t.dims.index(sig.time_dim) if sig.time_dim in t.dims else None
        fixed = tuple(d if isinstance(d, int) else None for d in t.dims)
        return Tensor(t.name, t.dtype, fixed, t.dims.index(sig.batch_dim), time_axis)

    inputs = tuple(
        Input(
            tensor(sig.inputs[name]),
            cfg.role,
            cfg.fill if cfg.role is InputRole.STATE else cfg.pad_value,
        )
        for name, cfg in spec.config.inputs.items()
    )
    return Layout(inputs, tuple(tensor(sig.outputs[name]) for name in spec.config.outputs))


def sequence_rules(spec: ModelSpec) -> SequenceRules:
    """What a valid sequence is for this model, checked at the edge."""
    name = spec.config.sequence_input
    cfg, tensor = spec.config.inputs[name], spec.signature.inputs[name]
    feature_dim = tensor.dims[2] if cfg.role is InputRole.FEATURES else None
    assert feature_dim is None or isinstance(feature_dim, int)
    return SequenceRules(
        dtype=tensor.dtype,
        max_length=spec.config.batching.longest,
        vocab_size=cfg.vocab_size if cfg.role is InputRole.TOKENS else None,
        feature_dim=feature_dim,
    )


def graph_file(spec: ModelSpec) -> GraphFile:
    sig = spec.signature
    return GraphFile(
        spec.onnx_path, tuple(spec.config.providers), (sig.batch_dim,), (sig.time_dim,)
    )


def build_model(spec: ModelSpec, strategy: str | None = None) -> Model:
    """Load `spec`: pad-safety check, then the executor, then bind and warm the keys that the
    config asks for. `strategy` overrides the config's mode/binding (tests, benchmarks)."""
    config = spec.config
    layout, rules, graph = layout_of(spec), sequence_rules(spec), graph_file(spec)
    pad_sensitive = (
        config.pad_sensitive
        if config.pad_sensitive is not None
        else is_pad_sensitive(spec.name, graph, layout, rules)
    )
    batching = config.batching
    plan = BucketPlan(
        tuple(batching.edges),
        batching.max_batch_size,
        batching.max_batch_tokens,
        exact_lengths=pad_sensitive,
    )
    strategy = strategy or (config.binding if config.mode == "bucketing" else "mutable")
    if pad_sensitive:
        strategy = "mutable"  # batches of one exact length run at that length: no padding
    executor = make_executor(strategy, graph, layout, plan)
    tokenizer = (
        load_tokenizer(spec.tokenizer_path, config.tokenizer.max_length)
        if spec.tokenizer_path is not None and config.tokenizer is not None
        else None
    )
    info = ModelInfo(
        name=spec.name,
        version=spec.version,
        layout=layout,
        plan=plan,
        rules=rules,
        max_queue_delay_s=batching.max_queue_delay_ms / 1000,
        queue_capacity=batching.queue_capacity,
        pad_sensitive=pad_sensitive,
        served_config={
            "name": spec.name,
            "version": str(spec.version),
            "strategy": executor.strategy,
            "pad_sensitive": pad_sensitive,
            **config.model_dump(mode="json"),
        },
    )
    model = Model(info, executor, tokenizer)
    keys = plan.all_keys() if batching.prepare == "all" and not pad_sensitive else []
    for key in [plan.default_key, *keys]:
        model.prepare(key)
    log.info(
        "model %s v%d: %s, keys %s bound, providers %s%s",
        spec.name,
        spec.version,
        executor.strategy,
        ", ".join(map(str, sorted(executor.bound_keys))),
        executor.providers,
        ", pad-sensitive" if pad_sensitive else "",
    )
    return model


def apply_overrides(spec: ModelSpec, settings: Settings) -> ModelSpec:
    """Settings that override every model's batching (benchmarks: no batching, other delays)."""
    update: dict[str, object] = {}
    if settings.max_batch_size is not None:
        update["max_batch_size"] = settings.max_batch_size
    if settings.max_queue_delay_ms is not None:
        update["max_queue_delay_ms"] = settings.max_queue_delay_ms
    if settings.buckets is not None:
        update["buckets"] = sorted(int(e) for e in settings.buckets.split(","))
    if not update:
        return spec
    try:
        batching = BatchingConfig.model_validate({**spec.config.batching.model_dump(), **update})
    except ValidationError as exc:
        raise ConfigError(f"settings override for model {spec.name}: {exc}") from None
    return dataclasses.replace(spec, config=spec.config.model_copy(update={"batching": batching}))


def load_engine(settings: Settings | Path | str = "models") -> Engine:
    """Every model of a repository (a folder, or full settings) ready, in an engine."""
    if not isinstance(settings, Settings):
        settings = Settings(models=Path(settings))
    repository = load_repository(settings.models, settings.default_model)
    instances, threads = thread_layout(
        settings.instances,
        settings.intra_op_threads,
        all(runs_on_cpu(spec.config.providers) for spec in repository.models.values()),
    )
    init_process(threads)  # before the first session: the pool is the process's
    models = {
        name: build_model(apply_overrides(spec, settings), settings.strategy)
        for name, spec in repository.models.items()
    }
    return Engine(models, repository.default_model, settings, instances)

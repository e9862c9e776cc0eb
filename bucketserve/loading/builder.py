"""The builder: a model spec becomes a ready model, and a repository an engine.

spec -> the file its sessions load (for session-per-key, written once so they share weights)
-> a load-time session -> layout and rules (`layouts`) -> the invariance check and the policy
it allows -> the bucket plan -> an executor (and, on a CPU, a second one on every core for a
batch that runs alone, when it answers as the first) -> the keys the config asks for bound and
warm -> `Model`. `load_engine` does it for every model of a repository, after sizing ONNX
Runtime's threads.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from tokenizers import Tokenizer

from bucketserve.core.bucketing import BucketPlan, Invariance, Policy
from bucketserve.core.engine import Engine
from bucketserve.core.layout import Layout
from bucketserve.core.model import Model, ModelInfo, SequenceRules
from bucketserve.errors import ConfigError
from bucketserve.loading.check import Run, measure, thread_difference
from bucketserve.loading.config import BatchingConfig
from bucketserve.loading.layouts import Served, embedding_of, layout_of
from bucketserve.loading.pad_safe import pad_safe_spec
from bucketserve.loading.report import log_verdict, pad_safe_report, served_config
from bucketserve.loading.repository import (
    CONFIG_FILE,
    ModelSpec,
    load_model_specs,
    load_repository,
    model_folders,
    not_loaded,
)
from bucketserve.loading.served_file import default_cache_dir, served_graph
from bucketserve.runtime.binding import run_bound
from bucketserve.runtime.executors import Executor, make_executor
from bucketserve.runtime.sessions import (
    GraphFile,
    Session,
    create_session,
    init_process,
    lone_threads,
    own_pools_allowed,
    return_freed_memory,
    run_all,
    runs_on_cpu,
    thread_layout,
)
from bucketserve.runtime.weights import SharedWeights
from bucketserve.settings import Settings
from bucketserve.tracing import configured

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


def build_model(
    spec: ModelSpec,
    strategy: str | None = None,
    cache_dir: Path | None = None,
    lone_batch_threads: int | None = None,
) -> Model:
    """Load `spec`: the file its sessions share, its layout, the invariance check and the
    policy it allows, the executor, then bind and warm the keys that the config asks for.
    `strategy` overrides the config's mode and binding (tests, benchmarks); `cache_dir` is
    where session-per-key writes the weights its sessions share (default: the user's cache);
    `lone_batch_threads`: threads of the runner for a batch that runs alone (None: none)."""
    began = time.perf_counter()
    wanted = strategy or (spec.config.binding if spec.config.mode == "bucketing" else "mutable")
    cache = cache_dir or default_cache_dir()
    checked = _checked(spec, wanted, cache)
    rewrite: dict[str, Any] | None = None
    if (
        checked.invariance.policy is Policy.EXACT_LENGTH
        and spec.config.batching.policy == "auto"
        and (safe := pad_safe_spec(spec, cache)) is not None
    ):
        again = _checked(safe[0], wanted, cache)
        rewrite = pad_safe_report(spec.name, safe[1], checked.invariance, again.invariance)
        if again.invariance.policy is Policy.BUCKETS:
            checked = again
    spec, graph, session = checked.spec, checked.graph, checked.session
    config, batching = spec.config, spec.config.batching
    layout, rules, served = checked.served.layout, checked.served.rules, checked.served
    invariance, failures, checked_s = checked.invariance, checked.failures, checked.seconds
    embedding = embedding_of(spec, layout)
    policy = invariance.policy if batching.policy == "auto" else Policy(batching.policy)
    if served.single is not None:  # no config makes a model batch that cannot
        policy = Policy.SINGLE
    log_verdict(spec.name, invariance, policy, batching.policy, failures, served.single)
    plan = BucketPlan(
        tuple(batching.edges), batching.max_batch_size, batching.max_batch_tokens, policy
    )
    # Unpadded batches (equal lengths, or one sequence) run at their own shape: one session
    # with buffers at the largest, whatever the config asked for.
    final = wanted if policy is Policy.BUCKETS else "mutable"
    static = wanted == "session-per-key"
    executor = make_executor(final, graph, layout, plan, None if static else session)
    lone = None
    if lone_batch_threads and not static and policy is Policy.BUCKETS:
        run = functools.partial(run_all, session)
        lone = lone_runner(spec, final, graph, layout, rules, plan, run, lone_batch_threads)
    tokenizer = (
        load_tokenizer(spec.tokenizer_path, config.tokenizer.max_length)
        if spec.tokenizer_path is not None and config.tokenizer is not None
        else None
    )
    described = served_config(  # (the providers in use: the load session's are the same)
        spec,
        layout,
        rules,
        executor.strategy,
        session.get_providers(),
        invariance,
        policy,
        failures,
        served.single,
    )
    if lone is not None:
        described["lone_batch_threads"] = lone_batch_threads
    if rewrite is not None:
        described["check"]["pad_safe"] = rewrite
    info = ModelInfo(
        name=spec.name,
        version=spec.version,
        layout=layout,
        plan=plan,
        rules=rules,
        max_queue_delay_s=batching.max_queue_delay_ms / 1000,
        queue_capacity=batching.queue_capacity,
        invariance=invariance,
        text_chars=config.tokenizer.chars if config.tokenizer is not None else None,
        served_config=described,
        embedding=embedding,
    )
    model = Model(info, executor, tokenizer, lone)
    keys = plan.all_keys() if batching.prepare == "all" and policy is Policy.BUCKETS else []
    for key in [plan.default_key, *keys]:
        model.prepare(key)
    loaded_s = time.perf_counter() - began
    described["load_seconds"] = {"total": round(loaded_s, 3), "check": round(checked_s, 3)}
    log.info(
        "model %s v%d: %s, keys %s bound, providers %s; loaded in %.2f s (the check %.2f s)",
        spec.name,
        spec.version,
        executor.strategy,
        ", ".join(map(str, sorted(executor.bound_keys))),
        executor.providers,
        loaded_s,
        checked_s,
    )
    return model


@dataclass(frozen=True)
class _Checked:
    """A spec with its served file, load session, layout and what the check measured."""

    spec: ModelSpec
    graph: GraphFile
    session: Session
    served: Served
    invariance: Invariance
    failures: list[str]
    seconds: float  # the check's


def _checked(spec: ModelSpec, strategy: str, cache_dir: Path) -> _Checked:
    """The file `spec`'s sessions load, one session on it for load time, the layout found by
    running it, and the invariance check."""
    static = strategy == "session-per-key"
    graph = served_graph(spec, cache_dir, static)
    # One session for what load time runs (probes, the check). Session-per-key shares the
    # memmapped weights, so this one does too (no private copy); otherwise it is the session
    # the executor keeps.
    session = create_session(graph, weights=SharedWeights(graph.path) if static else None)
    run = functools.partial(run_all, session)
    served = layout_of(spec, run)
    began = time.perf_counter()
    invariance, failures = measure(
        spec.name,
        run,
        functools.partial(run_bound, session, served.layout),
        served.layout,
        served.rules,
        spec.config.batching.edges,
        spec.config.batching.tolerance,
        batched=served.single is None,
    )
    seconds = time.perf_counter() - began
    return _Checked(spec, graph, session, served, invariance, failures, seconds)


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


def lone_runner(
    spec: ModelSpec,
    strategy: str,
    graph: GraphFile,
    layout: Layout,
    rules: SequenceRules,
    plan: BucketPlan,
    run: Run,
    threads: int,
) -> Executor | None:
    """A second executor of `strategy`, on a session with `threads` of its own, for a batch
    that runs alone; None, and a warning, unless its answers stay within the model's tolerance
    of the load session's (a thread count may change how a kernel splits its sums)."""
    if not runs_on_cpu(list(graph.providers)) or not own_pools_allowed():
        return None
    wide = create_session(graph, threads=threads)
    difference = thread_difference(spec.name, run, functools.partial(run_all, wide), layout, rules)
    if difference > spec.config.batching.tolerance:
        log.warning(
            "model %s: on %d threads its answers move by %.3g (tolerance %.3g): a batch that "
            "runs alone stays on its one thread",
            spec.name,
            threads,
            difference,
            spec.config.batching.tolerance,
        )
        return None
    log.info(
        "model %s: a batch that runs alone gets %d threads (its answers within %.3g of one's)",
        spec.name,
        threads,
        difference,
    )
    return make_executor(strategy, graph, layout, plan, wide)


class Loader:
    """The repository's models built ready by name, every version its config serves: at
    start (`load_engine`), and whenever the engine loads one (model control)."""

    def __init__(self, settings: Settings, lone: int | None) -> None:
        self.settings = settings
        self.lone = lone  # threads of the runner for a batch that runs alone, if any
        self.root = settings.models

    @property
    def one_model(self) -> bool:
        """Whether the repository is one model's folder (its config.toml at the top)."""
        return (self.root / CONFIG_FILE).is_file()

    def folder(self, name: str) -> Path:
        return self.root if self.one_model else self.root / name

    def names(self) -> list[str]:
        """The models the folder holds now."""
        if self.one_model:
            return [self.settings.model_name or self.root.resolve().name]
        return [folder.name for folder in model_folders(self.root)]

    def load(self, name: str) -> dict[int, Model]:
        """Every served version of `name`, built, checked and warm; ConfigError says why not."""
        folder = self.folder(name)
        if not (folder / CONFIG_FILE).is_file():
            raise ConfigError(f"{folder}: no model {name!r} in the repository")
        specs = load_model_specs(folder, name)
        if not specs:
            raise ConfigError(f"{folder}: model {name} is not built")
        return {spec.version: self.build(spec) for spec in specs}

    def build(self, spec: ModelSpec) -> Model:
        settings = self.settings
        return build_model(
            apply_overrides(spec, settings), settings.strategy, settings.cache_dir, self.lone
        )

    def released(self) -> None:
        """A model was released: what its sessions held goes back to the system."""
        return_freed_memory()

    def fingerprint(self, name: str) -> tuple[tuple[str, int, int], ...]:
        """What changes when the model's files do: each file's path, size and mtime."""
        folder = self.folder(name)
        if not folder.is_dir():
            return ()
        files = (p for p in sorted(folder.rglob("*")) if p.is_file())
        return tuple(
            (str(p.relative_to(folder)), stat.st_size, stat.st_mtime_ns)
            for p, stat in ((p, p.stat()) for p in files)
        )


def load_engine(settings: Settings | Path | str = "models") -> Engine:
    """Every model of a repository (a folder, or full settings) ready, in an engine. Models
    that fail to load stop it, every one of them named in one error (all are tried, so that
    one start says all that must be fixed), unless `settings.allow_partial`: then the engine
    serves the others and reports those not ready, with why."""
    if not isinstance(settings, Settings):
        settings = Settings(models=Path(settings))
    repository = load_repository(
        settings.models, settings.default_model, partial=True, name=settings.model_name
    )
    instances, threads = thread_layout(
        settings.instances,
        settings.intra_op_threads,
        all(
            runs_on_cpu(spec.config.providers)
            for specs in repository.models.values()
            for spec in specs
        ),
    )
    init_process(threads)  # before the first session: the pool is the process's
    loader = Loader(settings, lone_threads(settings.lone_batch_threads, instances, threads))
    versions: dict[str, dict[int, Model]] = {}
    failed = dict(repository.failed)
    for name, specs in repository.models.items():
        try:
            versions[name] = {spec.version: loader.build(spec) for spec in specs}
        except Exception as exc:  # a ConfigError, or ONNX Runtime refusing the graph
            failed[name] = _load_error(specs[-1], exc)
            log.error("model %s did not load: %s", name, failed[name])
    if failed and not settings.allow_partial:
        raise not_loaded(failed, len(repository.models) + len(repository.failed))
    if not versions:
        raise ConfigError(f"{settings.models}: no model loaded ({'; '.join(failed.values())})")
    shown = {name: _relative(error, settings.models) for name, error in failed.items()}
    tracing = configured(settings.otlp_endpoint)
    return Engine(
        versions,
        repository.default_model,
        settings,
        instances,
        shown,
        tracing,
        loader if settings.model_control != "none" else None,
    )


def _relative(error: str, root: Path) -> str:
    """An error as the HTTP routes show it: paths from the repository, not the host's."""
    return error.replace(f"{root}/", "").replace(f"{root.resolve()}/", "")


def _load_error(spec: ModelSpec, exc: Exception) -> str:
    """What to tell the operator: a ConfigError says file, field and fix already; anything
    else is ONNX Runtime (or a bug, whose traceback goes to the log)."""
    if isinstance(exc, ConfigError):
        return exc.message
    log.error("model %s: loading raised", spec.name, exc_info=exc)
    return f"{spec.onnx_path}: ONNX Runtime could not load or run the model: {exc}"

"""Opening a repository: every model of it built ready into a registry, at start
(`open_repository`, and `load_engine` for the Python API), and one model built again by name
for model control (`Loader`). Every load that fails is worded once, here (`load_failure`),
whichever asked for it. Sits over the builder, which makes one model of one spec.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from bucketserve.core.budget import Hold, MemoryBudget
from bucketserve.core.engine import Engine
from bucketserve.core.model import Model
from bucketserve.core.registry import Registry
from bucketserve.errors import ConfigError, LoadFailed, ModelNotFound
from bucketserve.loading.builder import build_model
from bucketserve.loading.config import BatchingConfig
from bucketserve.loading.digests import Digests
from bucketserve.loading.fingerprint import fingerprint_of
from bucketserve.loading.lock import held_to, read_lock
from bucketserve.loading.repository import (
    CONFIG_FILE,
    ModelSpec,
    load_model_specs,
    load_repository,
    model_folders,
    not_loaded,
)
from bucketserve.loading.room import memory_budget
from bucketserve.runtime.sessions import (
    init_process,
    lone_threads,
    return_freed_memory,
    runs_on_cpu,
    thread_layout,
)
from bucketserve.settings import Settings
from bucketserve.tracing import Tracing

log = logging.getLogger(__name__)


class Loader:
    """The repository's models built ready by name, every version its config serves: at
    start (`open_repository`), and whenever model control loads one (`bucketserve.control`).
    A load that fails is worded once, by `load_failure`, whichever asked for it."""

    def __init__(self, settings: Settings, lone: int | None, budget: int | None = None) -> None:
        self.settings = settings
        self.lone = lone  # threads of the runner for a batch that runs alone, if any
        self.budget = budget  # the bytes every batch running at once may need (None: any)
        self.root = settings.models
        self._digests = Digests()
        self._built: dict[tuple[str, int], str] = {}  # each version's fingerprint, as built

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

    def load(self, name: str, hold: Hold | None = None) -> dict[int, Model]:
        """Every served version of `name`, built, checked and warm; LoadFailed says why not,
        with paths from the repository (a client reads it); ModelNotFound (404) for a name
        the repository does not hold. `hold`: where each run at load holds its memory in the
        engine's budget (the models served meanwhile share it)."""
        if name not in self.names():  # (one of its folders: never a path a client made)
            raise ModelNotFound(f"no model {name!r} in the repository")
        try:
            folder = self.folder(name)
            specs = load_model_specs(folder, name)
            if not specs:
                raise ConfigError(f"{folder}: model {name} is not built")
            return self.build_all(specs, hold)
        except Exception as exc:  # a ConfigError, or ONNX Runtime refusing the graph
            raise LoadFailed(for_clients(load_failure(name, exc), self.root)) from None

    def build_all(self, specs: list[ModelSpec], hold: Hold | None = None) -> dict[int, Model]:
        return {spec.version: self.build(spec, hold) for spec in specs}

    def build(self, spec: ModelSpec, hold: Hold | None = None) -> Model:
        """One version, or ConfigError naming its file and why: anything but a ConfigError
        is ONNX Runtime refusing the graph (or a bug), whose traceback goes to the log. Its
        content is held to the repository's lock first (`hold_to_lock`)."""
        settings = self.settings
        fingerprint = self.hold_to_lock(spec)
        try:
            return build_model(
                apply_overrides(spec, settings),
                settings.binding,
                settings.cache_dir,
                self.lone,
                fingerprint,
                self.budget,
                hold,
            )
        except ConfigError:
            raise
        except Exception as exc:
            log.error("model %s: loading raised", spec.name, exc_info=exc)
            raise ConfigError(
                f"{spec.onnx_path}: ONNX Runtime could not load or run the model: "
                f"{type(exc).__name__}: {exc}"
            ) from None

    def hold_to_lock(self, spec: ModelSpec) -> str:
        """The version's fingerprint, held to the lock: with `--locked`, a version whose
        content does not match its line is a ConfigError (never served); unlocked, a lock it
        does not match, or content changed under a version this loader built before, is said
        in a warning with both fingerprints (answers kept from before may differ from those
        given now)."""
        fingerprint = fingerprint_of(spec, self._digests)
        lock = read_lock(self.root)
        broken = held_to(lock, spec.name, spec.version, fingerprint)
        if broken is not None and self.settings.locked:
            raise ConfigError(broken)
        if broken is not None and lock is not None:
            log.warning("%s (served: --locked is off)", broken)
        before = self._built.get((spec.name, spec.version))
        if before is not None and before != fingerprint:
            log.warning(
                "model %s version %s: its content changed under the same version (%s before, "
                "%s now): answers kept from before may differ from those it gives now",
                spec.name,
                spec.version,
                before,
                fingerprint,
            )
        self._built[(spec.name, spec.version)] = fingerprint
        return fingerprint

    def released(self) -> None:
        """A model was released: what its sessions held goes back to the system."""
        return_freed_memory()

    def folder_digest(self, name: str) -> tuple[tuple[str, str], ...]:
        """What changes when the model's files do: each file's path and the digest of its
        content. A file is read again only when its status changed (size, mtime, ctime,
        inode): new weights copied over with their mtime kept (`cp -p`, `rsync -a`) still
        change the file's ctime, and then its digest is what tells."""
        folder = self.folder(name)
        if not folder.is_dir():
            return ()
        files = (p for p in sorted(folder.rglob("*")) if p.is_file())
        return tuple((str(p.relative_to(folder)), self._digests.of(p)) for p in files)


@dataclass(frozen=True)
class Opened:
    """A repository opened at start: what it serves, and what builds its models again."""

    registry: Registry
    loader: Loader
    instances: int  # batches of one model that may run at once
    memory: MemoryBudget  # what every batch running at once may need, the models' plans' own


def open_repository(settings: Settings) -> Opened:
    """Every model of the repository ready, in a registry. Models that fail to load stop it,
    every one of them named in one error (all are tried, so that one start says all that
    must be fixed), unless `settings.allow_partial`: then the registry serves the others and
    reports those not ready, with why."""
    repository = load_repository(
        settings.models, settings.default_model, partial=True, name=settings.model_name
    )
    aliases = served_names(settings.served_model_name, repository.default_model)  # (before loads)
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
    memory = memory_budget(settings, [s for specs in repository.models.values() for s in specs])
    lone = lone_threads(settings.lone_batch_threads, instances, threads)
    loader = Loader(settings, lone, memory.total)
    versions: dict[str, dict[int, Model]] = {}
    failed = {name: load_failure(name, exc) for name, exc in repository.failed.items()}
    for name, specs in repository.models.items():
        try:
            versions[name] = loader.build_all(specs)
        except Exception as exc:  # a ConfigError, or ONNX Runtime refusing the graph
            failed[name] = load_failure(name, exc)
    if failed and not settings.allow_partial:
        raise not_loaded(failed, len(repository.models) + len(repository.failed))
    if not versions:
        raise ConfigError(f"{settings.models}: no model loaded ({'; '.join(failed.values())})")
    shown = {name: for_clients(error, settings.models) for name, error in failed.items()}
    registry = Registry(versions, repository.default_model, shown, repository.unbuilt, aliases)
    return Opened(registry, loader, instances, memory)


def served_names(given: str | None, default: str | None) -> dict[str, str]:
    """`--served-model-name` as alias -> model name: ALIAS=MODEL, comma-separated; an ALIAS
    alone names the default model. ConfigError where one alias is given to two models:
    which one a client meant could not be told."""
    aliases: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in (given or "").split(","))):
        alias, _, named = (s.strip() for s in part.partition("="))
        model = named or default
        if not alias or model is None:
            raise ConfigError(
                f"served_model_name: {part!r}: write ALIAS=MODEL (ALIAS alone names the "
                "default model, and the repository has none)"
            )
        if aliases.setdefault(alias, model) != model:
            raise ConfigError(
                f"served_model_name: {alias!r} is given to two models, {aliases[alias]} and "
                f"{model}: give each its own name"
            )
    return aliases


def load_engine(
    settings: Settings | Path | str = "models", tracing: Tracing | None = None
) -> Engine:
    """Every model of a repository (a folder, or full settings) ready, in an engine: the
    Python API, and what the process runs (with model control beside it)."""
    if not isinstance(settings, Settings):
        settings = Settings(models=Path(settings))
    opened = open_repository(settings)
    return Engine(opened.registry, settings, opened.instances, tracing, memory=opened.memory)


def load_failure(name: str, exc: Exception) -> str:
    """What a model that did not load says, at start and under model control alike, logged
    once here: a ConfigError's own words (file, field and fix: `Loader.build` words what
    ONNX Runtime refused); anything else is a bug, whose traceback goes to the log."""
    if isinstance(exc, ConfigError):
        message = exc.message
    else:
        log.error("model %s: loading raised", name, exc_info=exc)
        message = f"loading failed: {type(exc).__name__}: {exc}"
    log.error("model %s did not load: %s", name, message)
    return message


def for_clients(error: str, root: Path) -> str:
    """An error as clients are told it: paths from the repository, not the host's."""
    return error.replace(f"{root.resolve()}/", "").replace(f"{root}/", "")


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

"""The model repository: `models/<name>/config.toml` + `models/<name>/<version>/model.onnx`.

Scanned once at start. Produces one `ModelSpec` per servable model: its config, its files and
its graph signature, all checked. A model that is built on demand (minilm) and not built yet is
skipped with a warning that names the command that builds it. A model that fails its checks
stops the load, unless a partial repository is allowed: then it is recorded as failed, with
why (said by the builder, as every failed load is), and the others are served.
"""

from __future__ import annotations

import functools
import logging
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from bucketserve.errors import ConfigError
from bucketserve.loading.axes import ModelAxes, resolve_axes
from bucketserve.loading.config import ModelConfig, load_model_config
from bucketserve.loading.planner import plan_edges, read_lengths
from bucketserve.loading.signature import Signature, read_signature

log = logging.getLogger(__name__)

CONFIG_FILE = "config.toml"
MODEL_FILE = "model.onnx"
REPOSITORY_FILE = "repository.toml"  # optional: `default_model = "NAME"`


@dataclass(frozen=True)
class ModelSpec:
    name: str
    version: int
    config: ModelConfig
    onnx_path: Path
    signature: Signature
    axes: ModelAxes
    tokenizer_path: Path | None


@dataclass(frozen=True)
class Repository:
    root: Path
    models: dict[str, list[ModelSpec]]  # every version served, oldest first
    default_model: str | None
    failed: dict[str, ConfigError] = field(default_factory=dict)  # model -> why it did not load
    unbuilt: dict[str, str] = field(default_factory=dict)  # model -> the recipe that builds it


PARTIAL_HINT = "to serve the other models meanwhile, start with --allow-partial"


def _versions(model_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def load_model_spec(model_dir: Path, name: str | None = None) -> ModelSpec | None:
    """One model folder -> the spec of its newest served version, as `name` (default: the
    folder's name); None when it is an on-demand model not built yet."""
    specs = load_model_specs(model_dir, name)
    return specs[-1] if specs else None


def load_model_specs(model_dir: Path, name: str | None = None) -> list[ModelSpec]:
    """One model folder -> a spec for each version its config serves (`version`, or
    `version_policy`; by default the newest), oldest first; none when it is an on-demand
    model not built yet."""
    config_path = model_dir / CONFIG_FILE
    config = load_model_config(config_path)
    versions = _versions(model_dir)
    if not versions and config.build is not None:
        log.warning(
            "model %s is not built; `bucketserve models build %s` builds it",
            model_dir.name,
            config.build,
        )
        return []
    if not versions:
        raise ConfigError(f"{model_dir}: no version folder (expected {model_dir}/1/{MODEL_FILE})")
    if config.batching.buckets == "auto":
        config = _fit_buckets(config, model_dir, config_path)
    name = name or model_dir.name
    return [
        _version_spec(model_dir, name, config, version)
        for version in _served_versions(config, versions, config_path)
    ]


def _served_versions(config: ModelConfig, versions: list[int], config_path: Path) -> list[int]:
    """The version folders the config serves, of those there are (`versions`, sorted)."""
    policy = config.version_policy
    wanted = [config.version] if config.version is not None else versions[-1:]
    if policy is not None and policy.latest is not None:
        wanted = versions[-policy.latest :]
    elif policy is not None and policy.all:
        wanted = versions
    elif policy is not None and policy.specific is not None:
        wanted = sorted(set(policy.specific))
    missing = [v for v in wanted if v not in versions]
    if missing:
        field = "version" if config.version is not None else "version_policy"
        raise ConfigError(f"{config_path}: {field}: no version folder {missing} (have {versions})")
    return wanted


def _version_spec(model_dir: Path, name: str, config: ModelConfig, version: int) -> ModelSpec:
    config_path = model_dir / CONFIG_FILE
    onnx_path = model_dir / str(version) / MODEL_FILE
    if not onnx_path.is_file():
        raise ConfigError(f"{onnx_path}: file not found")
    tokenizer_path = None
    if config.tokenizer is not None:
        tokenizer_path = onnx_path.parent / config.tokenizer.file
        if not tokenizer_path.is_file():
            raise ConfigError(f"{config_path}: tokenizer.file: {tokenizer_path} not found")
    signature = read_signature(onnx_path, config)
    axes = resolve_axes(signature, config, functools.partial(ConfigError.at, onnx_path))
    return ModelSpec(name, version, config, onnx_path, signature, axes, tokenizer_path)


def _fit_buckets(config: ModelConfig, model_dir: Path, config_path: Path) -> ModelConfig:
    """`buckets = "auto"`: edges fitted by the planner to the model's declared length sample."""
    batching = config.batching
    assert batching.length_sample is not None
    assert batching.max_length is not None
    sample_path = model_dir / batching.length_sample
    try:
        lengths = read_lengths(sample_path)
        plan = plan_edges(lengths, batching.bucket_count, batching.max_length)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{config_path}: batching.length_sample: {sample_path}: {exc}") from None
    log.info(
        "model %s: buckets fitted to %d sampled lengths: %s (expected padding %.1f%%)",
        model_dir.name,
        len(lengths),
        list(plan.edges),
        100 * plan.waste,
    )
    fitted = batching.model_copy(update={"buckets": list(plan.edges)})
    return config.model_copy(update={"batching": fitted})


def model_folders(root: Path) -> list[Path]:
    """The folders of a repository that hold a model (a config.toml)."""
    return sorted(p for p in root.iterdir() if (p / CONFIG_FILE).is_file())


def _one_model(folder: Path, name: str, partial: bool) -> Repository:
    try:
        specs = load_model_specs(folder, name)
    except ConfigError as exc:
        if not partial:
            raise
        return Repository(folder, {}, name, {name: exc})
    if not specs:
        raise ConfigError(f"{folder}: the model is not built")
    return Repository(folder, {name: specs}, name)


def not_loaded(failed: dict[str, str], models: int) -> ConfigError:
    """One error naming every model that did not load and why (`models`: how many the
    repository has), so that one start says all that must be fixed."""
    hint = f" ({PARTIAL_HINT})" if models > 1 else ""
    if len(failed) == 1:
        return ConfigError(next(iter(failed.values())) + hint)
    each = "; ".join(f"{name}: {error}" for name, error in sorted(failed.items()))
    return ConfigError(f"{len(failed)} models did not load: {each}{hint}")


def load_repository(
    root: Path, default_model: str | None = None, partial: bool = False, name: str | None = None
) -> Repository:
    """Scan `root`; `default_model` (from settings) overrides the repository's own choice.
    A model that fails its checks is recorded as failed and the scan goes on; at its end,
    unless `partial`, one error names every such model. A `root` that is one model's folder
    (its config.toml at the top, as KServe's storage initializer leaves /mnt/models) is a
    repository of that model alone, served as `name` (default: the folder's name)."""
    if not root.is_dir():
        raise ConfigError(f"{root}: model repository folder not found")
    if (root / CONFIG_FILE).is_file():
        return _one_model(root, name or root.resolve().name, partial)
    if name is not None:
        log.warning("%s is a repository of models: each is served under its folder's name", root)
    models: dict[str, list[ModelSpec]] = {}
    failed: dict[str, ConfigError] = {}
    unbuilt: dict[str, str] = {}
    folders = model_folders(root)
    for model_dir in folders:
        try:
            specs = load_model_specs(model_dir)
        except ConfigError as exc:
            failed[model_dir.name] = exc
            continue
        if specs:
            models[model_dir.name] = specs
        else:  # (an on-demand model not built yet: said when it is asked for)
            unbuilt[model_dir.name] = load_model_config(model_dir / CONFIG_FILE).build or ""
    if failed and not partial:
        raise not_loaded({name: exc.message for name, exc in failed.items()}, len(folders))
    if not models and not failed:
        raise ConfigError(f"{root}: no servable model (a model is a folder with {CONFIG_FILE})")
    repo_file = root / REPOSITORY_FILE
    source = "default model setting"
    if default_model is None and repo_file.is_file():
        source = f"{repo_file}: default_model"
        try:
            default_model = tomllib.loads(repo_file.read_text(encoding="utf-8")).get(
                "default_model"
            )
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{repo_file}: not valid TOML: {exc}") from None
    if default_model is None and len(models) + len(failed) == 1:
        default_model = next(iter(models), None)
    if default_model is not None and default_model not in models | failed:
        raise ConfigError(
            f"{source}: '{default_model}' is not a servable model (have {sorted(models)})"
        )
    return Repository(root, models, default_model, failed, unbuilt)

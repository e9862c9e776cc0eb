"""The builder's arguments (`serve run bucketserve.ray:app models=./models num_replicas=2`, or
a Serve config file's `args:`) read into the server's settings and the deployment's options.

Every `serve` setting is an argument under its own name (its value a string as on the command
line, or typed, as a config file gives it; BUCKETSERVE_* variables are read as `serve` reads
them). Those Ray's proxy owns instead (the port, connection limits) and the bulk jobs (each
replica would keep its own files) are refused with where they went. The rest are the
deployment's: how many replicas, or autoscaling on the engine's queue, how many requests a
replica may hold, its CPUs. Checked in the driver, before a replica is started.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from bucketserve.errors import ConfigError
from bucketserve.loading.repository import load_repository
from bucketserve.settings import Settings, parse_value

# Settings that have no meaning in a replica, and where each went.
OWNED_BY_RAY = {
    "host": "Serve's http_options.host (serve run --host, or the config file)",
    "port": "Serve's http_options.port (serve run --port, or the config file)",
    "grpc_port": "Serve's grpc_options (the KServe v2 routes answer over HTTP)",
    "header_timeout_s": "Ray's proxy reads the requests",
    "body_timeout_s": "Ray's proxy reads the requests",
    "keep_alive_s": "Serve's http_options.keep_alive_timeout_s",
    "max_connections": "Ray's proxy holds the connections",
    "drain_timeout_s": "graceful_shutdown_timeout_s, the deployment's (an argument here)",
    "jobs_dir": "a corpus over a cluster runs on Ray Data (bucketserve.ray.Embed)",
    "max_file_mb": "a corpus over a cluster runs on Ray Data (bucketserve.ray.Embed)",
    "max_files": "a corpus over a cluster runs on Ray Data (bucketserve.ray.Embed)",
    "max_jobs": "a corpus over a cluster runs on Ray Data (bucketserve.ray.Embed)",
}
SETTINGS = {f.name: f for f in fields(Settings)}
PATHS = ("models", "cache_dir", "api_key_file")  # (a replica's working folder is not ours)

MIN_ONGOING = 64  # a replica sees at least this many requests at once, whatever the batch
DEPLOYMENT = {
    "name": "the deployment's name (default: bucketserve)",
    "num_replicas": "replicas (default 1), or 'auto' to autoscale",
    "min_replicas": "autoscaling: the fewest replicas (default 1)",
    "max_replicas": "autoscaling: the most replicas (setting it turns autoscaling on)",
    "initial_replicas": "autoscaling: replicas at the start",
    "target_requests": "autoscaling: requests a replica holds (waiting and running) at the "
    "target (default: twice the largest batch)",
    "upscale_delay_s": "autoscaling: how long the load must stay above target",
    "downscale_delay_s": "autoscaling: how long the load must stay below target",
    "look_back_period_s": "autoscaling: the window the load is averaged over (default 30)",
    "max_ongoing_requests": f"requests one replica holds at once (default: {MIN_ONGOING}, or "
    "four times the largest batch if more); never below the largest batch",
    "max_queued_requests": "requests waiting for a replica before 503 (default: no limit)",
    "num_cpus": "a replica's CPUs, which are its threads (default 1)",
    "max_replicas_per_node": "replicas one node may hold (default: no limit)",
    "graceful_shutdown_timeout_s": "how long a stopped replica finishes what it holds (default 30)",
    "health_check_period_s": "how often Ray asks a replica's readiness (default 10)",
}


@dataclass(frozen=True)
class Options:
    settings: Settings
    deployment: dict[str, Any]  # `Deployment.options` (autoscaling_config included)
    target_requests: float  # what `record_autoscaling_stats` reports as the target


def read_options(args: dict[str, Any]) -> Options:
    """The settings and the deployment's options from the builder's `args`: ConfigError
    naming the argument that is unknown, misplaced or out of range, with the fix."""
    mine = {k: v for k, v in args.items() if k in DEPLOYMENT}
    num_cpus = _number(mine, "num_cpus", 1.0, float)
    if num_cpus <= 0:
        raise ConfigError(f"num_cpus: must be above 0, got {num_cpus}")
    settings = read_settings({k: v for k, v in args.items() if k not in DEPLOYMENT}, num_cpus)
    largest = largest_batch(settings)
    ongoing = _number(mine, "max_ongoing_requests", max(MIN_ONGOING, 4 * largest), int)
    if ongoing < largest:
        raise ConfigError(
            f"max_ongoing_requests={ongoing} is below the largest batch ({largest} sequences): "
            f"a replica would never see enough requests to fill a batch; leave it out (the "
            f"default is {max(MIN_ONGOING, 4 * largest)}) or set it to {largest} or more"
        )
    deployment: dict[str, Any] = {
        "name": str(mine.get("name", "bucketserve")),
        "max_ongoing_requests": ongoing,
        "ray_actor_options": {"num_cpus": num_cpus},
        "graceful_shutdown_timeout_s": _number(mine, "graceful_shutdown_timeout_s", 30.0, float),
        "health_check_period_s": _number(mine, "health_check_period_s", 10.0, float),
    }
    for name in ("max_queued_requests", "max_replicas_per_node"):
        if name in mine:
            deployment[name] = _number(mine, name, 0, int)
    target = _number(mine, "target_requests", 2.0 * largest, float)
    if target <= 0:
        raise ConfigError(f"target_requests: must be above 0, got {target}")
    replicas = str(mine.get("num_replicas", "1"))
    if replicas == "auto" or "max_replicas" in mine:
        deployment["autoscaling_config"] = _autoscaling(mine)
    elif "min_replicas" in mine or "initial_replicas" in mine:
        raise ConfigError("min_replicas, initial_replicas: autoscaling's; set max_replicas too")
    else:
        deployment["num_replicas"] = _number(mine, "num_replicas", 1, int)
    return Options(settings, deployment, target)


def read_settings(args: dict[str, Any], num_cpus: float | None = None) -> Settings:
    """The server's settings from `args` (each a `serve` setting) and BUCKETSERVE_*, as
    `serve` reads them; paths made absolute (a replica runs in a folder of Ray's); ONNX
    Runtime's threads the CPUs Ray gives (unless intra_op_threads says otherwise)."""
    for name in args:
        if name in OWNED_BY_RAY:
            raise ConfigError(f"{name}: not a replica's setting under Ray: {OWNED_BY_RAY[name]}")
        if name not in SETTINGS:
            raise ConfigError(
                f"{name}: not an argument of bucketserve.ray:app; it takes every `serve` "
                f"setting and {', '.join(DEPLOYMENT)}"
            )
    settings = Settings.from_env(**{k: _setting(k, v) for k, v in args.items()})
    changed: dict[str, Any] = {
        name: Path(getattr(settings, name)).resolve()
        for name in PATHS
        if getattr(settings, name) is not None
    }
    if num_cpus is not None and settings.intra_op_threads is None:
        changed["intra_op_threads"] = max(1, math.floor(num_cpus))
    return dataclasses.replace(settings, **changed)


def largest_batch(settings: Settings) -> int:
    """The most sequences one batch of any model of the repository holds (its configs read,
    no model loaded)."""
    repository = load_repository(
        settings.models, settings.default_model, settings.allow_partial, settings.model_name
    )
    sizes = [spec.config.batching.max_batch_size for s in repository.models.values() for spec in s]
    return settings.max_batch_size or max(sizes, default=1)


def _autoscaling(mine: dict[str, Any]) -> dict[str, Any]:
    """Ray's autoscaling, on the engine's own queue (`bucketserve.ray.autoscaling`)."""
    config: dict[str, Any] = {
        "min_replicas": _number(mine, "min_replicas", 1, int),
        "max_replicas": _number(mine, "max_replicas", 1, int),
        "policy": {"policy_function": "bucketserve.ray.autoscaling:queue_policy"},
    }
    if "initial_replicas" in mine:
        config["initial_replicas"] = _number(mine, "initial_replicas", 0, int)
    for name in ("upscale_delay_s", "downscale_delay_s", "look_back_period_s"):
        if name in mine:
            config[name] = _number(mine, name, 0.0, float)
    if config["max_replicas"] < max(1, config["min_replicas"]):
        raise ConfigError(
            f"max_replicas={config['max_replicas']}: must be at least min_replicas "
            f"({config['min_replicas']}) and 1"
        )
    return config


def _setting(name: str, value: Any) -> Any:
    """A setting's value: text parsed as the `serve` flag parses it; typed, taken as given."""
    if isinstance(value, str):
        return parse_value(name, str(SETTINGS[name].type), value)
    return value


def _number(mine: dict[str, Any], name: str, default: Any, kind: type) -> Any:
    if name not in mine:
        return default
    try:
        value = kind(mine[name])
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected a number, got {mine[name]!r}") from None
    if value < 0:
        raise ConfigError(f"{name}: must be 0 or more, got {value}")
    return value

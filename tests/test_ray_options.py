"""`bucketserve.ray:app`'s arguments, read in the driver before any replica starts: every
`serve` setting under its own name, the deployment's options, and what is refused (with where
it went, or the fix); the autoscaling policy's arithmetic; a replica's answers to Ray's
questions. The cluster itself is tests/test_ray.py's (slow tier)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bucketserve.errors import ConfigError
from tests.helpers import copy_bundled

pytest.importorskip("ray.serve")

from bucketserve.ray.autoscaling import queue_policy
from bucketserve.ray.options import MIN_ONGOING, read_options


@pytest.fixture
def models(tmp_models: Path) -> Path:
    copy_bundled(tmp_models, "tiny-encoder")  # (max_batch_size 32)
    return tmp_models


def test_every_serve_setting_is_an_argument_parsed_as_its_flag(models: Path) -> None:
    options = read_options(
        {"models": str(models), "max_queue_delay_ms": "3.5", "auto_truncate": "true",
         "priority_levels": 3, "num_replicas": "2"}
    )  # fmt: skip
    settings = options.settings
    assert settings.models == models.resolve()
    assert settings.max_queue_delay_ms == 3.5
    assert settings.auto_truncate is True
    assert settings.priority_levels == 3
    assert options.deployment["num_replicas"] == 2
    assert "autoscaling_config" not in options.deployment


def test_the_defaults_keep_batching_and_a_replicas_cpus_are_its_threads(models: Path) -> None:
    options = read_options({"models": str(models), "num_cpus": "4"})
    assert options.deployment["max_ongoing_requests"] == 128  # (four batches of 32)
    assert options.deployment["ray_actor_options"] == {"num_cpus": 4.0}
    assert options.settings.intra_op_threads == 4
    assert options.target_requests == 64  # (twice the largest batch)
    smaller = read_options({"models": str(models), "max_batch_size": "8"})
    assert smaller.deployment["max_ongoing_requests"] == MIN_ONGOING  # (4 x 8 is below it)
    threads = read_options({"models": str(models), "intra_op_threads": "2"}).settings
    assert threads.intra_op_threads == 2


def test_the_environment_is_read_as_serve_reads_it(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BUCKETSERVE_INTRA_OP_THREADS", "3")
    monkeypatch.setenv("BUCKETSERVE_MAX_QUEUE_DELAY_MS", "7")
    settings = read_options({"models": str(models), "num_cpus": "4"}).settings
    assert settings.intra_op_threads == 3  # (said, so not the CPUs')
    assert settings.max_queue_delay_ms == 7


def test_max_ongoing_requests_below_the_largest_batch_is_refused_with_the_fix(
    models: Path,
) -> None:
    with pytest.raises(ConfigError) as refused:
        read_options({"models": str(models), "max_ongoing_requests": "5"})
    message = str(refused.value)
    assert "max_ongoing_requests=5 is below the largest batch (32 sequences)" in message
    assert "set it to 32 or more" in message
    enough = read_options({"models": str(models), "max_ongoing_requests": "32"})
    assert enough.deployment["max_ongoing_requests"] == 32


def test_autoscaling_is_on_the_engines_queue(models: Path) -> None:
    options = read_options(
        {"models": str(models), "num_replicas": "auto", "max_replicas": "4",
         "target_requests": "10", "downscale_delay_s": "60"}
    )  # fmt: skip
    assert "num_replicas" not in options.deployment
    assert options.deployment["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 4,
        "downscale_delay_s": 60.0,
        "policy": {"policy_function": "bucketserve.ray.autoscaling:queue_policy"},
    }
    assert options.target_requests == 10


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ({"port": "9000"}, "port: not a replica's setting under Ray: Serve's http_options.port"),
        ({"jobs_dir": "/tmp"}, "Ray Data (bucketserve.ray.Embed)"),
        ({"drain_timeout_s": "5"}, "graceful_shutdown_timeout_s"),
        ({"replicas": "2"}, "replicas: not an argument of bucketserve.ray:app"),
        ({"min_replicas": "2"}, "autoscaling's; set max_replicas too"),
        ({"max_replicas": "1", "min_replicas": "2"}, "must be at least min_replicas"),
        ({"num_cpus": "0"}, "num_cpus: must be above 0"),
        ({"num_replicas": "two"}, "num_replicas: expected a number, got 'two'"),
        ({"max_queue_delay_ms": "soon"}, "BUCKETSERVE_MAX_QUEUE_DELAY_MS='soon'"),
    ],
)
def test_what_a_replica_cannot_take_is_refused_saying_where_it_went(
    models: Path, args: dict[str, str], said: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        read_options({"models": str(models), **args})
    assert said in str(refused.value)


def test_a_missing_repository_is_refused_in_the_driver(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model repository folder not found"):
        read_options({"models": str(tmp_path / "nowhere")})


def context(requests: dict[str, float], queued: float, replicas: int) -> Any:
    return SimpleNamespace(
        aggregated_metrics={
            "requests": requests,
            "target_requests": dict.fromkeys(requests, 8.0),
        },
        current_num_replicas=replicas,
        target_num_replicas=replicas,
        total_queued_requests=queued,
    )


def test_the_policy_wants_the_requests_held_and_queued_over_the_target() -> None:
    assert queue_policy(context({"a": 20.0, "b": 12.0}, 0.0, 2)) == (4.0, {})
    assert queue_policy(context({"a": 2.0, "b": 2.0}, 4.0, 2)) == (1.0, {})
    assert queue_policy(context({}, 0.0, 0)) == (0, {})  # (nothing runs: Ray's cold start)
    unreported = SimpleNamespace(
        aggregated_metrics=None, current_num_replicas=2, target_num_replicas=2,
        total_queued_requests=0.0,
    )  # fmt: skip
    assert queue_policy(unreported) == (2, {})  # (no report yet: as it is)


def test_a_replica_answers_health_and_load_from_its_engine() -> None:
    from bucketserve.ray.replica import Replica

    replica_class = Replica.func_or_class
    held = {"requests_waiting": 3, "requests_running": 5}
    engine = SimpleNamespace(
        ready=True,
        registry=SimpleNamespace(models={"m": None}),
        summed=lambda name, count: held[count],
    )
    replica = SimpleNamespace(wired=SimpleNamespace(engine=engine), target_requests=16.0)
    replica_class.check_health(replica)
    assert replica_class.record_autoscaling_stats(replica) == {
        "requests": 8.0,
        "target_requests": 16.0,
    }
    engine.ready = False
    with pytest.raises(RuntimeError, match="not ready"):
        replica_class.check_health(replica)

"""The bucket planner: optimal on small cases (brute force), never worse than powers of two."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bucketserve.errors import ConfigError
from bucketserve.loading import load_model_spec
from bucketserve.loading.planner import (
    bucket_edges,
    extended,
    padding_waste,
    plan_edges,
    power_of_two_edges,
)
from tests.helpers import MODELS, ROOT, copy_bundled


def brute_force(lengths: list[int], keys: int, top: int) -> float:
    """The least padding over every choice of at most `keys` edges ending at `top`."""
    candidates = sorted(set(lengths) - {top})
    best = padding_waste(lengths, [top])
    for k in range(1, keys):
        for inner in itertools.combinations(candidates, k):
            best = min(best, padding_waste(lengths, [*inner, top]))
    return best


@pytest.mark.parametrize("seed", range(25))
def test_planner_finds_the_optimum_on_small_cases(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(1, 14, int(rng.integers(3, 30)))]
    keys = int(rng.integers(1, 5))
    top = max(lengths) + int(rng.integers(0, 3))
    plan = plan_edges(lengths, keys, top)
    assert len(plan.edges) <= keys
    assert plan.edges[-1] == top
    assert plan.waste == pytest.approx(brute_force(lengths, keys, top), abs=1e-12)
    assert plan.waste == pytest.approx(padding_waste(lengths, plan.edges))


@pytest.mark.parametrize(
    "sample",
    [
        lambda rng: rng.lognormal(3.1, 0.75, 4000),  # natural-text-like: median ~22, long tail
        lambda rng: rng.uniform(1, 256, 4000),
        lambda rng: rng.choice([5, 9, 200, 255], 4000),  # a few fixed lengths
        lambda rng: np.concatenate([rng.normal(30, 3, 2000), rng.normal(180, 10, 2000)]),
        lambda rng: rng.exponential(40, 4000),
    ],
    ids=["lognormal", "uniform", "fixed-lengths", "bimodal", "exponential"],
)
def test_planner_never_does_worse_than_powers_of_two(sample: object) -> None:
    rng = np.random.default_rng(1)
    lengths = [int(n) for n in np.clip(np.round(sample(rng)), 1, 256)]  # type: ignore[operator]
    pow2 = power_of_two_edges(256)
    plan = plan_edges(lengths, len(pow2), 256)
    assert plan.waste <= padding_waste(lengths, pow2) + 1e-12


def test_power_of_two_edges() -> None:
    assert power_of_two_edges(256) == (8, 16, 32, 64, 128, 256)
    assert power_of_two_edges(200) == (8, 16, 32, 64, 128, 200)


def test_auto_buckets_are_fitted_at_load(tmp_models: Path) -> None:
    config = (
        (MODELS / "tiny-encoder" / "config.toml")
        .read_text()
        .replace(
            "buckets = [8, 16, 24, 32, 48, 64, 96, 128, 192, 256]",
            'buckets = "auto"\nlength_sample = "lengths.txt"\nbucket_count = 4\nmax_length = 128',
        )
    )
    model_dir = copy_bundled(tmp_models, "tiny-encoder", config)
    (model_dir / "lengths.txt").write_text(
        "# observed\n" + "\n".join(["5"] * 50 + ["9"] * 30 + ["40"] * 20)
    )
    spec = load_model_spec(model_dir)
    assert spec is not None
    assert spec.config.batching.edges == [5, 9, 40, 128]


def test_auto_buckets_with_a_bad_sample(tmp_models: Path) -> None:
    config = (
        (MODELS / "tiny-encoder" / "config.toml")
        .read_text()
        .replace(
            "buckets = [8, 16, 24, 32, 48, 64, 96, 128, 192, 256]",
            'buckets = "auto"\nlength_sample = "lengths.txt"\nmax_length = 128',
        )
    )
    model_dir = copy_bundled(tmp_models, "tiny-encoder", config)
    (model_dir / "lengths.txt").write_text("5\nseven\n")
    with pytest.raises(ConfigError, match=r"batching\.length_sample: .*line 2: 'seven'"):
        load_model_spec(model_dir)


@pytest.mark.slow
def test_plan_command(tmp_path: Path) -> None:
    sample = tmp_path / "lengths.txt"
    rng = np.random.default_rng(0)
    sample.write_text(
        "\n".join(str(int(n)) for n in np.clip(rng.lognormal(3.1, 0.75, 3000), 1, 256))
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bucketserve",
            "plan",
            "--lengths",
            str(sample),
            "--max-length",
            "256",
            "--keys",
            "12",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "proposed (12 keys): buckets = [" in result.stdout
    assert "power of two (6 keys): buckets = [8, 16, 32, 64, 128, 256]" in result.stdout


def test_past_the_traffic_seen_a_plan_climbs_a_ladder_to_the_longest() -> None:
    """Traffic up to ~300 tokens, a model of 8,192: edges fitted where the traffic is, then
    each edge 1/8 to 1/4 longer than the one before, so a text of 2,000 tokens never shares a
    bucket (nor a batch's rows) with one of 8,000."""
    rng = np.random.default_rng(2)
    lengths = [int(n) for n in np.clip(rng.lognormal(3.5, 0.7, 3000), 1, 300)]
    plan = plan_edges(lengths, 10, 8192)
    edges = extended(plan.edges, 8192, max(lengths))
    assert edges[: len(plan.edges) - 1] == plan.edges[:-1]  # (the fit, where traffic was seen)
    assert edges[-1] == 8192
    past = edges[len(plan.edges) - 2 :]
    assert all(1.1 <= b / a <= 1.34 for a, b in itertools.pairwise(past[1:]))
    assert padding_waste(lengths, edges) == pytest.approx(plan.waste)
    assert bucket_edges(8192)[-4:] == [5120, 6144, 7168, 8192]

"""The locust users, the step-load shape and the headless runner work end to end (smoke mode)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadtest.lengths import LengthDistribution
from tests.helpers import ROOT

pytestmark = pytest.mark.slow  # the full tier: real server processes

# locust runs in subprocesses only: importing it here would gevent-patch the whole test process.


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_step_load_run_leaves_csvs_and_a_report(tmp_path: Path) -> None:
    out = tmp_path / "locust"
    run = subprocess.run(
        [
            sys.executable, "-m", "loadtest.locust_run", "--smoke",
            "--model", "tiny-encoder", "--step-users", "2", "--out", str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr  # locust fails the run on any failure
    stats = {row["Name"]: row for row in _rows(out / "locust_stats.csv")}
    buckets = [name for name in stats if name.startswith("/predict [<=")]
    assert len(buckets) >= 3, stats.keys()  # one row per bucket the traffic reached
    assert int(stats["Aggregated"]["Request Count"]) > 20
    assert int(stats["Aggregated"]["Failure Count"]) == 0
    history = [r for r in _rows(out / "locust_stats_history.csv") if r["Name"] == "Aggregated"]
    assert {int(r["User Count"]) for r in history} >= {2, 4}  # both steps of the shape ran
    assert (out / "report.png").read_bytes().startswith(b"\x89PNG")
    report = (out / "report.md").read_text()
    assert "| /predict [<=" in report
    assert "locust" in report
    assert "server" in report


def test_length_distributions() -> None:
    rng = np.random.default_rng(0)
    natural = LengthDistribution.parse("natural", 256).sample(rng, 5000)
    assert natural.min() >= 4
    assert natural.max() <= 256
    assert 18 <= np.median(natural) <= 26
    assert np.percentile(natural, 99) > 90
    assert set(LengthDistribution.parse("fixed:40", 256).sample(rng, 10)) == {40}
    assert set(LengthDistribution.parse("fixed:900", 256).sample(rng, 3)) == {256}  # clipped
    uniform = LengthDistribution.parse("uniform:3:5", 256).sample(rng, 300)
    assert set(uniform) == {3, 4, 5}


def test_length_file_and_bad_specs(tmp_path: Path) -> None:
    observed = tmp_path / "lengths.txt"
    observed.write_text("# observed\n7\n300\n")
    drawn = LengthDistribution.parse(f"file:{observed}", 128).sample(np.random.default_rng(1), 50)
    assert set(drawn) == {7, 128}
    for bad in ("zipf", "fixed", "fixed:0", "uniform:9:2", "uniform:1", f"file:{tmp_path}/none"):
        with pytest.raises(ValueError, match="length distribution"):
            LengthDistribution.parse(bad, 128)

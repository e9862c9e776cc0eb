"""The benchmark runs end to end on the tiny model in smoke mode and writes its files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytest.importorskip("matplotlib")


@pytest.mark.slow
def test_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtest.bench",
            "--smoke",
            "--model",
            "tiny-encoder",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=240,
    )
    report = json.loads((out / "bench.json").read_text())
    names = [row["name"] for row in report["servers"]]
    assert names == [
        "bucketing",
        "bucketing, power-of-two edges",
        "mutable",
        "batching off",
        "one bucket",
        "bucketing, one instance",
    ]
    assert report["ceiling"]["seq_per_s"] > 0
    for row in report["servers"]:
        assert row["seq_per_s"] > 0
        turns = row["seq_per_s_spread"]["rounds"]
        assert len(turns) == report["rounds"] == 2  # every server took a turn in every round
        assert min(turns) <= row["seq_per_s"] <= max(turns)
        assert row["peak_pss_mib"] > 0
        assert len(row["loads"]) == 4
        assert 0 <= row["padding_waste"] < 1
    off = next(row for row in report["servers"] if row["name"] == "batching off")
    assert off["padding_waste"] == 0  # one sequence per batch, run at its own length
    assert len(report["targets"]) == 4
    table = (out / "bench.md").read_text()
    assert "| engine ceiling" in table
    assert (out / "bench.png").read_bytes().startswith(b"\x89PNG")

"""`python -m loadtest.reliability --smoke`: every part of the reliability run works end to
end against real server processes, and what it measures holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.process import ROOT

pytestmark = pytest.mark.slow  # the full tier: real server processes


def test_reliability_smoke(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "loadtest.reliability", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    report = json.loads((tmp_path / "reliability.json").read_text())
    overload = report["overload"]["statuses"]
    assert set(overload) <= {"200", "503"}, overload  # full queue: refused, never failed
    assert overload.get("503", 0) > 0
    assert overload["200"] > 0
    slow = report["slow_clients"]
    assert slow["closed_after_s"]["silent"] < slow["timeouts_s"]["header"] + 3
    assert slow["closed_after_s"]["slow-body"] < slow["timeouts_s"]["body"] + 3
    assert report["soak"]["errors"] == {}
    drain = report["drain"]
    assert drain["exit_code"] == 0
    assert set(drain["outcomes"]) <= {"200", "503", "refused"}, drain["outcomes"]

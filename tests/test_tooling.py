"""The checks developers and CI share: ruff (lint + format), and mypy strict on the package,
the load tests and the deploy scripts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "bucketserve", "modelgen", "tests", "loadtest", "models", "deploy"],
        [
            "ruff",
            "format",
            "--check",
            "bucketserve",
            "modelgen",
            "tests",
            "loadtest",
            "models",
            "deploy",
        ],
        ["mypy"],
    ],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_tool_is_clean(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr

"""The README's quick start stays true: its test command is the one CI runs."""

from __future__ import annotations

import re

from tests.helpers import ROOT


def quick_start() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_quick_start_is_two_commands() -> None:
    serve, test = quick_start()
    assert serve == "pip install -e . && bucketserve serve"
    assert "pytest" in test


def test_ci_runs_the_readme_test_command() -> None:
    _, test = quick_start()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in ci

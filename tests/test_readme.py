"""The README and the reference pages stay true: every command in them runs here against the
quick start's server (or, for the long ones, in the test that runs them in smoke mode). The
quick start itself is checked in the fast tier (tests/test_docs.py)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bucketserve.loading import ModelSpec
from bucketserve.process.cli import PROBE_PATHS
from loadtest.process import free_port
from tests.helpers import ROOT
from tests.test_docs import DOCS, quick_start

pytestmark = pytest.mark.slow  # the full tier: real server processes


# Commands that a test elsewhere runs in full (in smoke mode): the module and the test file.
RUN_ELSEWHERE = {
    "python -m loadtest.bench": "tests/test_bench.py",
    "python -m loadtest.reliability": "tests/test_reliability.py",
    "python -m loadtest.framing": "tests/test_connections.py",
    "python -m deploy.image.smoke": "tests/test_deploy.py",
    "mkdocs build": "tests/test_docs.py",
    "bucketserve batch run": "tests/test_batches.py",
    "serve run bucketserve.ray:app": "tests/test_ray.py",  # (Ray's command: a cluster's)
    "python -m loadtest.ray_bench": "tests/test_bench.py",
}
NEEDS_DOCKER_OR_CLUSTER = ("docker ", "kubectl ", "helm ")
SUITE = "python -m pytest"  # the suite's own tiers: running them is what the suite is doing
# The README's commands assume its environment is activated; the suite may be run without
# (`.venv/bin/python -m pytest`), so `bucketserve`, `python` and `locust` are looked up first
# where the running interpreter lives.
ACTIVATED = {
    **os.environ,
    "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
}


def readme_commands() -> list[str]:
    """Every command in the bash blocks of the README, then of each reference page:
    continuations joined, comments dropped."""
    pages = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    text = "\n".join(page.read_text() for page in pages)
    commands, pending = [], ""
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if not pending:
                line = re.sub(r"\s+#.*$", "", line).strip()
                if not line or line.startswith("#"):
                    continue
            pending = f"{pending}\n{line}" if pending else line
            try:
                shlex.split(pending)  # a quoted body may span lines
            except ValueError:
                continue
            commands.append(pending)
            pending = ""
    return commands


def _run(command: str, cwd: Path, port: int) -> subprocess.CompletedProcess[str]:
    command = re.sub(r"(localhost|127\.0\.0\.1):8000", f"127.0.0.1:{port}", command)
    if command.startswith("curl -s "):  # a 4xx or 5xx answer must fail the command
        command = "curl -sS --fail-with-body " + command.removeprefix("curl -s ")
    elif command.startswith("locust "):  # headless and short, instead of the web UI
        command += " --headless -u 2 -r 2 -t 2s --only-summary --loglevel WARNING"
    elif command.startswith("python -m loadtest.locust_run"):
        command += " --smoke"
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=cwd,
        env={**ACTIVATED, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_readme_commands_run(minilm_spec: ModelSpec, tmp_path: Path) -> None:
    """The quick start's server, then every other command against it, in a scratch folder."""
    commands = readme_commands()
    quick_serve, quick_test = quick_start()
    assert commands[:2] == [quick_serve, quick_test]
    for folder in ("loadtest", "deploy"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    port = free_port()
    serve_command = quick_serve.split("&& ", 1)[1]  # installing is what CI's fresh venv does
    server = subprocess.Popen(
        ["bash", "-c", f"exec {serve_command}"],
        cwd=ROOT,
        env={**ACTIVATED, "BUCKETSERVE_PORT": str(port), "BUCKETSERVE_LOG_LEVEL": "warning"},
    )
    try:
        deadline = time.monotonic() + 120
        while _run(f"curl -s localhost:8000{PROBE_PATHS['ready']}", tmp_path, port).returncode:
            assert server.poll() is None, "the quick start's server exited"
            assert time.monotonic() < deadline, "the quick start's server never became ready"
            time.sleep(0.5)
        ran = 0
        for command in commands[2:]:
            if command.startswith(NEEDS_DOCKER_OR_CLUSTER):
                for path in re.findall(r"(?:-k|-f) (\S+)", command):
                    assert (ROOT / path).exists(), command
                continue
            if command.startswith(SUITE):
                markers = (ROOT / "pyproject.toml").read_text()
                for marker in re.findall(r'-m "not (\w+)"', command):
                    assert f'"{marker}: ' in markers, command
                continue
            elsewhere = next((m for m in RUN_ELSEWHERE if command.startswith(m)), None)
            if elsewhere is not None:
                module = elsewhere.removeprefix("python -m ")
                assert module in (ROOT / RUN_ELSEWHERE[elsewhere]).read_text()
                helped = _run(f"{elsewhere} --help", tmp_path, port)
                for flag in re.findall(r"--[a-z-]+", command):
                    assert flag in helped.stdout, (command, flag)
                continue
            result = _run(command, tmp_path, port)
            assert result.returncode == 0, (command, result.stdout[-2000:], result.stderr[-2000:])
            ran += 1
        assert ran >= 10
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0  # the quick start's server drains and exits cleanly

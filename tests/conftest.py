from __future__ import annotations

import faulthandler
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil
import pytest

from bucketserve.loading import ModelSpec, load_model_spec
from tests.helpers import MODELS


@pytest.fixture(scope="session")
def minilm_spec() -> ModelSpec:
    """The real all-MiniLM-L6-v2, built once into models/minilm/1 when it is not there yet.

    CI sets BUCKETSERVE_REQUIRE_MINILM=1, so a machine without the export extra fails there
    instead of skipping.
    """
    if not (MODELS / "minilm" / "1" / "model.onnx").is_file():
        if importlib.util.find_spec("torch") is None and not os.environ.get(
            "BUCKETSERVE_REQUIRE_MINILM"
        ):
            pytest.skip("minilm is not built and the export extra (torch) is not installed")
        # In a subprocess: the export's own warnings are not this suite's to turn into errors,
        # and this runs the build command exactly as a user would.
        subprocess.run(
            [
                sys.executable,
                "-m",
                "bucketserve",
                "models",
                "build",
                "minilm",
                "--models",
                str(MODELS),
            ],
            check=True,
        )
    spec = load_model_spec(MODELS / "minilm")
    assert spec is not None
    return spec


@pytest.fixture(scope="session")
def task_repository(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The task exports (`tests.task_exports.TaskRepository`), made once for the session:
    the task routes' tests and the differential suite share them."""
    from tests.task_exports import TaskRepository  # (torch and the exporter: only if asked)

    return TaskRepository(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="session")
def bundled_specs(minilm_spec: ModelSpec) -> dict[str, ModelSpec]:
    specs = {name: load_model_spec(MODELS / name) for name in ("tiny-encoder", "tiny-lstm")}
    return {"minilm": minilm_spec, **{k: v for k, v in specs.items() if v is not None}}


@pytest.fixture
def tmp_models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    return root


# Tests that need the real minilm export belong to the full tier, whatever their module.
FULL_TIER_FIXTURES = {"minilm_spec", "bundled_specs"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if FULL_TIER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def pytest_configure() -> None:
    # The weights cache (models with inline weights are written out there) in a folder of the
    # suite's own, never the user's: server processes the tests start inherit it.
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="bucketserve-tests-cache-")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The suite leaves nothing behind that would keep CI waiting after the last test: no
    server process still running and no gevent patching of this process (locust, imported
    here, would patch threading and sockets under every later test and the exit)."""
    problems = []
    leftovers = psutil.Process().children(recursive=True)
    for child in leftovers:
        problems.append(f"process {child.pid} still running: {' '.join(child.cmdline())}")
        child.kill()
    psutil.wait_procs(leftovers, timeout=10)
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        problems.append("gevent patched the test process (something imported locust in-process)")
    if problems:
        print("\n" + "\n".join(problems), file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure() -> None:
    shutil.rmtree(os.environ["XDG_CACHE_HOME"], ignore_errors=True)
    # A hang while the interpreter shuts down would hold CI until its own limit; after two
    # minutes, dump every thread's stack and fail instead.
    faulthandler.dump_traceback_later(120, exit=True)

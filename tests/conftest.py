from __future__ import annotations

import faulthandler
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest

from tests.helpers import MODELS, TextServer, copy_bundled

if TYPE_CHECKING:  # (ONNX Runtime and load time are imported by the fixtures that need them)
    from bucketserve.loading import ModelSpec


@pytest.fixture(scope="session")
def minilm_spec() -> ModelSpec:
    """The real all-MiniLM-L6-v2, built once into models/minilm/1 when it is not there yet.

    CI sets BUCKETSERVE_REQUIRE_MINILM=1, so a machine without the export extra fails there
    instead of skipping.
    """
    from bucketserve.loading import load_model_spec

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
    from bucketserve.loading import load_model_spec

    specs = {name: load_model_spec(MODELS / name) for name in ("tiny-encoder", "tiny-lstm")}
    return {"minilm": minilm_spec, **{k: v for k, v in specs.items() if v is not None}}


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """A model repository of the models named, made once a shape for the session and shared,
    read-only, by every test that asks for that shape: bundled models (`tiny-encoder`,
    `tiny-lstm`), the zoo's exhibits by name, and `st` (a sentence-transformers export
    imported by `models import`: a tokenizer, text in). A test that changes its repository
    makes its own (`tmp_models`)."""
    made: dict[tuple[str, ...], Path] = {}

    def of(*names: str) -> Path:
        shape = tuple(sorted(names))
        if shape not in made:
            root = tmp_path_factory.mktemp("repository") / "models"
            root.mkdir()
            for name in shape:
                add_model(root, name)
            made[shape] = root
        return made[shape]

    return of


def add_model(root: Path, name: str) -> None:
    """`name` into the repository `root` (see `repository`)."""
    from tests.zoo import ZOO, add_to

    if name == "st":
        from bucketserve.loading.importer import import_model
        from tests.exports import write_export

        import_model(write_export(root.parent / "st-export"), root, "st")
    elif name in ZOO:
        add_to(root, name)
    else:
        copy_bundled(root, name)


@pytest.fixture(scope="session")
def text_server(repository: Callable[..., Path]) -> Iterator[TextServer]:
    """One server process on `tiny-encoder` (token ids) and `st` (text), HTTP and gRPC, the
    default model `tiny-encoder`: shared by the modules that drive a server of that shape."""
    from loadtest.process import free_port
    from tests.helpers import server_process

    port = free_port()
    flags = ("--default-model", "tiny-encoder", "--grpc-port", str(port))
    with server_process(repository("tiny-encoder", "st"), *flags) as (_, url, _log):
        yield TextServer(url, f"127.0.0.1:{port}")


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
    leftovers = [c for c in psutil.Process().children(recursive=True) if running(c)]
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


def running(process: psutil.Process) -> bool:
    """Whether `process` still runs (a zombie is dead, only not reaped yet)."""
    try:
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def pytest_unconfigure() -> None:
    shutil.rmtree(os.environ["XDG_CACHE_HOME"], ignore_errors=True)
    # A hang while the interpreter shuts down would hold CI until its own limit; after two
    # minutes, dump every thread's stack and fail instead.
    faulthandler.dump_traceback_later(120, exit=True)

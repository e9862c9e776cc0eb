"""Import rules are contracts that import-linter checks (pyproject.toml): deny by default, every
module of `bucketserve` placed in a layer, external packages imported only where named. The suite
runs them on the project, and shows that planted violations of every kind break them.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "bucketserve"
LINT = [sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()"]


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter on the packages under `root` (they come first on the path)."""
    return subprocess.run(
        [*LINT, "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_contracts_hold() -> None:
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 broken" in result.stdout


# (module, what is planted in it): each must break a contract
PLANTS = {
    "absolute": ("bucketserve/core/queues.py", "import bucketserve.edges.kserve"),
    "from-package": ("bucketserve/runtime/weights.py", "from bucketserve import edges"),
    "name-from-package-root": ("bucketserve/core/model.py", "from bucketserve import load_engine"),
    "relative": ("bucketserve/runtime/binding.py", "from ..edges.http import common"),
    "relative-parent": ("bucketserve/core/layout.py", "from .. import loading"),
    "inside-a-function": (
        "bucketserve/core/bucketing.py",
        "def later() -> None:\n    from bucketserve.edges.http import app",
    ),
    "sibling-room": (
        "bucketserve/edges/http/common.py",
        "from bucketserve.edges.grpc import service",
    ),
    "loading-inner": (
        "bucketserve/loading/config.py",
        "from bucketserve.loading import repository",
    ),
    "core-inner": ("bucketserve/core/model.py", "from bucketserve.core import scheduler"),
    "edge-past-the-call": (
        "bucketserve/edges/http/apis/predict.py",
        "from bucketserve.core.scheduler import Scheduler",
    ),
    "external": ("bucketserve/core/layout.py", "import onnxruntime"),
    "web-framework": ("bucketserve/core/engine.py", "import fastapi"),
    "builders": ("bucketserve/loading/builder.py", "import modelgen.graphs"),
    "module-in-no-layer": ("bucketserve/shortcut.py", ""),
    "edge-loads-a-model": (
        "bucketserve/edges/http/apis/predict.py",
        "from bucketserve.loading import load_engine",
    ),
    "control-builds": ("bucketserve/control.py", "import bucketserve.runtime.sessions"),
    "loading-reaches-control": ("bucketserve/loading/loader.py", "from bucketserve import control"),
    "core-reaches-control": ("bucketserve/core/engine.py", "import bucketserve.control"),
    "registry-over-the-engine": (
        "bucketserve/core/registry.py",
        "from bucketserve.core.engine import Engine",
    ),
    "edge-reaches-the-process": (
        "bucketserve/edges/grpc/service.py",
        "from bucketserve.process import wiring",
    ),
    "wiring-over-the-server": (
        "bucketserve/process/wiring.py",
        "from bucketserve.process import server",
    ),
    # the tasks: the enum under everything, each task's module (its rule and its head) over the
    # heads' protocol and the model (apart from the other tasks: `task_imports` below); their
    # rules built in loading
    "task-names-over-the-model": ("bucketserve/core/task.py", "from bucketserve.core import model"),
    "heads-over-a-task": (
        "bucketserve/core/heads.py",
        "from bucketserve.core.tasks.embedding import Embed",
    ),
    "model-over-a-task": (
        "bucketserve/core/model.py",
        "from bucketserve.core.tasks.classifier import Classify",
    ),
    "task-over-the-scheduler": (
        "bucketserve/core/tasks/classifier.py",
        "from bucketserve.core.scheduler import Scheduler",
    ),
    "rules-over-the-builder": (
        "bucketserve/loading/rules.py",
        "from bucketserve.loading.builder import build_model",
    ),
    "a-task-runs-tokenizers": ("bucketserve/core/tasks/embedding.py", "import tokenizers"),
    # the table of dialects: a vendor's API imports no other's, and only the table imports it
    "api-over-another-api": (
        "bucketserve/edges/http/apis/cohere.py",
        "from bucketserve.edges.http.apis import tei",
    ),
    "edge-reads-settings": (
        "bucketserve/edges/grpc/listener.py",
        "from bucketserve.settings import Settings",
    ),
    "app-wires-bulk": (
        "bucketserve/edges/http/app.py",
        "from bucketserve.edges.http.inprocess import InProcess",
    ),
    "bulk-builds-an-app": ("bucketserve/ray/data.py", "from bucketserve.edges.http import app"),
    "api-past-the-table": (
        "bucketserve/edges/http/app.py",
        "from bucketserve.edges.http.apis import openai",
    ),
}


@pytest.mark.parametrize(("module", "planted"), PLANTS.values(), ids=list(PLANTS))
def test_a_planted_violation_breaks_a_contract(tmp_path: Path, module: str, planted: str) -> None:
    for part in ("bucketserve", "modelgen"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    target = tmp_path / module
    target.write_text((target.read_text() if target.exists() else '"""A shortcut."""\n') + planted)

    result = lint(tmp_path)

    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout
    name = module.removesuffix(".py").replace("/", ".")
    assert name in result.stdout  # the report names the module that broke it


TASKS = PACKAGE / "core" / "tasks"


def task_imports(source: str) -> list[str]:
    """The modules under `core.tasks` that a module's source imports (a relative import read
    as from inside `core.tasks`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = ["bucketserve", "core", "tasks"][: 4 - node.level]
                base = ".".join(parent + ([node.module] if node.module else []))
            found += [base, *(f"{base}.{a.name}" for a in node.names)]
    return sorted({n for n in found if n.startswith("bucketserve.core.tasks.")})


def test_each_task_module_imports_no_other_task() -> None:
    """A task is one module: none leans on another (what two share sits below them, as the
    labels' rule does), so a task is added, changed or removed alone."""
    for path in sorted(TASKS.glob("*.py")):
        if path.name == "__init__.py":
            continue
        assert task_imports(path.read_text()) == [], path.name
    planted = "from bucketserve.core.tasks.classifier import Classify\n"
    assert task_imports(planted) != []  # (the check sees a task reaching another)
    assert task_imports("from .classifier import Classify\n") != []


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found.append((name, path))
    return found


def test_every_module_says_where_it_sits() -> None:
    missing = [
        name for name, path in modules() if ast.get_docstring(ast.parse(path.read_text())) is None
    ]
    assert not missing

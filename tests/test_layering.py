"""Imports point one way: HTTP -> engine -> (batcher | model -> runtime -> bucketing) -> config.

Each module below may not import what sits above it in the flow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "serve"

# module (or package prefix) -> imports it must never make
FORBIDDEN = {
    "serve.errors": ["serve.", "onnxruntime", "asyncio", "fastapi"],
    "serve.config": [
        "serve.signature",
        "serve.repository",
        "serve.runtime",
        "serve.model",
        "onnxruntime",
        "asyncio",
        "fastapi",
    ],
    "serve.bucketing": [
        "serve.runtime",
        "serve.model",
        "serve.batcher",
        "serve.engine",
        "onnxruntime",
        "asyncio",
        "fastapi",
    ],
    "serve.runtime": [
        "serve.model",
        "serve.batcher",
        "serve.engine",
        "serve.http",
        "serve.app",
        "asyncio",
        "fastapi",
    ],
    "serve.model": [
        "serve.batcher",
        "serve.engine",
        "serve.http",
        "serve.app",
        "asyncio",
        "fastapi",
    ],
    "serve.batcher": [
        "serve.runtime",
        "serve.model",
        "serve.engine",
        "serve.http",
        "onnxruntime",
        "fastapi",
    ],
    "serve.metrics": ["serve.runtime", "serve.model", "serve.engine", "serve.http", "onnxruntime"],
    "serve.engine": ["serve.http", "serve.app", "serve.server", "onnxruntime", "fastapi"],
    "serve.http": ["serve.app", "serve.server", "serve.runtime", "onnxruntime"],
}


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found.append((name, path))
    return found


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize(("name", "path"), modules(), ids=[m for m, _ in modules()])
def test_imports_point_downward(name: str, path: Path) -> None:
    rules = [
        bad
        for owner, bads in FORBIDDEN.items()
        if name == owner or name.startswith(owner + ".")
        for bad in bads
    ]
    wrong = sorted(
        i
        for i in imports(path)
        for bad in rules
        if (i + ".").startswith(bad if bad.endswith(".") else bad + ".") and i != name
    )
    assert not wrong, f"{name} imports {wrong}"


def test_every_module_says_where_it_sits() -> None:
    missing = [
        name for name, path in modules() if ast.get_docstring(ast.parse(path.read_text())) is None
    ]
    assert not missing

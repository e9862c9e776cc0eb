"""The repository's lock: `bucketserve models lock` writes each version's fingerprint;
`serve --locked` refuses a version whose content changed since, at start and when the poll
of model control finds it, with the old content still serving; unlocked, the change is
served and said in a warning with both fingerprints. A change counts wherever the graph
reads its weights from: an external file of any name, through a folder that is a symlink."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest

from bucketserve.errors import ConfigError
from bucketserve.loading import load_engine
from bucketserve.loading.fingerprint import fingerprint_of
from bucketserve.loading.lock import LOCK_FILE
from bucketserve.loading.repository import load_model_spec
from bucketserve.process.wiring import wire
from bucketserve.settings import Settings
from tests.engines import serving
from tests.test_model_control import NAME, SEQUENCES, ask, expected, write_version


def lock(models: Path) -> str:
    """`bucketserve models lock` as a user runs it: its output."""
    command = [sys.executable, "-m", "bucketserve", "models", "lock", "--models", str(models)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


async def polled() -> None:
    """Time for the poller to have read the folder as it was (ten intervals), before it
    changes: a change made before its first read is what it starts from."""
    await asyncio.sleep(0.5)


def new_content(models: Path, tmp_path: Path) -> None:
    """Other weights copied over version 1 (what `cp` of a new export does)."""
    other = tmp_path / "other"
    write_version(other, 7)
    for new in (other / NAME / "7").iterdir():
        shutil.copyfile(new, models / NAME / "1" / new.name)


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_version(root, 1)
    write_version(root, 2)
    config = root / NAME / "config.toml"  # (both versions served)
    config.write_text("[version_policy]\nall = true\n" + config.read_text())
    return root


def test_lock_writes_every_versions_fingerprint(models: Path) -> None:
    said = lock(models)
    written = tomllib.loads((models / LOCK_FILE).read_text())
    spec = load_model_spec(models / NAME)
    assert spec is not None
    assert set(written[NAME]) == {"1", "2"}
    assert written[NAME]["2"] == fingerprint_of(spec)  # (the newest: load_model_spec's)
    assert f"{NAME} 1 {written[NAME]['1']}" in said
    assert written[NAME]["1"] != written[NAME]["2"]


async def test_locked_serves_what_matches_and_refuses_a_changed_version(
    models: Path, tmp_path: Path
) -> None:
    lock(models)
    engine = load_engine(Settings(models=models, locked=True))
    async with serving(engine) as client:
        assert (await ask(client, 0, "1"))[0] == "1"
    new_content(models, tmp_path)
    with pytest.raises(ConfigError) as refused:
        load_engine(Settings(models=models, locked=True))
    message = str(refused.value)
    assert f"model {NAME} version 1 changed since it was locked" in message
    assert "publish the new content as a new version, or run `bucketserve models lock`" in message
    unlocked = load_engine(Settings(models=models))  # (served, said in a warning)
    assert unlocked.registry.resolve(NAME).info.version == 2
    lock(models)
    assert sorted(load_engine(Settings(models=models, locked=True)).registry.versions(NAME)) == [
        1,
        2,
    ]


def weights_moved_to(version: Path, location: str) -> Path:
    """The version's external weights moved to `location` (relative to its folder), the
    graph's references with them: where some exporters put them."""
    graph = onnx.load(str(version / "model.onnx"), load_external_data=False)
    for tensor in graph.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    target = version / location
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(version / "model.onnx.data", target)
    onnx.save(graph, str(version / "model.onnx"))
    return target


def weights_in_constants(version: Path, location: str) -> Path:
    """The version's weights held by Constant nodes, their data in an external file at
    `location`: no initializer names the file, a node's attribute does."""
    graph = onnx.load(str(version / "model.onnx"))
    constants = [
        onnx.helper.make_node("Constant", [], [t.name], value=t) for t in graph.graph.initializer
    ]
    nodes = [*constants, *graph.graph.node]
    del graph.graph.initializer[:], graph.graph.node[:]
    graph.graph.node.extend(nodes)
    (version / "model.onnx.data").unlink()
    onnx.save_model(graph, str(version / "model.onnx"), save_as_external_data=True,
                    location=location, size_threshold=1024, convert_attribute=True)  # fmt: skip
    return version / location


def rewritten_in_place(path: Path) -> None:
    """Every weight of the file negated, its size and mtime kept (`cp` over it, then
    `touch -r` from a copy): what a scan by size and time cannot see."""
    before = path.stat()
    words = np.frombuffer(path.read_bytes(), np.uint32) ^ np.uint32(1 << 31)  # (the sign bits)
    with path.open("r+b") as file:
        file.write(words.tobytes())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


@pytest.mark.parametrize("place", ["dot-named", "symlinked-folder", "in-constants"])
def test_weights_wherever_the_graph_reads_them_are_held_to_the_lock(
    models: Path, tmp_path: Path, place: str
) -> None:
    version = models / NAME / "1"
    if place == "symlinked-folder":
        shared = tmp_path / "shared-weights"
        shared.mkdir()
        (version / "weights").symlink_to(shared, target_is_directory=True)
        weights = weights_moved_to(version, "weights/encoder.bin")
    elif place == "in-constants":
        weights = weights_in_constants(version, "constants.bin")
    else:
        weights = weights_moved_to(version, ".encoder.weights")
    lock(models)
    served = load_engine(Settings(models=models, locked=True)).registry.resolve(NAME, "1")
    rewritten_in_place(weights)
    with pytest.raises(ConfigError, match=f"model {NAME} version 1 changed since it was locked"):
        load_engine(Settings(models=models, locked=True))
    unlocked = load_engine(Settings(models=models)).registry.resolve(NAME, "1")
    assert unlocked.info.fingerprint != served.info.fingerprint
    assert unlocked.info.fingerprint.startswith("sha256:")
    before, after = (m.predict([SEQUENCES[1]])[0]["sentence_embedding"] for m in (served, unlocked))
    assert not np.allclose(before, after, atol=1e-3)  # (what the fingerprint is for)


def test_locked_without_a_lock_names_the_command(models: Path) -> None:
    with pytest.raises(ConfigError, match=f"the repository has no {LOCK_FILE}: run"):
        load_engine(Settings(models=models, locked=True))


async def test_a_poll_under_lock_keeps_the_old_content_serving(
    models: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lock(models)
    settings = Settings(models=models, model_control="poll", poll_interval_s=0.05, locked=True)
    wired = wire(settings)
    want = expected(models, 1)[0]
    async with serving(wired.engine, wired.control) as client:
        await polled()
        new_content(models, tmp_path)
        for _ in range(400):  # (until the poll has read the new files and refused them)
            if any("changed since it was locked" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.05)
        assert any("changed since it was locked" in r.getMessage() for r in caplog.records)
        version, answer = await ask(client, 0, "1")
        ready = await client.get(f"/v2/models/{NAME}/versions/1/ready")
    assert version == "1"
    np.testing.assert_allclose(answer, want, atol=1e-5)  # (the old content, still served)
    assert ready.status_code == 200


async def test_unlocked_a_change_under_a_version_is_said_with_both_fingerprints(
    models: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(models=models, model_control="poll", poll_interval_s=0.05)
    wired = wire(settings)
    before = wired.engine.registry.resolve(NAME, "1").info.fingerprint
    caplog.set_level(logging.WARNING)
    async with serving(wired.engine, wired.control) as client:
        await polled()
        new_content(models, tmp_path)
        want = expected(models, 1)[0]  # (the new content's answer)
        for _ in range(400):
            if np.allclose((await ask(client, 0, "1"))[1], want, atol=1e-5):
                break
            await asyncio.sleep(0.05)
        after = wired.engine.registry.resolve(NAME, "1").info.fingerprint
    assert after != before
    warned = [r.getMessage() for r in caplog.records if "content changed" in r.getMessage()]
    assert warned
    assert before in warned[0]
    assert after in warned[0]

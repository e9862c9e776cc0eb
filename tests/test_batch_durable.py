"""A batch survives its server's death (slow tier: real processes, SIGKILLed). A job of
20,000 lines is killed three times (once while it is read and ordered, twice at random points
of its answering), the server started again on the same jobs directory each time; the
output then holds exactly one line per `custom_id`, each equal to the same request online.
And `bucketserve batch run`, killed once it has checkpointed, goes on where it stopped.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.exports import texts
from tests.helpers import server_process

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LINES = 20_000
KILLS = 3


def batch_of(sdk: Any, batch_id: str) -> Any:
    return sdk.batches.retrieve(batch_id)


def online_answers(url: str, given: list[str]) -> dict[str, list[float]]:
    """Each text's embedding as /v1/embeddings answers it online (200 texts a request)."""
    expected = {}
    with httpx.Client(base_url=url, timeout=120) as online:
        for first in range(0, len(given), 200):
            body = {"model": "st", "input": given[first : first + 200]}
            data = online.post("/v1/embeddings", json=body).json()["data"]
            expected |= {f"doc-{first + d['index']}": d["embedding"] for d in data}
    return expected


def test_a_job_killed_three_times_answers_each_line_once_and_exactly(
    repository: Callable[..., Path], tmp_path: Path
) -> None:
    models = repository("st")
    flags = ("--jobs-dir", str(tmp_path / "jobs"))
    given = texts(LINES, seed=77)
    lines = [
        json.dumps({"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/embeddings",
                    "body": {"model": "st", "input": text}})
        for i, text in enumerate(given)
    ]  # fmt: skip
    chance = random.Random(20261126)
    batch_id = ""
    killed_at: list[tuple[str, int]] = []
    for round_ in range(KILLS + 1):
        with (
            server_process(models, *flags) as (process, url, _log),
            openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as sdk,
        ):
            if round_ == 0:
                upload = ("in.jsonl", "\n".join(lines).encode())
                file = sdk.files.create(file=upload, purpose="batch")
                batch_id = sdk.batches.create(
                    input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
                ).id
            if round_ < KILLS:
                if round_ > 0:  # (the first kill: at once, while the file is read and ordered)
                    start = batch_of(sdk, batch_id).request_counts.completed
                    target = start + chance.randint(LINES // 10, LINES // 4)
                    while batch_of(sdk, batch_id).request_counts.completed < target:
                        time.sleep(0.005)
                    time.sleep(chance.uniform(0, 1.0))  # (most likely between checkpoints)
                state = batch_of(sdk, batch_id)
                killed_at.append((state.status, state.request_counts.completed))
                process.kill()
                process.wait(30)
                continue
            while (state := batch_of(sdk, batch_id)).status not in ("completed", "failed"):
                time.sleep(0.05)
            assert state.output_file_id is not None, state
            raw = sdk.files.content(state.output_file_id).text.splitlines()
            expected = online_answers(url, given)
    assert state.status == "completed", state
    assert state.request_counts.completed == LINES
    assert killed_at[0][0] in ("validating", "in_progress")
    assert [status for status, _ in killed_at[1:]] == ["in_progress"] * (KILLS - 1)
    counts = [completed for _, completed in killed_at]
    assert counts == sorted(counts)
    assert counts[-1] < LINES
    answered = [json.loads(line) for line in raw]
    assert len(answered) == LINES
    by_id = {line["custom_id"]: line["response"]["body"] for line in answered}
    assert by_id.keys() == expected.keys()  # (one line per custom_id, none lost)
    for custom_id, body in by_id.items():
        np.testing.assert_allclose(body["data"][0]["embedding"], expected[custom_id], atol=1e-5)
        assert body["usage"]["prompt_tokens"] > 0


def checkpointed(out: Path) -> int:
    """The lines a `batch run` onto `out` has checkpointed (0 before its state is written)."""
    state = out.with_name(out.name + ".partial") / "state.sqlite"
    if not state.is_file():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{state}?mode=ro", uri=True)) as db:
            rows = db.execute("SELECT done FROM batches").fetchall()
    except sqlite3.OperationalError:  # (made, its tables not yet)
        return 0
    return int(rows[0][0]) if rows else 0


def killed_once_checkpointed(command: list[str], out: Path, lines: int) -> int:
    """`command` (a `batch run` onto `out`) SIGKILLed once it has checkpointed `lines`
    lines; the lines it had checkpointed then."""
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while checkpointed(out) < lines:
            assert run.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.05)
        run.send_signal(signal.SIGKILL)
        run.wait(30)
    finally:
        if run.poll() is None:
            run.kill()
    return checkpointed(out)


def test_batch_run_killed_goes_on_where_it_stopped(
    repository: Callable[..., Path], tmp_path: Path
) -> None:
    """`bucketserve batch run` SIGKILLed once it has checkpointed, then the same command
    again: it goes on from `OUT.partial/`, and OUT holds every text once."""
    models = repository("st")
    given = texts(LINES, seed=78)
    source, out = tmp_path / "texts.txt", tmp_path / "vectors.jsonl"
    source.write_text("\n".join(given))
    command = [sys.executable, "-m", "bucketserve", "batch", "run", str(source), "--out",
               str(out), "--models", str(models), "--model", "st"]  # fmt: skip
    stopped = killed_once_checkpointed(command, out, LINES // 10)
    assert 0 < stopped < LINES
    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(int(line["custom_id"]) for line in lines) == list(range(1, LINES + 1))
    assert all(line["response"]["status_code"] == 200 for line in lines)


def test_batch_run_never_resumes_another_runs_state(
    repository: Callable[..., Path], tmp_path: Path
) -> None:
    """A run of one input killed once it has checkpointed, then another input onto the same
    `--out`: refused in one line naming the kept state, nothing written; with `--restart`,
    its own lines answered and nothing of the first's. `--out` equal to the input and a
    model the repository lacks: refused, the input untouched."""
    from bucketserve.loading import load_engine
    from bucketserve.settings import Settings

    models = repository("st")
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("\n".join(texts(LINES, seed=79)))
    given = texts(4, seed=80)
    second.write_text("\n".join(given))
    out = tmp_path / "vectors.jsonl"

    def command(source: Path, *more: str, into: Path = out) -> list[str]:
        return [sys.executable, "-m", "bucketserve", "batch", "run", str(source), "--out",
                str(into), "--models", str(models), *more]  # fmt: skip

    def ran(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=600)

    assert killed_once_checkpointed(command(first, "--model", "st"), out, 1) > 0
    stale = ran(command(second, "--model", "st"))
    assert stale.returncode == 2, stale.stderr[-2000:]
    (said,) = stale.stderr.strip().splitlines()
    assert f"{out}.partial holds an unfinished run of another input" in said
    assert "--restart" in said
    assert not out.exists()
    fresh = ran(command(second, "--model", "st", "--restart"))
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    answered = {line["custom_id"]: line for line in map(json.loads, out.read_text().splitlines())}
    assert sorted(answered) == ["1", "2", "3", "4"]
    model = load_engine(Settings(models=models)).model("st")
    for n, text in enumerate(given, 1):
        alone = model.predict(model.encode([text]))[0]["last_hidden_state"].mean(axis=0)
        row = answered[str(n)]["response"]["body"]["data"][0]["embedding"]
        np.testing.assert_allclose(row, alone / np.linalg.norm(alone), atol=1e-5)
    assert not (tmp_path / "vectors.jsonl.partial").exists()

    before = second.read_bytes()
    onto_itself = ran(command(second, "--model", "st", into=second))
    assert onto_itself.returncode == 2
    assert "give another --out" in onto_itself.stderr
    wrong = ran(command(second, "--model", "st-typo"))
    assert wrong.returncode == 2
    (said,) = wrong.stderr.strip().splitlines()
    assert "no model 'st-typo'" in said
    assert "it serves st" in said
    assert second.read_bytes() == before

"""A batch's memory scales with what it keeps, not with its input (slow tier: a server
process, its Pss read from /proc/PID/smaps_rollup; never RSS, which counts the mapped
weights and libraries whole). Validating and ordering a 20 MiB input, and one of 100,000
tiny lines, each costs at most 4x the file's size above the idle server, the peak sampled
from upload to cancel; once the batches end the server is back within 64 MiB of idle.

The negative control: the same server with every input line deliberately kept, parsed
(`tests/retaining_server.py`), fails these bounds.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtest.process import running_process
from loadtest.pss import pss, pss_sampled
from tests.exports import texts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MiB = 2**20
TIMES_THE_FILE = 4  # at most this many times the input's size, above idle, while it is read
BACK_WITHIN = 64 * MiB  # above idle, once the batches end
SAMPLE_S = 0.01


def request_line(custom_id: str, text: str) -> bytes:
    body = {"model": "st", "input": text}
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}
    return json.dumps(line).encode() + b"\n"


def passages_file(path: Path, size: int) -> Path:
    """About `size` bytes of request lines, each a passage of a few hundred words."""
    passages = [" ".join(texts(40, seed=seed)) for seed in range(64)]
    with path.open("wb") as out:
        written, i = 0, 0
        while written < size:
            written += out.write(request_line(f"p{i}", passages[i % len(passages)]))
            i += 1
    return path


def tiny_lines_file(path: Path, count: int) -> Path:
    with path.open("wb") as out:
        for i in range(count):
            out.write(request_line(f"t{i}", f"w{i % 97}"))
    return path


@dataclass
class Measured:
    name: str
    file_bytes: int
    peak_above_idle: int

    @property
    def times_the_file(self) -> float:
        return self.peak_above_idle / self.file_bytes


def wait_for(client: httpx.Client, batch_id: str, done: Any, within_s: float = 300) -> str:
    deadline = time.monotonic() + within_s
    while not done(status := client.get(f"/v1/batches/{batch_id}").json()["status"]):
        assert time.monotonic() < deadline, f"batch {batch_id} stayed {status}"
        time.sleep(0.05)
    return str(status)


def batch_peak(client: httpx.Client, pid: int, idle: int, source: Path) -> Measured:
    """The server's peak Pss above `idle` while `source` is uploaded, validated and ordered,
    and its first lines sent; cancelled then, and waited on until it ends."""
    with pss_sampled(pid, SAMPLE_S) as samples:
        with source.open("rb") as given:
            file = client.post(
                "/v1/files", files={"file": (source.name, given)}, data={"purpose": "batch"}
            ).json()
        body = {
            "input_file_id": file["id"],
            "endpoint": "/v1/embeddings",
            "completion_window": "24h",
        }
        batch = client.post("/v1/batches", json=body).json()
        status = wait_for(client, batch["id"], lambda s: s != "validating")
        assert status == "in_progress", status
        time.sleep(0.5)  # (the order read back, the first lines sent)
        client.post(f"/v1/batches/{batch['id']}/cancel")
        wait_for(client, batch["id"], lambda s: s in ("cancelled", "completed"))
    return Measured(source.name, source.stat().st_size, max(samples) - idle)


def measured(
    models: Path, tmp_path: Path, module: str, sources: list[Path]
) -> tuple[list[Measured], int]:
    """Each source's peak above idle on a server run as `python -m module serve`, and the
    server's Pss above idle once they all ended."""
    jobs = tmp_path / f"jobs-{module}"
    command = [sys.executable, "-m", module, "serve", "--models", str(models),
               "--result-cache-mb", "0", "--jobs-dir", str(jobs)]  # fmt: skip
    log = tmp_path / f"{module}.log"
    with (
        running_process(command, log_path=log) as (process, url),
        httpx.Client(base_url=url, timeout=120) as client,
    ):
        warm = tmp_path / "warm.jsonl"  # (every path a batch takes, run once before idle)
        warm.write_bytes(b"".join(request_line(f"w{i}", t) for i, t in enumerate(texts(300))))
        batch_peak(client, process.pid, pss(process.pid), warm)
        time.sleep(1.0)
        idle = pss(process.pid)
        found = [batch_peak(client, process.pid, idle, source) for source in sources]
        time.sleep(2.0)
        after = pss(process.pid) - idle
    return found, after


def assert_bounded(found: list[Measured], after: int) -> None:
    for one in found:
        assert one.peak_above_idle <= TIMES_THE_FILE * one.file_bytes, (
            f"{one.name}: {one.peak_above_idle / MiB:.0f} MiB above idle for a "
            f"{one.file_bytes / MiB:.1f} MiB file ({one.times_the_file:.1f}x)"
        )
    assert after <= BACK_WITHIN, f"{after / MiB:.0f} MiB above idle after the batches"


def test_a_batchs_memory_scales_with_what_it_keeps(
    repository: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = repository("st")
    passages = passages_file(tmp_path / "passages.jsonl", 20 * MiB)
    tiny = tiny_lines_file(tmp_path / "tiny.jsonl", 100_000)
    found, after = measured(models, tmp_path, "bucketserve", [passages, tiny])
    with capsys.disabled():
        for one in found:
            print(
                f"\n{one.name}: {one.file_bytes / MiB:.1f} MiB, peak "
                f"+{one.peak_above_idle / MiB:.1f} MiB Pss ({one.times_the_file:.2f}x)"
            )
        print(f"after the batches: +{after / MiB:.1f} MiB Pss above idle")
    assert_bounded(found, after)
    # the negative control: a deliberately retained copy of each line is caught
    kept, kept_after = measured(models, tmp_path, "tests.retaining_server", [tiny])
    with capsys.disabled():
        print(f"control, lines retained: peak +{kept[0].peak_above_idle / MiB:.1f} MiB "
              f"({kept[0].times_the_file:.2f}x), after +{kept_after / MiB:.1f} MiB")  # fmt: skip
    with pytest.raises(AssertionError):
        assert_bounded(kept, kept_after)

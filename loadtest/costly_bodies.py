"""`python -m loadtest.costly_bodies`: what a body built to be expensive costs the server.

A server of its own on the bundled models; for each route and each costly shape (nulls where
texts go, floats where token ids go, lists nested deeper than the input), a body as close to
the body limit as the shape allows is sent once, while another client asks for liveness every
10 ms. For each: the answer's status, the server's CPU for the request, its Pss growth at the
peak, and the slowest health answer meanwhile. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson

from loadtest.process import ROOT, running_server
from loadtest.pss import pss

Shape = Callable[[int], dict[str, Any]]
V2 = "/v2/models/tiny-encoder/infer"


def _v2(data: Callable[[int], list[Any]]) -> Shape:
    def body(n: int) -> dict[str, Any]:
        return {
            "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, n], "data": data(n)}]
        }

    return body


SHAPES: dict[str, tuple[str, Shape]] = {
    "/v1/embeddings, nulls": ("/v1/embeddings", lambda n: {"model": "m", "input": [None] * n}),
    "/v1/embeddings, floats": (
        "/v1/embeddings",
        lambda n: {"model": "m", "input": [[0.5] * 100] * (n // 100)},
    ),
    "/v1/embeddings, nested lists": (
        "/v1/embeddings",
        lambda n: {"model": "m", "input": [[[1]] * 100] * (n // 100)},
    ),
    "/predict, one sequence of floats": (
        "/predict",
        lambda n: {"model": "tiny-encoder", "sequences": [[0.5] * n]},
    ),
    "/predict, nested lists": (
        "/predict",
        lambda n: {"model": "tiny-encoder", "sequences": [[[[1]]] * n]},
    ),
    "/v2 infer, floats": (V2, _v2(lambda n: [0.5] * n)),
    "/v2 infer, nested lists": (V2, _v2(lambda n: [[[1]]] * n)),
}


def filled(shape: Shape, limit: int) -> bytes:
    """The largest body of `shape` under `limit` bytes (its size found by bisection)."""
    low, high = 1, 2
    while len(orjson.dumps(shape(high))) < limit:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if len(orjson.dumps(shape(middle))) < limit else (low, middle)
    return orjson.dumps(shape(low))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(url: str, pid: int, path: str, body: bytes, copies: int = 1) -> dict[str, Any]:
    """`body` sent to `path` (`copies` of it at once) while liveness is asked every 10 ms:
    the first answer's status, the server's CPU, its Pss growth at the peak, the slowest
    health answer, and the wall time until every copy was answered."""
    health: list[float] = []
    peak = [pss(pid)]
    before = peak[0]
    done = threading.Event()

    def watch() -> None:
        with httpx.Client(base_url=url) as client:
            while not done.is_set():
                began = time.perf_counter()
                client.get("/v2/health/live", timeout=600)
                health.append(time.perf_counter() - began)
                peak.append(pss(pid))
                done.wait(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    time.sleep(0.1)
    cpu = cpu_seconds(pid)
    began = time.perf_counter()
    with ThreadPoolExecutor(copies) as pool:
        answers = list(pool.map(lambda _: _post(url + path, body), range(copies)))
    seconds = time.perf_counter() - began
    cpu = cpu_seconds(pid) - cpu
    time.sleep(0.05)
    done.set()
    watcher.join()
    return {
        "status": answers[0].status_code,
        "mib": len(body) / 2**20,
        "cpu_s": cpu,
        "seconds": seconds,
        "pss_growth_mib": (max(peak) - before) / 2**20,
        "worst_health_ms": 1000 * max(health),
    }


def _post(url: str, body: bytes) -> httpx.Response:
    return httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.costly_bodies", description=__doc__)
    parser.add_argument("--limit", type=int, default=8 * 2**20, help="--max-body-bytes")
    args = parser.parse_args(argv)
    print(
        "| body | MiB | status | server CPU s | Pss growth MiB | slowest health answer ms |\n"
        "| --- | --- | --- | --- | --- | --- |"
    )
    with tempfile.TemporaryDirectory() as scratch:
        flags = ("--max-body-bytes", str(args.limit), "--log-level", "warning")
        log = Path(scratch) / "server.log"
        with running_server(ROOT / "models", *flags, log_path=log) as (process, url):
            for name, (path, shape) in SHAPES.items():
                row = measure(url, process.pid, path, filled(shape, args.limit - 256))
                print(
                    f"| {name} | {row['mib']:.1f} | {row['status']} | {row['cpu_s']:.2f} | "
                    f"{row['pss_growth_mib']:.0f} | {row['worst_health_ms']:.0f} |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

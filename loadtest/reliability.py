"""`python -m loadtest.reliability`: how a real `bucketserve serve` holds under the traffic that
breaks servers. One run, against minilm when it is built (else tiny-encoder), with text
payloads of natural lengths (what users of a text model send):

- overload: 128 closed-loop clients against a queue of 32 sequences, then the same requests
  from one client: the statuses, and the p99 of what was admitted against the unloaded p99;
- slow clients: silent, slow-header and slow-body connections opened at once: when each was
  closed, and the p50/p99 of one well-behaved client meanwhile;
- soak: 16 clients for `--soak-minutes`: requests, errors, and the server's Pss (proportional
  set size) at the start and the end;
- drain: 32 keep-alive clients, then SIGTERM: their outcomes, the exit status and time.

Writes reliability.json to --out and prints a markdown summary (RELIABILITY.md holds a run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from loadtest.lengths import LengthDistribution
from loadtest.loadgen import closed_loop, encode_post, http
from loadtest.payloads import texts
from loadtest.process import ROOT, running_server
from loadtest.pss import pss


def repository(model: str, scratch: Path, part: str, queue_capacity: int | None = None) -> Path:
    """A repository of the one model for one part of the run (with a smaller queue, if asked)."""
    root = scratch / part / "models"
    shutil.copytree(ROOT / "models" / model, root / model, symlinks=True)
    if queue_capacity is not None:
        config = root / model / "config.toml"
        lines = [
            f"queue_capacity = {queue_capacity}" if line.startswith("queue_capacity") else line
            for line in config.read_text().splitlines()
        ]
        config.write_text("\n".join(lines) + "\n")
    return root


def bodies(model: str, count: int) -> list[bytes]:
    lengths = [
        int(n)
        for n in LengthDistribution.parse("natural", 200).sample(np.random.default_rng(1), count)
    ]
    payload = texts(lengths) if model == "minilm" else None
    items = (
        [{"text": [t], "outputs": ["sentence_embedding"]} for t in payload]
        if payload is not None
        else [{"sequences": [[7] * n], "outputs": ["sentence_embedding"]} for n in lengths]
    )
    return [encode_post("/predict", orjson.dumps(item)) for item in items]


def overload(model: str, scratch: Path, requests: list[bytes], seconds: float) -> dict[str, Any]:
    root = repository(model, scratch, "overload", queue_capacity=32)
    with running_server(root, log_path=root.parent / "server.log") as (_, url):
        port = int(url.rsplit(":", 1)[1])
        alone = asyncio.run(closed_loop(http("127.0.0.1", port), requests, 1, seconds / 2))
        loaded = asyncio.run(closed_loop(http("127.0.0.1", port), requests, 128, seconds))
    statuses = Counter({"200": len(loaded.latencies), **loaded.errors})
    return {
        "clients": 128,
        "queue_capacity": 32,
        "statuses": dict(statuses),
        "admitted_p99_ms": loaded.percentile_ms(99),
        "unloaded_p99_ms": alone.percentile_ms(99),
    }


def slow_clients(
    model: str, scratch: Path, count: int, timeouts: tuple[float, float]
) -> dict[str, Any]:
    root = repository(model, scratch, "slow")
    flags = ("--header-timeout-s", str(timeouts[0]), "--body-timeout-s", str(timeouts[1]))
    with running_server(root, *flags, log_path=root.parent / "server.log") as (_, url):
        host, port = url.removeprefix("http://").split(":")

        async def attack() -> tuple[dict[str, list[float]], list[float]]:
            began = time.monotonic()
            kinds = {
                "silent": b"",
                "slow-header": b"POST /predict HTTP/1.1\r\nHost: x\r\n",
                "slow-body": b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: "
                b"application/json\r\nContent-Length: 1000\r\n\r\n{",
            }

            async def hold(sent: bytes) -> float:
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(sent)
                await reader.read()  # until the server closes it
                writer.close()
                return time.monotonic() - began

            holders = [asyncio.gather(*(hold(s) for _ in range(count))) for s in kinds.values()]
            good = asyncio.create_task(
                closed_loop(http(host, int(port)), bodies(model, 200), 1, 0.8 * sum(timeouts))
            )
            closed = await asyncio.gather(*holders)
            result = await good
            return dict(zip(kinds, closed, strict=True)), result.latencies

        closed, latencies = asyncio.run(attack())
    return {
        "connections": {kind: count for kind in closed},
        "closed_after_s": {kind: round(max(times), 2) for kind, times in closed.items()},
        "timeouts_s": {"header": timeouts[0], "body": timeouts[1]},
        "meanwhile_p50_ms": round(1000 * statistics.median(latencies), 1),
        "meanwhile_p99_ms": round(1000 * float(np.percentile(latencies, 99)), 1),
    }


def soak(model: str, scratch: Path, requests: list[bytes], minutes: float) -> dict[str, Any]:
    """Clients for `minutes`, the server's Pss read every tenth of the way (growth that levels
    off is warm-up: arenas and caches; growth that keeps its slope is a leak)."""
    root = repository(model, scratch, "soak")
    with running_server(root, log_path=root.parent / "server.log") as (process, url):
        port = int(url.rsplit(":", 1)[1])
        asyncio.run(
            closed_loop(http("127.0.0.1", port), requests, 16, min(10, 60 * minutes))
        )  # warm

        async def run() -> tuple[Any, list[float]]:
            samples = [pss(process.pid) / 2**20]

            async def sample() -> None:
                while True:
                    await asyncio.sleep(6 * minutes)
                    samples.append(pss(process.pid) / 2**20)

            sampler = asyncio.create_task(sample())
            result = await closed_loop(http("127.0.0.1", port), requests, 16, 60 * minutes)
            sampler.cancel()
            samples.append(pss(process.pid) / 2**20)
            return result, samples

        result, samples = asyncio.run(run())
    return {
        "minutes": minutes,
        "clients": 16,
        "answered": len(result.latencies),
        "errors": dict(result.errors),
        "pss_mib": [round(s, 1) for s in samples],
        "pss_growth": round(samples[-1] / samples[0] - 1, 4),
    }


def drain(model: str, scratch: Path, settle_s: float) -> dict[str, Any]:
    root = repository(model, scratch, "drain")
    outcomes: Counter[str] = Counter()
    lock, stop = threading.Lock(), threading.Event()
    sample = bodies(model, 64)

    def client(url: str, index: int) -> None:
        with httpx.Client(timeout=30) as http:
            i = index
            while not stop.is_set():
                i += 1
                body = sample[i % len(sample)].split(b"\r\n\r\n", 1)[1]
                headers = {"content-type": "application/json"}
                try:
                    outcome = str(
                        http.post(f"{url}/predict", content=body, headers=headers).status_code
                    )
                except httpx.ConnectError:
                    outcome = "refused"
                    stop.wait(0.02)
                except httpx.TransportError as exc:
                    outcome = f"reset or dropped ({type(exc).__name__})"
                with lock:
                    outcomes[outcome] += 1

    flags = ("--drain-timeout-s", "10")
    with running_server(root, *flags, log_path=root.parent / "server.log") as (process, url):
        threads = [threading.Thread(target=client, args=(url, i)) for i in range(32)]
        for t in threads:
            t.start()
        time.sleep(settle_s)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        time.sleep(1.5)
        stop.set()
        for t in threads:
            t.join(30)
        exit_code = process.wait(30)
        took = time.monotonic() - signalled
    return {
        "clients": 32,
        "outcomes": dict(outcomes),
        "exit_code": exit_code,
        "exit_after_s": round(took, 2),
    }


def markdown(report: dict[str, Any]) -> str:
    o, s, k, d = report["overload"], report["slow_clients"], report["soak"], report["drain"]
    return "\n".join(
        [
            f"model `{report['model']}`, {report['payload']}",
            f"- overload: {o['clients']} clients, queue {o['queue_capacity']}: statuses "
            f"{o['statuses']}; admitted p99 {o['admitted_p99_ms']:.0f} ms against "
            f"{o['unloaded_p99_ms']:.0f} ms unloaded",
            f"- slow clients: {s['connections']} closed after at most {s['closed_after_s']} s "
            f"(timeouts {s['timeouts_s']}); one client meanwhile p50 {s['meanwhile_p50_ms']} ms, "
            f"p99 {s['meanwhile_p99_ms']} ms",
            f"- soak: {k['clients']} clients, {k['minutes']} min: {k['answered']} answered, "
            f"errors {k['errors'] or 0}; Pss every tenth of the way {k['pss_mib']} MiB "
            f"({100 * k['pss_growth']:+.1f}%)",
            f"- drain: {d['clients']} keep-alive clients, SIGTERM: {d['outcomes']}; exit "
            f"{d['exit_code']} after {d['exit_after_s']} s",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.reliability", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("reliability-results"))
    parser.add_argument("--soak-minutes", type=float, default=10.0)
    parser.add_argument("--slow-connections", type=int, default=50, help="of each kind")
    parser.add_argument("--overload-seconds", type=float, default=20.0)
    parser.add_argument("--smoke", action="store_true", help="every part in seconds (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.soak_minutes, args.slow_connections, args.overload_seconds = 0.05, 3, 2.0
    timeouts = (1.0, 2.0) if args.smoke else (5.0, 10.0)
    model = (
        "minilm" if (ROOT / "models" / "minilm" / "1" / "model.onnx").is_file() else "tiny-encoder"
    )
    requests = bodies(model, 2000)
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        print("overload", file=sys.stderr)
        report: dict[str, Any] = {
            "model": model,
            "payload": "text, natural lengths" if model == "minilm" else "token ids",
            "overload": overload(model, scratch, requests, args.overload_seconds),
        }
        print("slow clients", file=sys.stderr)
        report["slow_clients"] = slow_clients(model, scratch, args.slow_connections, timeouts)
        print("soak", file=sys.stderr)
        report["soak"] = soak(model, scratch, requests, args.soak_minutes)
        print("drain", file=sys.stderr)
        report["drain"] = drain(model, scratch, 1.0 if args.smoke else 3.0)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reliability.json").write_text(json.dumps(report, indent=2))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a bulk job (OpenAI's Batch API) gets out of the machine, in one run on the same texts:

- the ceiling: ONNX Runtime alone on the texts' token sequences, in ideal batches (sorted by
  length, full), in its best thread layout (`bench.Ceiling`);
- the job: the texts as a batch of `/v1/embeddings` lines (one text a line), from its
  creation to its completion, on `bucketserve serve` (a process of its own);
- online: the same texts sent to the same server by `--clients` concurrent clients, one text
  a request, each text once;
- live traffic: short queries from 4 clients (one at a time each) for `--seconds`, on the idle
  server and while a job runs; their p50 and p99, and one of the job's batches' mean run time
  (the server's compute time over its batches while the job ran alone).

Rounds alternate the job and the online clients (best of each reported). Texts are passages
(`--lengths passages`: lognormal, median ~65 tokens, up to 250, as a corpus being indexed) or
sentences (`sentences`: the benchmark's natural lengths, median ~22, long-tailed).

    python -m loadtest.bulk --texts 3000 --clients 16 --rounds 2 --seconds 15
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from bucketserve.loading import load_model_spec
from bucketserve.loading.builder import load_tokenizer
from loadtest.bench import Ceiling
from loadtest.lengths import LengthDistribution
from loadtest.loadgen import closed_loop, encode_post
from loadtest.payloads import natural_texts
from loadtest.process import running_server
from loadtest.scheduling_bench import connect, documents, latency, metric, queries, scrape

MODELS = Path(__file__).resolve().parent.parent / "models"
MODEL = "minilm"
LIVE_CLIENTS = 4


def batch_lines(texts: list[str], prefix: str) -> bytes:
    return b"".join(
        orjson.dumps({"custom_id": f"{prefix}{i}", "method": "POST", "url": "/v1/embeddings",
                      "body": {"model": MODEL, "input": text}}) + b"\n"
        for i, text in enumerate(texts)
    )  # fmt: skip


def start_job(client: httpx.Client, data: bytes) -> str:
    upload = client.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
    upload.raise_for_status()
    body = {"input_file_id": upload.json()["id"], "endpoint": "/v1/embeddings",
            "completion_window": "24h"}  # fmt: skip
    created = client.post("/v1/batches", json=body)
    created.raise_for_status()
    return str(created.json()["id"])


def job_state(client: httpx.Client, batch_id: str) -> dict[str, Any]:
    answer: dict[str, Any] = client.get(f"/v1/batches/{batch_id}").json()
    return answer


def run_job(url: str, texts: list[str], round_: int) -> float:
    """Seconds from the batch's creation to its completion (its upload not counted)."""
    with httpx.Client(base_url=url, timeout=600) as client:
        data = batch_lines(texts, f"r{round_}-")
        began = time.perf_counter()
        batch_id = start_job(client, data)
        while (state := job_state(client, batch_id))["status"] not in ("completed", "failed"):
            time.sleep(0.02)
        took = time.perf_counter() - began
        counts = state["request_counts"]
        if (state["status"], counts["completed"]) != ("completed", len(texts)):
            raise RuntimeError(f"the job did not complete: {state}")
        return took


async def online(url: str, texts: list[str], clients: int) -> float:
    """Seconds for `clients` concurrent clients to send every text once, one a request."""
    bodies = [encode_post("/v1/embeddings", orjson.dumps({"model": MODEL, "input": t}))
              for t in texts]  # fmt: skip
    queue = list(reversed(bodies))
    failures: list[str] = []

    async def client() -> None:
        conn = await connect(url)()
        try:
            while queue:
                failure = await conn.send(queue.pop())
                if failure is not None:
                    failures.append(failure)
        finally:
            await conn.close()

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    took = time.perf_counter() - began
    assert not failures, failures[:5]
    return took


def live(url: str, asks: list[bytes], seconds: float) -> dict[str, Any]:
    return latency(asyncio.run(closed_loop(connect(url), asks, LIVE_CLIENTS, seconds)))


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    spec = load_model_spec(MODELS / MODEL)
    if spec is None or spec.tokenizer_path is None or spec.config.tokenizer is None:
        raise SystemExit(f"{MODEL} is not built: bucketserve models build {MODEL}")
    tokenizer_file = str(spec.tokenizer_path)
    if args.lengths == "passages":
        texts = [
            t for part in documents(tokenizer_file, args.texts // 50, 50, seed=3) for t in part
        ]
    else:
        drawn = LengthDistribution.parse("natural", spec.config.batching.longest)
        lengths = drawn.sample(np.random.default_rng(3), args.texts)
        texts = natural_texts(tokenizer_file, [int(n) for n in lengths], seed=3)
    tokenizer = load_tokenizer(spec.tokenizer_path, spec.config.tokenizer.max_length)
    sequences = [np.asarray(e.ids, np.int64) for e in tokenizer.encode_batch(texts)]
    tokens = sum(len(s) for s in sequences)
    ceiling = Ceiling(spec, sequences, os.cpu_count() or 1).measure(args.ceiling_seconds)
    rows = spec.config.batching.max_batch_size
    asks = [
        encode_post("/v1/embeddings", orjson.dumps({"model": MODEL, "input": [q]}))
        for q in queries(tokenizer_file, 200, seed=90_000)
    ]
    flags = ("--jobs-dir", str(root / "jobs"), "--cache-dir", str(root / "cache"))
    with running_server(MODELS, *flags, log_path=root / "server.log") as (_, url):
        asyncio.run(online(url, texts[:400], args.clients))  # (every key bound, warm)
        jobs, onlines = [], []
        for round_ in range(args.rounds):
            jobs.append(run_job(url, texts, round_))
            onlines.append(asyncio.run(online(url, texts, args.clients)))
        before = scrape(url)
        run_job(url, texts, args.rounds)
        after = scrape(url)
        batches = metric(after, "bucketserve_compute_seconds_count") - metric(
            before, "bucketserve_compute_seconds_count"
        )
        batch_s = (
            metric(after, "bucketserve_compute_seconds_sum")
            - metric(before, "bucketserve_compute_seconds_sum")
        ) / max(batches, 1)
        idle = live(url, asks, args.seconds)
        with httpx.Client(base_url=url, timeout=600) as client:
            many = [f"{text} {n}" for n in range(20) for text in texts]  # (no two alike)
            long_job = start_job(client, batch_lines(many, "long-"))
            while job_state(client, long_job)["status"] != "in_progress":
                time.sleep(0.02)
            done_before = job_state(client, long_job)["request_counts"]["completed"]
            began = time.perf_counter()
            busy = live(url, asks, args.seconds)
            done = job_state(client, long_job)["request_counts"]["completed"] - done_before
            busy_job_lines = done / (time.perf_counter() - began)
            client.post(f"/v1/batches/{long_job}/cancel").raise_for_status()
    job_s, online_s = min(jobs), min(onlines)
    report = {
        "model": MODEL,
        "lengths": args.lengths,
        "texts": len(texts),
        "tokens": tokens,
        "cores": os.cpu_count(),
        "clients": args.clients,
        "ceiling": {"seq_per_s": ceiling["seq_per_s"], "layout": ceiling["layout"]},
        "ceiling_at_served_rows": served_ceiling(ceiling, rows),
        "job": {"seq_per_s": len(texts) / job_s, "tok_per_s": tokens / job_s, "rounds_s": jobs},
        "online": {"seq_per_s": len(texts) / online_s, "rounds_s": onlines},
        "live_idle": idle,
        "live_with_job": busy | {"job_lines_per_s": busy_job_lines},
        "job_batch_ms": batch_s * 1000,
    }
    report["job_over_ceiling"] = report["job"]["seq_per_s"] / ceiling["seq_per_s"]
    at_rows = report["ceiling_at_served_rows"]["seq_per_s"]
    report["job_over_ceiling_at_served_rows"] = report["job"]["seq_per_s"] / at_rows
    report["job_over_online"] = report["job"]["seq_per_s"] / report["online"]["seq_per_s"]
    bound = 2 * idle["p99_ms"] + report["job_batch_ms"]
    report["live_p99_bound_ms"] = bound
    return report


def served_ceiling(ceiling: dict[str, Any], rows: int) -> dict[str, Any]:
    """The ceiling's best layout among those with the server's batch size (its rows)."""
    same = {name: v for name, v in ceiling["layouts"].items() if name.endswith(f" of {rows}")}
    name = max(same, key=lambda n: same[n]["seq_per_s"])
    return {"seq_per_s": same[name]["seq_per_s"], "layout": name}


def markdown(report: dict[str, Any]) -> str:
    idle, busy = report["live_idle"], report["live_with_job"]
    rows = [
        f"{report['texts']} {report['lengths']} ({report['tokens']} tokens), {report['model']}, "
        f"{report['cores']} cores, one run:",
        "",
        "| | texts/s | ratio |",
        "| --- | --- | --- |",
        f"| ONNX Runtime alone, ideal batches ({report['ceiling']['layout']}) | "
        f"{report['ceiling']['seq_per_s']:.0f} | 1.00 |",
        f"| ONNX Runtime alone, the server's batch size "
        f"({report['ceiling_at_served_rows']['layout']}) | "
        f"{report['ceiling_at_served_rows']['seq_per_s']:.0f} | "
        f"{report['ceiling_at_served_rows']['seq_per_s'] / report['ceiling']['seq_per_s']:.2f} |",
        f"| a batch (Batch API), creation to completion | {report['job']['seq_per_s']:.0f} | "
        f"{report['job_over_ceiling']:.2f} of the ceiling; "
        f"{report['job_over_ceiling_at_served_rows']:.2f} at the server's batch size |",
        f"| online, {report['clients']} clients, a text a request | "
        f"{report['online']['seq_per_s']:.0f} | the batch: {report['job_over_online']:.2f}x |",
        "",
        "| live queries (4 clients) | p50 ms | p99 ms |",
        "| --- | --- | --- |",
        f"| idle server | {idle['p50_ms']:.1f} | {idle['p99_ms']:.1f} |",
        f"| while a job runs (its shortest lines first: {busy['job_lines_per_s']:.0f} a second) | "
        f"{busy['p50_ms']:.1f} | {busy['p99_ms']:.1f} |",
        "",
        f"Bound (2 x idle p99 + one of the job's batches, {report['job_batch_ms']:.1f} ms): "
        f"{report['live_p99_bound_ms']:.1f} ms.",
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=3000)
    parser.add_argument("--lengths", choices=("passages", "sentences"), default="passages")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=15.0, help="live traffic, each part")
    parser.add_argument("--ceiling-seconds", type=float, default=5.0)
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        report = measure(args, Path(scratch))
    print(markdown(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

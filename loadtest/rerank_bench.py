"""What batching by length buys a reranker: one query against 100 documents of natural
lengths per request, 16 clients, against two servers a user would otherwise run
(`loadtest.naive_rerank`): one that pads each request's pairs to its longest and runs them as
one batch, and one that runs a pair at a time.

The cross-encoder is MiniLM-L6's encoder (the weights `bucketserve models build minilm` uses)
under a one-label head with seeded weights, exported as optimum exports a
`ForSequenceClassification` and brought in with `models import`: what a real MS MARCO
MiniLM-L6 cross-encoder computes, at its cost. Documents are passages of natural lengths
(lognormal, median ~65 tokens, up to 250), queries 5 to 12 words.

Each server's answers are first compared with the pair-at-a-time server's (the model on each
pair alone); then closed loops of 16 clients in rounds taking turns (pairs per second, as
ratios to the padding server, from the same run); then an open loop at half bucketserve's
throughput against each (p50, p99: of the few dozen requests a minute holds).

    python -m loadtest.rerank_bench --seconds 15 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bucketserve.loading.importer import import_model
from loadtest.loadgen import Result, closed_loop, encode_post, http, open_loop
from loadtest.payloads import natural_texts
from loadtest.process import running_process, running_server
from modelgen.hf_export import export_text_model
from modelgen.minilm import _model_source

DOCUMENTS = 100
CLIENTS = 16
REQUESTS = 24  # distinct request bodies, sent round and round


def write_cross_encoder(folder: Path) -> None:
    """MiniLM-L6 under a one-label head, exported as optimum writes a sequence classifier."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForSequenceClassification

    source = _model_source()
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        source, num_labels=1, local_files_only=True, attn_implementation="eager"
    ).eval()
    folder.mkdir(parents=True)
    logits = {"logits": {0: "batch_size"}}
    export_text_model(model, folder / "model.onnx", logits, model.config.vocab_size)
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    (folder / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))


def bodies(tokenizer_file: Path, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    requests = []
    for r in range(REQUESTS):
        lengths = np.clip(np.round(rng.lognormal(4.17, 0.6, DOCUMENTS)), 8, 250).astype(int)
        documents = natural_texts(str(tokenizer_file), lengths.tolist(), seed=seed + r)
        (query,) = natural_texts(str(tokenizer_file), [int(rng.integers(5, 13))], seed=10_000 + r)
        requests.append({"query": query, "texts": documents, "truncate": True})
    return requests


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url + "/rerank", orjson.dumps(body), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as answer:
        return orjson.loads(answer.read())


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    export, models, logs = root / "export", root / "models", root / "logs"
    write_cross_encoder(export)
    import_model(export, models, "cross-encoder")
    entry = models / "cross-encoder"
    # 16 clients of 100 pairs keep 1,600 pairs in the server: a queue that holds them all
    # (the default, 1,024, refuses some requests with 503 and a Retry-After)
    config = (entry / "config.toml").read_text()
    config = config.replace("[batching]\n", "[batching]\nqueue_capacity = 4096\n")
    if args.edges_every:  # buckets every N tokens in place of the import's (each 1.5x the last)
        edges = [*range(args.edges_every, 256, args.edges_every), 256]
        config = re.sub(r"buckets = \[[^]]*\]", f"buckets = {edges}", config)
    (entry / "config.toml").write_text(config)
    requests = bodies(entry / "1" / "tokenizer.json")
    raw = [encode_post("/rerank", orjson.dumps(b)) for b in requests]
    logs.mkdir()
    naive = [sys.executable, "-m", "loadtest.naive_rerank", str(entry)]
    with (
        running_server(models, "--cache-dir", str(root / "cache"), log_path=logs / "ours") as ours,
        running_process([*naive, "--pad"], log_path=logs / "padding") as padding,
        running_process(naive, log_path=logs / "single") as single,
    ):
        urls = {"bucketserve": ours[1], "padding": padding[1], "single": single[1]}
        worst = 0.0
        for body in requests[:3]:
            want = {r["index"]: r["score"] for r in post(urls["single"], body)}
            for name in ("bucketserve", "padding"):
                got = {r["index"]: r["score"] for r in post(urls[name], body)}
                worst = max(worst, max(abs(got[i] - want[i]) for i in want))

        def connect(name: str) -> Any:
            host, port = urls[name].removeprefix("http://").split(":")
            return http(host, int(port))

        rounds: dict[str, list[float]] = {name: [] for name in urls}
        for _ in range(args.rounds):
            for name in urls:
                result = asyncio.run(closed_loop(connect(name), raw, CLIENTS, args.seconds))
                assert not result.errors, (name, result.errors)
                rounds[name].append(result.throughput * DOCUMENTS)
        rate = statistics.median(rounds["bucketserve"]) / DOCUMENTS / 2
        half: dict[str, Result] = {
            name: asyncio.run(open_loop(connect(name), raw, rate, args.half_seconds))
            for name in urls
        }
    return {
        "documents": DOCUMENTS,
        "clients": CLIENTS,
        "worst_score_difference": worst,
        "pairs_per_s": {name: statistics.median(v) for name, v in rounds.items()},
        "rounds": rounds,
        "half_load_requests_per_s": rate,
        "half_load": {
            name: {
                "p50_ms": r.percentile_ms(50),
                "p99_ms": r.percentile_ms(99),
                "answered": len(r.latencies),
                "errors": dict(r.errors),
            }
            for name, r in half.items()
        },
    }


def markdown(report: dict[str, Any]) -> str:
    base = report["pairs_per_s"]["padding"]
    lines = [
        "| server | pairs/s | against padding | p50 at half load | p99 at half load | answered |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, pairs in report["pairs_per_s"].items():
        half = report["half_load"][name]
        lines.append(
            f"| {name} | {pairs:.0f} | {pairs / base:.2f}x | {half['p50_ms']:.0f} ms "
            f"| {half['p99_ms']:.0f} ms | {half['answered']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15, help="each closed and open loop")
    parser.add_argument("--rounds", type=int, default=2, help="closed loops per server")
    parser.add_argument("--out", type=Path, help="the report as JSON")
    parser.add_argument("--edges-every", type=int, help="bucket edges every N tokens")
    parser.add_argument("--half-seconds", type=float, default=60, help="each open loop")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        report = measure(args, Path(folder))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    print(markdown(report))
    print(f"worst score difference from a pair alone: {report['worst_score_difference']:.2g}")


if __name__ == "__main__":
    main()

"""A long-context model under a memory budget smaller than its worst batch: what the mixed
load of 1 to 8,192 tokens gets.

A tiny ModernBERT embedder at its real 8,192 tokens (`modelgen.long_context`) is imported by
the command as a user runs it, then served (`bucketserve serve`, a process of its own) with
`--memory-budget`; `--clients` closed-loop clients send texts of lengths drawn uniformly from 1
to past the model's 8,192 tokens (`mixed_lengths`: half short, up to 256 tokens, as queries
are; half spread to past the context, as documents are; a text a request, `/v1/embeddings`),
after the short texts alone, for their latency on an idle server (sent twice: the first time
binds their buckets). The server's Pss (proportional set size) is read every 20 ms
throughout the mixed load. Reported: requests answered (200) and refused (413: a
batch of one that long would not fit), sequences and tokens a second of those answered, the
latency of short texts (at most 256 tokens) sent while a long one (over 2,048) ran against
the same texts on the idle server, the most Pss the server held above its idle Pss against
the budget, and the most the server's gate let running batches need at once.

    python -m loadtest.long_context --budget 600MiB --clients 16 --requests 200
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bucketserve.settings import Settings
from loadtest.process import running_server
from loadtest.pss import pss, pss_sampled
from loadtest.scheduling_bench import metric, scrape

SHORT, LONG = 256, 2048  # a short text, and a long one (tokens)


@dataclass(frozen=True)
class Answered:
    """One request: its text's tokens (as the server counts them, or as the tokenizer does
    for a refusal), status, when it was sent and answered (monotonic seconds), and its vector
    (or error message)."""

    index: int
    tokens: int
    status: int
    began: float
    ended: float
    vector: list[float] | None
    error: str | None


def mixed_lengths(count: int, context: int, seed: int = 0) -> list[int]:
    """`count` lengths in tokens, in a random order: half up to `SHORT`, half spread
    uniformly from there to 10% past `context`."""
    rng = np.random.default_rng(seed)
    short = rng.integers(1, SHORT + 1, count // 2)
    long = rng.integers(SHORT + 1, int(context * 1.1), count - count // 2)
    lengths = np.concatenate([short, long])
    rng.shuffle(lengths)
    return [int(n) for n in lengths]


def texts_of(lengths: Sequence[int], seed: int = 0) -> list[str]:
    """A text of about each length in tokens (each word of `modelgen.wordpiece` one token)."""
    from modelgen.long_context import text_of

    return [text_of(n, seed + i) for i, n in enumerate(lengths)]


def mixed_load(
    url: str, model: str, texts: Sequence[str], tokens: Sequence[int], clients: int
) -> list[Answered]:
    """Every text sent once to `/v1/embeddings` by `clients` closed-loop clients, in order;
    a connection that fails is recorded as status 0."""
    pending = iter(range(len(texts)))
    lock = threading.Lock()
    answered: list[Answered] = []

    def client() -> None:
        with httpx.Client(base_url=url, timeout=600) as http:
            while True:
                with lock:
                    i = next(pending, None)
                if i is None:
                    return
                began = time.monotonic()
                try:
                    response = http.post("/v1/embeddings", json={"model": model, "input": texts[i]})
                    status, body = response.status_code, response.json()
                except httpx.HTTPError as exc:
                    status, body = 0, {"error": {"message": f"{type(exc).__name__}: {exc}"}}
                ended = time.monotonic()
                ok = status == 200
                counted = body["usage"]["prompt_tokens"] if ok else tokens[i]
                vector = body["data"][0]["embedding"] if ok else None
                error = None if ok else str(body.get("error"))
                with lock:
                    answered.append(Answered(i, counted, status, began, ended, vector, error))

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client) for _ in range(clients)]:
            future.result()
    return sorted(answered, key=lambda a: a.index)


def beside_long(answered: Sequence[Answered]) -> list[float]:
    """The latency of each short text answered while a long one ran (sent after it was, and
    answered before it was)."""
    longs = [a for a in answered if a.status == 200 and a.tokens > LONG]
    return [
        a.ended - a.began
        for a in answered
        if a.status == 200
        and a.tokens <= SHORT
        and any(b.began <= a.began and a.ended <= b.ended for b in longs)
    ]


def counted_tokens(tokenizer_file: Path, texts: Sequence[str], longest: int) -> list[int]:
    """Each text's tokens as the model's tokenizer makes them, cut at `longest`."""
    from bucketserve.loading.builder import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_file, longest)
    return [len(e.ids) for e in tokenizer.encode_batch(list(texts))]


def imported(folder: Path, models: Path, *flags: str) -> str:
    """`bucketserve models import FOLDER` as a user runs it: what it printed."""
    command = [sys.executable, "-m", "bucketserve", "models", "import", str(folder)]
    result = subprocess.run(
        [*command, "--models", str(models), *flags], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"models import failed: {result.stderr[-3000:]}")
    return result.stdout


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from modelgen.long_context import MODERNBERT_CONTEXT, modernbert

    modernbert(root)
    models = root / "models"
    imported(root / "modernbert", models)
    budget = Settings(memory_budget=args.budget).memory_budget_bytes()
    assert budget is not None
    lengths = mixed_lengths(args.requests, MODERNBERT_CONTEXT, args.seed)
    texts = texts_of(lengths, args.seed)
    tokenizer = models / "modernbert" / "1" / "tokenizer.json"
    tokens = counted_tokens(tokenizer, texts, MODERNBERT_CONTEXT)
    flags = ("--memory-budget", args.budget)
    with running_server(models, *flags, log_path=root / "server.log") as (process, url):
        config = httpx.get(f"{url}/v2/models/modernbert/config", timeout=30).json()
        shorts = [t for t, n in zip(texts, tokens, strict=True) if n <= SHORT]
        short_tokens = [n for n in tokens if n <= SHORT]
        mixed_load(url, "modernbert", shorts, short_tokens, args.clients)  # (keys bound)
        alone = mixed_load(url, "modernbert", shorts, short_tokens, args.clients)
        idle = pss(process.pid)
        with pss_sampled(process.pid) as samples:
            began = time.monotonic()
            answered = mixed_load(url, "modernbert", texts, tokens, args.clients)
            took = time.monotonic() - began
        peak_running = metric(scrape(url), "bucketserve_memory_running_peak_bytes")
    served = [a for a in answered if a.status == 200]
    beside = beside_long(answered)
    return {
        "budget_bytes": budget,
        "longest_served": config["memory"]["longest"],
        "footprint": config["memory"].get("footprint"),
        "requests": len(answered),
        "statuses": dict(Counter(str(a.status) for a in answered)),
        "sequences_per_s": len(served) / took,
        "tokens_per_s": sum(a.tokens for a in served) / took,
        "short_beside_long": {
            "count": len(beside),
            "p50_ms": 1000 * percentile(beside, 50),
            "p99_ms": 1000 * percentile(beside, 99),
        },
        "short_idle": {
            "count": len(alone),
            "p50_ms": 1000 * percentile([a.ended - a.began for a in alone], 50),
            "p99_ms": 1000 * percentile([a.ended - a.began for a in alone], 99),
        },
        "pss_idle_bytes": idle,
        "pss_peak_above_idle_bytes": max(samples) - idle,
        "gate_peak_running_bytes": peak_running,
        "answered": [asdict(a) | {"vector": None} for a in answered],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="600MiB", help="the server's --memory-budget")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="the figures as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        figures = run(args, Path(tmp))
    shown = {k: v for k, v in figures.items() if k != "answered"}
    print(json.dumps(shown, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

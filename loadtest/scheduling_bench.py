"""What scheduling beyond arrival order buys, on minilm's embeddings over OpenAI's route (the
traffic an embedding server gets), in three parts of one run:

- priority: a bulk job floods the server with documents (32 a request, natural lengths) while
  4 interactive clients send one short query at a time. The queries' p50 and p99 on an idle
  server, under the flood in arrival order (no priority sent), and under the flood with the
  queries at level 1 and the bulk job at level 3 (X-Priority); the bulk job's documents per
  second alone, and under each. One batch's run time is the bulk job's mean batch, from the
  server's own metrics.
- tenants: two API keys, equal weights; one tenant floods (12 clients), the other sends from
  4. Each tenant's share of the tokens served (the server's per-tenant counters), with fair
  shares on (two tenants) and off (the same two loads behind one key).
- cache: 16 clients send 8 texts a request drawn from a Zipf law over 3,000 texts (as query
  logs repeat), going down one log of 26,000 requests that never repeats a request;
  documents per second with the result cache on against off, the hit rate after a warm-up,
  the speed-up 1 / (1 - hit rate) predicts (and the one a hit's own cost predicts), and the
  cache's bytes against its bound.

    python -m loadtest.scheduling_bench --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psutil

from loadtest.loadgen import Result, closed_loop, encode_post, http
from loadtest.payloads import natural_texts
from loadtest.process import running_server

MODELS = Path(__file__).resolve().parent.parent / "models"
MODEL = "minilm"
ROUTE = "/v1/embeddings"


def embeddings(texts: list[str], **headers: str) -> bytes:
    body = orjson.dumps({"model": MODEL, "input": texts})
    return encode_post(ROUTE, body, headers)


def documents(tokenizer: str, requests: int, per_request: int, seed: int) -> list[list[str]]:
    """Passages of natural lengths (lognormal, median ~65 tokens, up to 250)."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(requests):
        lengths = np.clip(np.round(rng.lognormal(4.17, 0.6, per_request)), 8, 250).astype(int)
        out.append(natural_texts(tokenizer, lengths.tolist(), seed=seed + r))
    return out


def queries(tokenizer: str, count: int, seed: int) -> list[str]:
    """Queries of 5 to 12 words."""
    rng = np.random.default_rng(seed)
    return [
        natural_texts(tokenizer, [int(rng.integers(5, 13))], seed=seed + i)[0] for i in range(count)
    ]


def scrape(url: str, key: str | None = None) -> str:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(url + "/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return str(answer.read().decode())


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's series whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def quantile(before: str, after: str, name: str, q: float) -> float:
    """The q-quantile of a histogram's observations between two scrapes, interpolated in
    its buckets as Prometheus's histogram_quantile does."""
    lines = [line for line in after.splitlines() if line.startswith(f"{name}_bucket{{")]
    labels = {m for line in lines for m in re.findall(r'le="([^"]+)"', line)} - {"+Inf"}
    edges = sorted(labels, key=float)
    total = metric(after, f"{name}_count") - metric(before, f"{name}_count")
    rank, low, below = q * total, 0.0, 0.0
    for edge in edges:
        count = metric(after, f"{name}_bucket", le=edge) - metric(before, f"{name}_bucket", le=edge)
        if count >= rank:
            return low + (float(edge) - low) * (rank - below) / max(count - below, 1e-12)
        low, below = float(edge), count
    return float(edges[-1])


def connect(url: str) -> Any:
    host, port = url.removeprefix("http://").split(":")
    return http(host, int(port))


async def both(
    url: str, bulk: list[bytes], asks: list[bytes], seconds: float
) -> tuple[Result, Result]:
    flood, interactive = await asyncio.gather(
        closed_loop(connect(url), bulk, 4, seconds),
        closed_loop(connect(url), asks, 4, seconds),
    )
    return flood, interactive


def latency(result: Result) -> dict[str, Any]:
    return {
        "p50_ms": result.percentile_ms(50),
        "p99_ms": result.percentile_ms(99),
        "answered": len(result.latencies),
        "errors": dict(result.errors),
    }


def priority_part(root: Path, tokenizer: str, seconds: float) -> dict[str, Any]:
    passages = documents(tokenizer, 24, 32, seed=1)
    asked = queries(tokenizer, 200, seed=50_000)
    plain_bulk = [embeddings(p) for p in passages]
    low_bulk = [embeddings(p, **{"x-priority": "3"}) for p in passages]
    plain_asks = [embeddings([q]) for q in asked]
    high_asks = [embeddings([q], **{"x-priority": "1"}) for q in asked]
    flags = ("--result-cache-mb", "0", "--cache-dir", str(root / "cache"))
    with running_server(MODELS, *flags, log_path=root / "priority.log") as (_, url):
        asyncio.run(closed_loop(connect(url), plain_bulk, 4, seconds / 4))  # warm every key
        before = scrape(url)
        alone = asyncio.run(closed_loop(connect(url), plain_bulk, 4, seconds))
        after = scrape(url)
        idle = asyncio.run(closed_loop(connect(url), plain_asks, 4, seconds))
        off = asyncio.run(both(url, plain_bulk, plain_asks, seconds))
        on = asyncio.run(both(url, low_bulk, high_asks, seconds))
    for result in (alone, idle, *off, *on):
        assert not result.errors, result.errors
    batches = metric(after, "bucketserve_compute_seconds_count") - metric(
        before, "bucketserve_compute_seconds_count"
    )
    batch_s = (
        metric(after, "bucketserve_compute_seconds_sum")
        - metric(before, "bucketserve_compute_seconds_sum")
    ) / batches
    docs = 32
    longest = quantile(before, after, "bucketserve_compute_seconds", 0.99)
    return {
        "batch_ms": batch_s * 1000,
        "batch_p99_ms": longest * 1000,
        "bulk_docs_per_s": {
            "alone": alone.throughput * docs,
            "off": off[0].throughput * docs,
            "on": on[0].throughput * docs,
        },
        "queries": {"idle": latency(idle), "off": latency(off[1]), "on": latency(on[1])},
    }


async def contend(
    url: str, bodies: dict[str, list[bytes]], seconds: float
) -> tuple[Result, Result]:
    """The flooding tenant's 12 clients and the steady one's 4, at once."""
    flood, steady = await asyncio.gather(
        closed_loop(connect(url), bodies["flood"], 12, seconds),
        closed_loop(connect(url), bodies["steady"], 4, seconds),
    )
    return flood, steady


def tenants_part(root: Path, tokenizer: str, seconds: float) -> dict[str, Any]:
    passages = documents(tokenizer, 24, 16, seed=2)
    shares: dict[str, Any] = {}
    for mode in ("on", "off"):
        keys = root / f"keys-{mode}"
        if mode == "on":
            keys.write_text("flood sk-flood\nsteady sk-steady\n")
        else:  # one tenant: both loads behind one name, so arrival order
            keys.write_text("shared sk-flood\nshared sk-steady\n")
        flags = ["--api-key-file", str(keys), "--result-cache-mb", "0"]
        flags += ["--cache-dir", str(root / "cache")]
        if mode == "on":
            flags += ["--tenant-weights", "flood=1,steady=1"]
        bodies = {
            who: [embeddings(p, authorization=f"Bearer sk-{who}") for p in passages]
            for who in ("flood", "steady")
        }
        with running_server(MODELS, *flags, log_path=root / f"tenants-{mode}.log") as (_, url):
            asyncio.run(closed_loop(connect(url), bodies["flood"], 4, seconds / 4))
            before = scrape(url, "sk-flood")

            flood, steady = asyncio.run(contend(url, bodies, seconds))
            after = scrape(url, "sk-flood")
        tokens = {  # (with one tenant, all of them are its)
            who: metric(after, "bucketserve_class_tokens_total", tenant=who)
            - metric(before, "bucketserve_class_tokens_total", tenant=who)
            for who in ("flood", "steady")
        }
        shares[mode] = {
            # the documents each client group had answered (the same lengths drawn for both)
            "steady_share": steady.throughput / (flood.throughput + steady.throughput),
            "steady_token_share": tokens["steady"] / sum(tokens.values()) if mode == "on" else None,
            "flood_errors": dict(flood.errors),
            "steady_errors": dict(steady.errors),
            "docs_per_s": (flood.throughput + steady.throughput) * 16,
        }
    return shares


def cache_part(root: Path, tokenizer: str, seconds: float, bound_mb: float) -> dict[str, Any]:
    rng = np.random.default_rng(4)
    lengths = np.clip(np.round(rng.lognormal(3.0, 0.7, 3000)), 4, 128).astype(int)
    pool = natural_texts(tokenizer, lengths.tolist(), seed=7)
    ranks = rng.zipf(1.1, 800_000)
    drawn = ranks[ranks <= len(pool)] - 1
    stream = [embeddings([pool[i] for i in drawn[k : k + 8]]) for k in range(0, 208_000, 8)]
    # the measured loop goes on down the same log, never sending a request twice: its misses
    # are the texts asked for the first time (or again after the LRU let them go)
    warm_up, requests = stream[:6000], stream[6000:]
    report: dict[str, Any] = {}
    for mode, mb in (("off", "0"), ("on", str(bound_mb))):
        flags = ("--result-cache-mb", mb, "--cache-dir", str(root / "cache"))
        with running_server(MODELS, *flags, log_path=root / f"cache-{mode}.log") as (server, url):
            asyncio.run(closed_loop(connect(url), warm_up, 16, seconds / 2))
            before = scrape(url)
            result = asyncio.run(closed_loop(connect(url), requests, 16, seconds))
            after = scrape(url)
            pss = psutil.Process(server.pid).memory_full_info().pss
            # the request path alone: requests every text of which is kept (from the warm-up)
            kept = asyncio.run(closed_loop(connect(url), warm_up[:40], 16, seconds / 2))
        assert not result.errors, result.errors
        hits = metric(after, "bucketserve_result_cache_hits_total") - metric(
            before, "bucketserve_result_cache_hits_total"
        )
        shared = metric(after, "bucketserve_shared_sequences_total") - metric(
            before, "bucketserve_shared_sequences_total"
        )
        looked = (
            hits
            + metric(after, "bucketserve_result_cache_misses_total")
            - metric(before, "bucketserve_result_cache_misses_total")
        )
        report[mode] = {
            "docs_per_s": result.throughput * 8,
            "hit_rate": hits / looked if looked else 0.0,
            "shared_rate": shared / looked if looked else 0.0,
            "cache_bytes": metric(after, "bucketserve_result_cache_bytes"),
            "pss_bytes": pss,
            "repeats_docs_per_s": kept.throughput * 8,
            "bound_bytes": float(mb) * 2**20,
        }
    return report


def markdown(report: dict[str, Any]) -> str:
    p = report["priority"]
    q, bulk = p["queries"], p["bulk_docs_per_s"]
    target = 2 * q["idle"]["p99_ms"] + p["batch_ms"]
    lines = [
        "| queries | p50 | p99 | bulk docs/s | bulk against alone |",
        "| --- | --- | --- | --- | --- |",
        f"| idle server | {q['idle']['p50_ms']:.0f} ms | {q['idle']['p99_ms']:.0f} ms "
        f"| {bulk['alone']:.0f} (alone) | 1.00x |",
    ]
    for mode, name in (("off", "flood, arrival order"), ("on", "flood, priorities on")):
        lines.append(
            f"| {name} | {q[mode]['p50_ms']:.0f} ms | {q[mode]['p99_ms']:.0f} ms "
            f"| {bulk[mode]:.0f} | {bulk[mode] / bulk['alone']:.2f}x |"
        )
    longest = 2 * q["idle"]["p99_ms"] + p["batch_p99_ms"]
    lines.append(
        f"\nthe bulk job's batches: {p['batch_ms']:.0f} ms on average, {p['batch_p99_ms']:.0f} ms "
        f"at p99; 2 x idle p99 + one batch = {target:.0f} ms (a mean batch), {longest:.0f} ms "
        "(a p99 batch)"
    )
    t = report["tenants"]
    lines += [
        "",
        "| tenants | steady tenant's share of tokens (weight 0.50) | docs/s |",
        "| --- | --- | --- |",
        f"| fair shares on | {t['on']['steady_share']:.2f} | {t['on']['docs_per_s']:.0f} |",
        f"| one tenant (arrival order) | {t['off']['steady_share']:.2f} "
        f"| {t['off']['docs_per_s']:.0f} |",
    ]
    c = report["cache"]
    hit = c["on"]["hit_rate"]
    speedup = c["on"]["docs_per_s"] / c["off"]["docs_per_s"]
    # a document's cost: a miss as with the cache off, a hit as when every text is kept
    miss_s, hit_s = 1 / c["off"]["docs_per_s"], 1 / c["on"]["repeats_docs_per_s"]
    predicted = miss_s / ((1 - hit) * miss_s + hit * hit_s)
    lines += [
        "",
        "| cache | docs/s | speed-up | hit rate | 1 / (1 - hit rate) | with a hit's cost "
        "| bytes held / bound | Pss |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| off | {c['off']['docs_per_s']:.0f} | 1.00x | - | - | - | - "
        f"| {c['off']['pss_bytes'] / 2**20:.0f} MiB |",
        f"| on | {c['on']['docs_per_s']:.0f} | {speedup:.2f}x | {hit:.2f} | {1 / (1 - hit):.2f}x "
        f"| {predicted:.2f}x "
        f"| {c['on']['cache_bytes'] / 2**20:.1f} / {c['on']['bound_bytes'] / 2**20:.0f} MiB "
        f"| {c['on']['pss_bytes'] / 2**20:.0f} MiB |",
        "",
        f"every text kept: {c['on']['repeats_docs_per_s']:.0f} docs/s (the request path alone)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20, help="each measured loop")
    parser.add_argument("--cache-mb", type=float, default=4, help="the cache's bound")
    parser.add_argument("--parts", default="priority,tenants,cache")
    parser.add_argument("--out", type=Path, help="the report as JSON")
    parser.add_argument("--report", type=Path, help="print a report saved with --out")
    args = parser.parse_args(argv)
    if args.report:
        print(markdown(json.loads(args.report.read_text())))
        return
    tokenizer = str(MODELS / MODEL / "1" / "tokenizer.json")
    parts = args.parts.split(",")
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        if "priority" in parts:
            report["priority"] = priority_part(root, tokenizer, args.seconds)
        if "tenants" in parts:
            report["tenants"] = tenants_part(root, tokenizer, args.seconds)
        if "cache" in parts:
            report["cache"] = cache_part(root, tokenizer, args.seconds, args.cache_mb)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    if set(parts) == {"priority", "tenants", "cache"}:
        print(markdown(report))
    else:
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

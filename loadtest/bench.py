"""`python -m loadtest.bench`: does bucketing pay? Everything measured in ONE run.

On one workload (lengths drawn from a long-tailed, natural-text-like distribution) and one
model (`minilm` when built, else `tiny-encoder`), it measures:

- the engine ceiling: ONNX Runtime in this process on ideal batches (sorted by length, full,
  padded to their own longest), no HTTP, no queueing: the physical limit here;
- the server (a real `bucketserve serve` process) in bucketing mode with the model's own
  config, with power-of-two edges, in mutable mode, with batching off, with one bucket, and
  in bucketing mode with one instance (one batch at a time, every core on it).

Every server is started first and they take turns: in each of several rounds, the ceiling and
then every server (in an order rotated per round) is measured at saturation (closed loop), so
drift in the machine's speed lands on all of them alike; figures are medians over the rounds,
with their spread. Then p50/p95/p99 latency at fixed offered loads (open loop: 25/50/75% of
bucketing's saturation, and 50% of batching-off's), taking turns the same way. Also padding
waste from the server's own metrics, peak Pss of each server process, and the ratio to the
ceiling. Writes bench.json, bench.md and bench.png to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
from prometheus_client.parser import text_string_to_metric_families

from loadtest.lengths import LengthDistribution
from loadtest.loadgen import Result, closed_loop, encode_post, open_loop
from loadtest.process import ROOT, running_server
from serve.bucketing import BucketPlan
from serve.loading import ModelSpec, load_model_spec
from serve.loading.planner import padding_waste, power_of_two_edges
from serve.loading.tensors import layout_of

CONCURRENCY = 16
TARGETS = {"ceiling_ratio": 0.85, "speedup_vs_off": 1.3, "padding_waste": 0.10}


def workload(spec: ModelSpec, count: int, seed: int = 0) -> list[np.ndarray]:
    """Token sequences with lengths like natural text: lognormal, median ~22, long tail."""
    rng = np.random.default_rng(seed)
    top = spec.config.batching.longest
    lengths = LengthDistribution.parse("natural", top).sample(rng, count)
    vocab = spec.config.inputs[spec.config.sequence_input].vocab_size or 1000
    return [rng.integers(min(1000, vocab // 2), vocab, n) for n in lengths]


def requested_outputs(spec: ModelSpec) -> list[str]:
    """What a client of this model typically asks for: its pooled outputs (a sentence
    embedding, not hundreds of floats per token) when it has any, else everything."""
    pooled = [name for name, out in spec.config.outputs.items() if not out.per_step]
    return pooled or list(spec.config.outputs)


def ceiling(spec: ModelSpec, sequences: list[np.ndarray], duration_s: float) -> dict[str, float]:
    """ONNX Runtime alone on ideal batches: sorted, full, each padded to its own longest."""
    batching = spec.config.batching
    plan = BucketPlan((batching.longest,), batching.max_batch_size, batching.max_batch_tokens)
    session = ort.InferenceSession(str(spec.onnx_path), providers=["CPUExecutionProvider"])
    layout = layout_of(spec)
    ordered = sorted(sequences, key=len)
    batches, start = [], 0
    while start < len(ordered):
        rows = plan.capacity(len(ordered[min(start + batching.max_batch_size, len(ordered)) - 1]))
        chunk = ordered[start : start + rows]
        batches.append(layout.collate(chunk, len(chunk), len(chunk[-1])))
        start += len(chunk)
    names = list(spec.config.outputs)
    session.run(names, batches[-1])  # warm
    done = tokens = 0
    began = time.perf_counter()
    while time.perf_counter() - began < duration_s:
        for feeds in batches:
            session.run(names, feeds)
        done += len(ordered)
        tokens += sum(len(s) for s in ordered)
    wall = time.perf_counter() - began
    return {"seq_per_s": done / wall, "tok_per_s": tokens / wall}


def pss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))


@dataclass
class Server:
    name: str
    flags: list[str]
    process: subprocess.Popen[bytes]
    port: int
    peak_pss: int = 0

    def tokens(self) -> tuple[float, float]:
        """(computed, padded) tokens so far, from the server's own metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            text = r.read().decode()
        totals = {"bucketserve_computed_tokens_total": 0.0, "bucketserve_padded_tokens_total": 0.0}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in totals:
                    totals[sample.name] += sample.value
        return totals["bucketserve_computed_tokens_total"], totals[
            "bucketserve_padded_tokens_total"
        ]


@contextlib.contextmanager
def servers(
    models: Path, model: str, configs: dict[str, list[str]], out: Path
) -> Iterator[list[Server]]:
    """One server process per configuration, all running; their Pss sampled every 250 ms."""
    with contextlib.ExitStack() as stack:
        started = []
        for name, flags in configs.items():
            log_path = out / f"server-{name.replace(' ', '-').replace(',', '')}.log"
            process, url = stack.enter_context(
                running_server(
                    models,
                    "--default-model",
                    model,
                    "--log-level",
                    "warning",
                    *flags,
                    log_path=log_path,
                )
            )
            started.append(Server(name, flags, process, int(url.rsplit(":", 1)[1])))
        stop = threading.Event()

        def sample_memory() -> None:
            while not stop.wait(0.25):
                for srv in started:
                    with contextlib.suppress(OSError, StopIteration):
                        srv.peak_pss = max(srv.peak_pss, pss_bytes(srv.process.pid))

        sampler = threading.Thread(target=sample_memory, daemon=True)
        sampler.start()
        try:
            yield started
        finally:
            stop.set()
            sampler.join()


def rotated(items: list[Any], by: int) -> list[Any]:
    """`items` starting at position `by`: each round, a different one goes first."""
    by %= len(items)
    return items[by:] + items[:by]


def spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": float(np.median(values)),
        "min": min(values),
        "max": max(values),
        "rounds": values,
    }


def saturation_rounds(
    servers: list[Server],
    ceiling_run: Callable[[], dict[str, float]],
    bodies: list[bytes],
    rounds: int,
    times: dict[str, float],
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The ceiling and every server at saturation, taking turns for `rounds` rounds."""
    for srv in servers:
        asyncio.run(closed_loop("127.0.0.1", srv.port, bodies, CONCURRENCY, times["warm"]))
    ceilings: list[dict[str, float]] = []
    results: dict[str, list[Result]] = {srv.name: [] for srv in servers}
    tokens = {srv.name: [0.0, 0.0] for srv in servers}
    for r in range(rounds):
        ceilings.append(ceiling_run())
        for srv in rotated(servers, r):
            before = srv.tokens()
            result = asyncio.run(
                closed_loop("127.0.0.1", srv.port, bodies, CONCURRENCY, times["saturation"])
            )
            after = srv.tokens()
            results[srv.name].append(result)
            tokens[srv.name][0] += after[0] - before[0]
            tokens[srv.name][1] += after[1] - before[1]
        print(
            f"  round {r + 1}/{rounds}: ceiling {ceilings[-1]['seq_per_s']:.1f}, "
            + ", ".join(f"{n} {v[-1].throughput:.1f}" for n, v in results.items())
            + " seq/s",
            file=sys.stderr,
        )
    ceiling_row = {
        "seq_per_s": float(np.median([c["seq_per_s"] for c in ceilings])),
        "tok_per_s": float(np.median([c["tok_per_s"] for c in ceilings])),
        "seq_per_s_spread": spread([c["seq_per_s"] for c in ceilings]),
    }
    rows = {}
    for srv in servers:
        runs = results[srv.name]
        computed, padded = tokens[srv.name]
        middle = sorted(runs, key=lambda x: x.throughput)[len(runs) // 2]
        rows[srv.name] = {
            "name": srv.name,
            "flags": srv.flags,
            "seq_per_s": float(np.median([x.throughput for x in runs])),
            "seq_per_s_spread": spread([x.throughput for x in runs]),
            "saturation_p50_ms": middle.percentile_ms(50),
            "saturation_p99_ms": middle.percentile_ms(99),
            "saturation_errors": dict(sum((x.errors for x in runs), Counter())),
            "client_cores_at_saturation": max(x.client_cores for x in runs),
            "padding_waste": padded / computed if computed else None,
        }
    return ceiling_row, rows


def latency_row(result: Result, rate: float, label: str) -> dict[str, Any]:
    return {
        "label": label,
        "offered_per_s": rate,
        "throughput": result.throughput,
        "p50_ms": result.percentile_ms(50),
        "p95_ms": result.percentile_ms(95),
        "p99_ms": result.percentile_ms(99),
        "errors": dict(result.errors),
        "client_cores": result.client_cores,
    }


def load_turns(
    servers: list[Server],
    bodies: list[bytes],
    labelled: list[tuple[float, str]],
    times: dict[str, float],
) -> dict[str, list[dict[str, Any]]]:
    """Latency at each offered load, every server taking its turn at each load."""
    loads: dict[str, list[dict[str, Any]]] = {srv.name: [] for srv in servers}
    for i, (rate, label) in enumerate(labelled):
        for srv in rotated(servers, i):
            result = asyncio.run(open_loop("127.0.0.1", srv.port, bodies, rate, times["load"]))
            loads[srv.name].append(latency_row(result, rate, label))
    return loads


def configs(spec: ModelSpec) -> dict[str, list[str]]:
    longest = spec.config.batching.longest
    pow2 = ",".join(map(str, power_of_two_edges(longest)))
    return {
        "bucketing": [],
        "bucketing, power-of-two edges": ["--buckets", pow2],
        "mutable": ["--strategy", "mutable"],
        "batching off": ["--max-batch-size", "1"],
        "one bucket": ["--buckets", str(longest)],
        "bucketing, one instance": ["--instances", "1"],
    }


def targets(report: dict[str, Any]) -> list[str]:
    """Each target, met or missed, and by how much."""
    rows = {r["name"]: r for r in report["servers"]}
    bucketing, off = rows["bucketing"], rows["batching off"]
    ratio = bucketing["seq_per_s"] / report["ceiling"]["seq_per_s"]
    speedup = bucketing["seq_per_s"] / off["seq_per_s"]
    waste = bucketing["padding_waste"] or 0.0
    half_off = next(load for load in bucketing["loads"] if load["label"] == "50% of batching off")
    half_off_off = next(load for load in off["loads"] if load["label"] == "50% of batching off")
    p99, p99_off = half_off["p99_ms"] or float("inf"), half_off_off["p99_ms"] or float("inf")

    def line(ok: bool, text: str) -> str:
        return f"{'met' if ok else 'MISSED'}: {text}"

    return [
        line(
            ratio >= TARGETS["ceiling_ratio"],
            f"bucketing reaches {ratio:.2f} of the engine ceiling "
            f"(target {TARGETS['ceiling_ratio']})",
        ),
        line(
            speedup >= TARGETS["speedup_vs_off"],
            f"bucketing is {speedup:.2f}x batching off (target {TARGETS['speedup_vs_off']}x)",
        ),
        line(
            waste <= TARGETS["padding_waste"],
            f"padding waste {100 * waste:.1f}% of computed tokens (target <= 10%)",
        ),
        line(
            p99 <= p99_off,
            f"p99 at half of batching-off's saturation: bucketing {p99:.1f} ms, batching off "
            f"{p99_off:.1f} ms",
        ),
    ]


def per_s(row: dict[str, Any]) -> str:
    """The median over the rounds and its spread."""
    spread = row["seq_per_s_spread"]
    return f"{spread['median']:.1f} ({spread['min']:.0f}-{spread['max']:.0f})"


def markdown(report: dict[str, Any]) -> str:
    ceiling = report["ceiling"]
    out = [
        f"Model `{report['model']}`, {report['requests']} distinct requests of one sequence "
        f"(outputs {', '.join(report['outputs'])}), "
        f"lengths median {report['length_median']}, p99 {report['length_p99']}; "
        f"{CONCURRENCY} closed-loop clients at saturation, {report['rounds']} rounds of "
        f"{report['seconds_per_turn']:.0f} s each with every server taking its turn: seq/s is "
        "the median over the rounds (lowest-highest).",
        "",
        "| configuration | seq/s | tokens/s | / ceiling | padding waste | peak Pss MiB | "
        + " | ".join(f"p50/p95/p99 ms @ {load['label']}" for load in report["servers"][0]["loads"])
        + " |",
        "|---" * (6 + len(report["servers"][0]["loads"])) + "|",
        f"| engine ceiling (in-process, ideal batches) | {per_s(ceiling)} | "
        f"{ceiling['tok_per_s']:.0f} | 1.00 | {100 * report['ceiling_waste']:.1f}% | | "
        + " | ".join("" for _ in report["servers"][0]["loads"])
        + " |",
    ]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    for row in report["servers"]:
        cells = []
        for load in row["loads"]:
            errors = sum(load["errors"].values())
            cell = f"{ms(load['p50_ms'])}/{ms(load['p95_ms'])}/{ms(load['p99_ms'])}"
            cells.append(cell + (f" ({errors} failed)" if errors else ""))
        waste = "-" if row["padding_waste"] is None else f"{100 * row['padding_waste']:.1f}%"
        out.append(
            f"| {row['name']} | {per_s(row)} | {row['tok_per_s']:.0f} | "
            f"{row['seq_per_s'] / ceiling['seq_per_s']:.2f} | {waste} | "
            f"{row['peak_pss_mib']:.0f} | " + " | ".join(cells) + " |"
        )
    out += [
        "",
        *[f"- {t}" for t in report["targets"]],
        f"- load generator CPU at saturation: {report['client_cores']:.2f} cores",
    ]
    return "\n".join(out) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for row in report["servers"]:
        points = sorted(
            (load["throughput"], load["p99_ms"])
            for load in row["loads"]
            if load["p99_ms"] is not None
        )
        points.append((row["seq_per_s"], row["saturation_p99_ms"]))
        ax.plot(*zip(*points, strict=True), marker="o", label=row["name"])
    ax.axvline(report["ceiling"]["seq_per_s"], color="grey", linestyle="--", label="engine ceiling")
    ax.set_xlabel("throughput (sequences/s)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_yscale("log")
    ax.set_title(f"bucketserve, {report['model']}: throughput vs p99 latency")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--models", type=Path, default=ROOT / "models")
    parser.add_argument("--model", help="default: minilm when built, else tiny-encoder")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="turns at saturation per server")
    parser.add_argument("--smoke", action="store_true", help="seconds, not minutes: for tests")
    args = parser.parse_args(argv)

    model = args.model or (
        "minilm" if (args.models / "minilm" / "1" / "model.onnx").is_file() else "tiny-encoder"
    )
    spec = load_model_spec(args.models / model)
    assert spec is not None
    times = (
        {"warm": 0.3, "saturation": 0.6, "load": 0.6, "ceiling": 0.3}
        if args.smoke
        else {"warm": 3.0, "saturation": 10.0, "load": 8.0, "ceiling": 5.0}
    )
    rounds = 2 if args.smoke else args.rounds
    sequences = workload(spec, 200 if args.smoke else args.requests, seed=1)
    lengths = [len(s) for s in sequences]
    real_tokens = float(np.mean(lengths))
    wanted = requested_outputs(spec)
    bodies = [
        encode_post("/predict", orjson.dumps({"sequences": [s.tolist()], "outputs": wanted}))
        for s in sequences
    ]
    ceiling_plan = BucketPlan(
        (spec.config.batching.longest,),
        spec.config.batching.max_batch_size,
        spec.config.batching.max_batch_tokens,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"model {model}: starting one server per configuration", file=sys.stderr)
    with servers(args.models, model, configs(spec), args.out) as running:
        print(f"{rounds} rounds at saturation, taking turns", file=sys.stderr)
        ceiling_row, saturated = saturation_rounds(
            running,
            lambda: ceiling(spec, sequences, times["ceiling"]),
            bodies,
            rounds,
            times,
        )
        top, off = saturated["bucketing"]["seq_per_s"], saturated["batching off"]["seq_per_s"]
        labelled = [
            (0.25 * top, "25% of bucketing"),
            (0.5 * top, "50% of bucketing"),
            (0.75 * top, "75% of bucketing"),
            (0.5 * off, "50% of batching off"),
        ]
        print("latency at the offered loads, taking turns", file=sys.stderr)
        loads = load_turns(running, bodies, labelled, times)
        rows = []
        for srv in running:
            row = saturated[srv.name]
            row["tok_per_s"] = row["seq_per_s"] * real_tokens
            row["peak_pss_mib"] = srv.peak_pss / 2**20
            row["loads"] = loads[srv.name]
            rows.append(row)
    report: dict[str, Any] = {
        "model": model,
        "requests": len(sequences),
        "outputs": wanted,
        "smoke": args.smoke,
        "length_median": int(np.median(lengths)),
        "length_p99": int(np.percentile(lengths, 99)),
        "machine": {"cores": os.cpu_count(), "onnxruntime": ort.__version__},
        "bucket_edges": spec.config.batching.edges,
        "rounds": rounds,
        "seconds_per_turn": times["saturation"],
        "ceiling": ceiling_row,
        "ceiling_waste": _sorted_waste(lengths, ceiling_plan),
        "expected_waste_model_edges": padding_waste(lengths, spec.config.batching.edges),
        "servers": rows,
        "client_cores": max(r["client_cores_at_saturation"] for r in rows),
    }
    report["targets"] = targets(report)
    (args.out / "bench.json").write_text(json.dumps(report, indent=2))
    (args.out / "bench.md").write_text(markdown(report))
    plot(report, args.out / "bench.png")
    print(markdown(report))
    return 0


def _sorted_waste(lengths: list[int], plan: BucketPlan) -> float:
    """Padding of the ceiling's ideal batches: sorted, each padded to its own longest."""
    ordered, computed, start = sorted(lengths), 0, 0
    while start < len(ordered):
        rows = plan.capacity(ordered[min(start + plan.max_batch_size, len(ordered)) - 1])
        chunk = ordered[start : start + rows]
        computed += len(chunk) * chunk[-1]
        start += len(chunk)
    return 1 - sum(lengths) / computed


if __name__ == "__main__":
    sys.exit(main())

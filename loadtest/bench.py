"""`python -m loadtest.bench`: does bucketing pay, on the traffic users send? ONE run.

On one workload and one model (`minilm` when built, else `tiny-encoder`), it measures:

- the engine ceiling: ONNX Runtime in this process on ideal batches (sorted by length, full,
  each padded to its own longest), no HTTP, no queueing, in every thread layout worth trying
  (ORT threads per run x runs at once x batch size); the best of them is the ceiling, the
  physical limit of this machine;
- the server (a real `bucketserve serve` process) in bucketing mode with the model's own
  config, with power-of-two edges, in mutable mode, with batching off, with one bucket, in
  bucketing mode with one instance (one batch at a time, every core on it), and without the
  second session that gives a batch running alone every core;
- a naive reference server (`loadtest.naive`: FastAPI, one ONNX Runtime run per request);
- KServe v2 over gRPC: a bucketing server with its gRPC port open, reached over gRPC (raw
  token-id tensors, one sequence a request) and over HTTP with the same token ids, so that
  what the protocol costs is a ratio between two rows of one process;
- OpenAI's /v1/embeddings (for a model with a tokenizer and an `[embedding]`): the bucketing
  server sent the same texts there, as the `openai` SDK sends them (base64), so that what the
  route costs over /predict is a ratio between two rows of one process.

The payload is what clients of the model send: text for a model with a tokenizer (each server
tokenises; lengths drawn from a long-tailed, natural-text-like distribution), token ids
otherwise (`--payload` overrides). Every server is started first and they take turns: in
each of several rounds, the ceiling and then every server (in an order rotated per round) is
measured at saturation (closed loop), so drift in the machine's speed lands on all of them
alike; figures are medians over the rounds, with their spread. Then p50/p95/p99 latency at
fixed offered loads (open loop), and the latency of lone requests (one client, one request at
a time), taking turns the same way. Also padding waste from the server's own metrics, peak
Pss of each server process, and the ratio to the ceiling. Writes bench.json, bench.md and
bench.png to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
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

from bucketserve.core.bucketing import BucketPlan
from bucketserve.loading import ModelSpec, load_model_spec
from bucketserve.loading.builder import load_tokenizer
from bucketserve.loading.layouts import layout_alone
from bucketserve.loading.planner import padding_waste, power_of_two_edges
from bucketserve.runtime.sessions import usable_cores
from loadtest.grpc_loadgen import grpc_infer, infer_request
from loadtest.lengths import LengthDistribution
from loadtest.loadgen import Connect, Result, closed_loop, encode_post, http, open_loop
from loadtest.payloads import natural_texts
from loadtest.process import ROOT, free_port, running_process, running_server
from loadtest.pss import pss

CONCURRENCY = 16
TARGETS = {"ceiling_ratio": 0.92, "speedup_vs_naive": 1.35, "padding_waste": 0.05}
NAIVE = "naive (one run per request)"
BESIDE_GRPC = "bucketing, gRPC port open"  # the server process of the two rows below
OVER_GRPC = "bucketing over gRPC (token ids)"
OVER_HTTP = "bucketing over HTTP (token ids, same process)"
OVER_OPENAI = "bucketing over /v1/embeddings (same texts, same process)"


@dataclass(frozen=True)
class Workload:
    payload: str  # "text" or "tokens": what the clients send
    sequences: list[np.ndarray]  # the token ids the model runs on (what the ceiling runs)
    bodies: list[bytes]  # one request of one item each, encoded ahead
    embeddings: list[bytes]  # the same texts to /v1/embeddings (none: tokens, or no embedding)


def workload(spec: ModelSpec, count: int, payload: str, seed: int = 0) -> Workload:
    """`count` requests with lengths like natural text: lognormal, median ~22, long tail."""
    rng = np.random.default_rng(seed)
    lengths = LengthDistribution.parse("natural", spec.config.batching.longest).sample(rng, count)
    wanted = requested_outputs(spec)
    if payload == "text":
        if spec.tokenizer_path is None or spec.config.tokenizer is None:
            raise SystemExit(f"model {spec.name} has no tokenizer: use --payload tokens")
        texts = natural_texts(str(spec.tokenizer_path), [int(n) for n in lengths], seed)
        tokenizer = load_tokenizer(spec.tokenizer_path, spec.config.tokenizer.max_length)
        sequences = [np.asarray(e.ids, np.int64) for e in tokenizer.encode_batch(texts)]
        bodies = [predict_body({"text": [text], "outputs": wanted}) for text in texts]
        embeddings = [] if spec.config.embedding is None else embeddings_bodies(spec, texts)
    else:
        vocab = spec.config.inputs[spec.config.sequence_input].vocab_size or 1000
        sequences = [rng.integers(min(1000, vocab // 2), vocab, n) for n in lengths]
        bodies = token_ids_over_http(sequences, wanted)
        embeddings = []
    return Workload(payload, sequences, bodies, embeddings)


def embeddings_bodies(spec: ModelSpec, texts: list[str]) -> list[bytes]:
    """/v1/embeddings requests of one text each, base64 as the `openai` SDK asks by default."""
    return [
        encode_post(
            "/v1/embeddings",
            orjson.dumps({"model": spec.name, "input": text, "encoding_format": "base64"}),
        )
        for text in texts
    ]


def predict_body(body: dict[str, Any]) -> bytes:
    return encode_post("/predict", orjson.dumps(body))


def token_ids_over_http(sequences: list[np.ndarray], outputs: list[str]) -> list[bytes]:
    """`/predict` requests of one sequence each, as token ids."""
    return [predict_body({"sequences": [s.tolist()], "outputs": outputs}) for s in sequences]


def token_ids_over_grpc(spec: ModelSpec, sequences: list[np.ndarray]) -> list[bytes]:
    """v2 `ModelInfer` requests of one sequence each: the sequence input alone, raw, one row
    (whose length is T, so no mask is needed), in the model's own axes and dtype."""
    tensor = layout_alone(spec).layout.sequence.tensor
    return [
        infer_request(
            spec.name,
            {tensor.name: tensor.to_model_axes(s[None].astype(tensor.dtype))},
            requested_outputs(spec),
        )
        for s in sequences
    ]


def requested_outputs(spec: ModelSpec) -> list[str]:
    """What a client of this model typically asks for: its pooled outputs (a sentence
    embedding, not hundreds of floats per token) when it has any, else everything."""
    pooled = [name for name, out in spec.config.outputs.items() if not out.per_step]
    return pooled or list(spec.config.outputs)


def thread_layouts(cores: int) -> list[tuple[int, int]]:
    """(ORT threads per run, runs at once) worth trying: every core busy, none asked for by
    more than two threads."""
    counts = sorted({1, 2, cores})
    return [(t, r) for r in counts for t in counts if cores <= t * r <= 2 * cores]


class Ceiling:
    """ONNX Runtime alone on ideal batches (sorted by length, full, each padded to its own
    longest) in every thread layout; the ceiling is the best of them."""

    def __init__(self, spec: ModelSpec, sequences: list[np.ndarray], cores: int) -> None:
        self.spec, self.cores = spec, cores
        self.outputs = list(spec.config.outputs)
        self.layout = layout_alone(spec).layout
        self.ordered = sorted(sequences, key=len)
        largest = spec.config.batching.max_batch_size
        sizes = sorted({min(4, largest), largest})
        self.batches = {rows: self._batches(rows) for rows in sizes}
        self.waste = {rows: _waste(batches) for rows, batches in self.batches.items()}
        self.layouts = [(t, r, rows) for t, r in thread_layouts(cores) for rows in sizes]
        self._sessions: dict[tuple[int, bool], ort.InferenceSession] = {}

    def _batches(self, rows: int) -> list[tuple[int, int, dict[str, np.ndarray]]]:
        """(sequences, real tokens, feeds) of each batch, in a shuffled order: a run cut short
        by its time is not biased toward short or long ones."""
        batching = self.spec.config.batching
        plan = BucketPlan((batching.longest,), rows, batching.max_batch_tokens)
        out, start = [], 0
        while start < len(self.ordered):
            end = min(start + rows, len(self.ordered))
            chunk = self.ordered[start : start + plan.capacity(len(self.ordered[end - 1]))]
            feeds = self.layout.collate(chunk, len(chunk), len(chunk[-1]))
            out.append((len(chunk), sum(len(s) for s in chunk), feeds))
            start += len(chunk)
        np.random.default_rng(0).shuffle(out)
        return out

    def _session(self, threads: int, spinning: bool) -> ort.InferenceSession:
        if (threads, spinning) not in self._sessions:
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            if not spinning:
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self._sessions[threads, spinning] = ort.InferenceSession(
                str(self.spec.onnx_path), options, providers=["CPUExecutionProvider"]
            )
        return self._sessions[threads, spinning]

    def run(self, threads: int, runs: int, rows: int, duration_s: float) -> tuple[float, float]:
        """(sequences/s, tokens/s) with `runs` batches of up to `rows` at once on `threads`
        ORT threads each. Threads spin while waiting only when no core is asked for twice."""
        session = self._session(threads, spinning=threads * runs <= self.cores)
        batches = self.batches[rows]
        session.run(self.outputs, batches[-1][2])  # warm
        turns = itertools.cycle(batches)
        lock = threading.Lock()
        done = [0, 0]
        stop_at = time.perf_counter() + duration_s

        def worker() -> None:
            while time.perf_counter() < stop_at:
                with lock:
                    count, tokens, feeds = next(turns)
                session.run(self.outputs, feeds)
                with lock:
                    done[0] += count
                    done[1] += tokens

        began = time.perf_counter()
        workers = [threading.Thread(target=worker) for _ in range(runs)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        wall = time.perf_counter() - began
        return done[0] / wall, done[1] / wall

    def measure(self, duration_s: float) -> dict[str, Any]:
        """Every layout for `duration_s`; the best is the ceiling."""
        layouts = {}
        for threads, runs, rows in self.layouts:
            per_s, tok_per_s = self.run(threads, runs, rows, duration_s)
            layouts[layout_name(threads, runs, rows)] = {"seq_per_s": per_s, "tok_per_s": tok_per_s}
        best = max(self.layouts, key=lambda t_r_rows: layouts[layout_name(*t_r_rows)]["seq_per_s"])
        name = layout_name(*best)
        return {**layouts[name], "layout": name, "layouts": layouts, "waste": self.waste[best[2]]}


def layout_name(threads: int, runs: int, rows: int) -> str:
    return f"{runs} run(s) x {threads} thread(s), batches of {rows}"


def _waste(batches: list[tuple[int, int, dict[str, np.ndarray]]]) -> float:
    """Padding of batches: each padded to its own longest."""
    real = sum(tokens for _, tokens, _ in batches)
    # (the first two axes of the sequence input are rows and steps, in either order)
    computed = sum(math.prod(next(iter(feeds.values())).shape[:2]) for _, _, feeds in batches)
    return 1 - real / computed


@dataclass
class Server:
    """A server process the benchmark started."""

    name: str
    flags: list[str]
    process: subprocess.Popen[bytes]
    port: int
    peak_pss: int = 0
    metrics: bool = True  # bucketserve reports its padding; the naive server has no metrics

    def tokens(self) -> tuple[float, float]:
        """(computed, padded) tokens so far, from the server's own metrics."""
        if not self.metrics:
            return 0.0, 0.0
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
    """One server process per configuration and the naive reference server, all running; their
    Pss sampled every 250 ms."""
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
        naive = [sys.executable, "-m", "loadtest.naive", str(models / model)]
        process, url = stack.enter_context(
            running_process(naive, log_path=out / "server-naive.log")
        )
        port = int(url.rsplit(":", 1)[1])
        started.append(Server(NAIVE, ["loadtest.naive", model], process, port, metrics=False))
        stop = threading.Event()

        def sample_memory() -> None:
            while not stop.wait(0.25):
                for srv in started:
                    with contextlib.suppress(OSError, StopIteration):
                        srv.peak_pss = max(srv.peak_pss, pss(srv.process.pid))

        sampler = threading.Thread(target=sample_memory, daemon=True)
        sampler.start()
        try:
            yield started
        finally:
            stop.set()
            sampler.join()


@dataclass(frozen=True)
class Row:
    """One row of the table: a server, how its clients reach it and what they send."""

    name: str
    server: Server
    connect: Connect
    requests: list[bytes]


def rows_of(running: list[Server], spec: ModelSpec, work: Workload, grpc_port: int) -> list[Row]:
    """Every server over HTTP with the workload's requests, but the one with its gRPC port
    open: that one over gRPC and over HTTP, both with the workload's token ids (v2 carries no
    text), so the two rows differ by the protocol alone."""
    rows = []
    for srv in running:
        if srv.name == "bucketing" and work.embeddings:
            rows.append(Row(OVER_OPENAI, srv, http("127.0.0.1", srv.port), work.embeddings))
        if srv.name != BESIDE_GRPC:
            rows.append(Row(srv.name, srv, http("127.0.0.1", srv.port), work.bodies))
            continue
        over_grpc = token_ids_over_grpc(spec, work.sequences)
        over_http = token_ids_over_http(work.sequences, requested_outputs(spec))
        rows.append(Row(OVER_GRPC, srv, grpc_infer(f"127.0.0.1:{grpc_port}"), over_grpc))
        rows.append(Row(OVER_HTTP, srv, http("127.0.0.1", srv.port), over_http))
    return rows


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
    rows: list[Row],
    ceiling_run: Callable[[], dict[str, Any]],
    rounds: int,
    times: dict[str, float],
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The ceiling and every row at saturation, taking turns for `rounds` rounds."""
    for row in rows:
        asyncio.run(closed_loop(row.connect, row.requests, CONCURRENCY, times["warm"]))
    ceilings: list[dict[str, Any]] = []
    results: dict[str, list[Result]] = {row.name: [] for row in rows}
    tokens = {row.name: [0.0, 0.0] for row in rows}
    for r in range(rounds):
        ceilings.append(ceiling_run())
        for row in rotated(rows, r):
            before = row.server.tokens()
            result = asyncio.run(
                closed_loop(row.connect, row.requests, CONCURRENCY, times["saturation"])
            )
            after = row.server.tokens()
            results[row.name].append(result)
            tokens[row.name][0] += after[0] - before[0]
            tokens[row.name][1] += after[1] - before[1]
        print(
            f"  round {r + 1}/{rounds}: ceiling {ceilings[-1]['seq_per_s']:.1f} "
            f"({ceilings[-1]['layout']}), "
            + ", ".join(f"{n} {v[-1].throughput:.1f}" for n, v in results.items())
            + " seq/s",
            file=sys.stderr,
        )
    ceiling_row = {
        "seq_per_s": float(np.median([c["seq_per_s"] for c in ceilings])),
        "tok_per_s": float(np.median([c["tok_per_s"] for c in ceilings])),
        "seq_per_s_spread": spread([c["seq_per_s"] for c in ceilings]),
        "waste": float(np.median([c["waste"] for c in ceilings])),
        "best_layout_per_round": [c["layout"] for c in ceilings],
        "layouts": {
            name: float(np.median([c["layouts"][name]["seq_per_s"] for c in ceilings]))
            for name in ceilings[0]["layouts"]
        },
    }
    measured = {}
    for row in rows:
        runs = results[row.name]
        computed, padded = tokens[row.name]
        middle = sorted(runs, key=lambda x: x.throughput)[len(runs) // 2]
        measured[row.name] = {
            "name": row.name,
            "flags": row.server.flags,
            "seq_per_s": float(np.median([x.throughput for x in runs])),
            "seq_per_s_spread": spread([x.throughput for x in runs]),
            "saturation_p50_ms": middle.percentile_ms(50),
            "saturation_p99_ms": middle.percentile_ms(99),
            "saturation_errors": dict(sum((x.errors for x in runs), Counter())),
            "client_cores_at_saturation": max(x.client_cores for x in runs),
            "padding_waste": padded / computed if computed else None,
        }
    return ceiling_row, measured


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
    rows: list[Row], labelled: list[tuple[float, str]], times: dict[str, float]
) -> dict[str, list[dict[str, Any]]]:
    """Latency at each offered load, every row taking its turn at each load."""
    loads: dict[str, list[dict[str, Any]]] = {row.name: [] for row in rows}
    for i, (rate, label) in enumerate(labelled):
        for row in rotated(rows, i):
            result = asyncio.run(open_loop(row.connect, row.requests, rate, times["load"]))
            loads[row.name].append(latency_row(result, rate, label))
    return loads


def lone_turns(rows: list[Row], rounds: int, seconds: float) -> dict[str, dict[str, Any]]:
    """Lone requests: one client sending one request at a time, every row taking turns."""
    lone: dict[str, list[Result]] = {row.name: [] for row in rows}
    for r in range(rounds):
        for row in rotated(rows, r):
            lone[row.name].append(asyncio.run(closed_loop(row.connect, row.requests, 1, seconds)))
    merged = {}
    for name, results in lone.items():
        together = Result(latencies=[x for r in results for x in r.latencies])
        merged[name] = {
            "requests": len(together.latencies),
            "p50_ms": together.percentile_ms(50),
            "p99_ms": together.percentile_ms(99),
        }
    return merged


def configs(spec: ModelSpec) -> dict[str, list[str]]:
    longest = spec.config.batching.longest
    pow2 = ",".join(map(str, power_of_two_edges(longest)))
    return {
        "bucketing": [],
        "bucketing, power-of-two edges": ["--buckets", pow2],
        "mutable": ["--binding", "mutable"],
        "batching off": ["--max-batch-size", "1"],
        "one bucket": ["--buckets", str(longest)],
        "bucketing, one instance": ["--instances", "1"],
        "bucketing, no lone-batch threads": ["--lone-batch-threads", "1"],
    }


def targets(report: dict[str, Any]) -> list[str]:
    """Each target, met or missed, and by how much."""
    rows = {r["name"]: r for r in report["servers"]}
    bucketing, naive, one = rows["bucketing"], rows[NAIVE], rows["bucketing, one instance"]
    ratio = bucketing["seq_per_s"] / report["ceiling"]["seq_per_s"]
    speedup = bucketing["seq_per_s"] / naive["seq_per_s"]
    waste = bucketing["padding_waste"] or 0.0

    def p99_at_half(row: dict[str, Any]) -> float:
        load = next(load for load in row["loads"] if load["label"] == "50% of bucketing")
        return float(load["p99_ms"] or "inf")

    def line(ok: bool, text: str) -> str:
        return f"{'met' if ok else 'MISSED'}: {text}"

    lone, lone_one = bucketing["lone"]["p50_ms"], one["lone"]["p50_ms"]
    return [
        line(
            ratio >= TARGETS["ceiling_ratio"],
            f"bucketing reaches {ratio:.2f} of the engine ceiling "
            f"(target {TARGETS['ceiling_ratio']})",
        ),
        line(
            speedup >= TARGETS["speedup_vs_naive"],
            f"bucketing is {speedup:.2f}x the naive server (target {TARGETS['speedup_vs_naive']}x)",
        ),
        line(
            p99_at_half(bucketing) < p99_at_half(naive),
            f"p99 at 50% of bucketing's saturation: bucketing {p99_at_half(bucketing):.1f} ms, "
            f"naive {p99_at_half(naive):.1f} ms",
        ),
        line(
            waste <= TARGETS["padding_waste"],
            f"padding waste {100 * waste:.1f}% of computed tokens "
            f"(target <= {100 * TARGETS['padding_waste']:.0f}%)",
        ),
        line(
            lone <= lone_one,
            f"p50 of a lone request: bucketing {lone:.1f} ms, one instance {lone_one:.1f} ms",
        ),
    ]


def grpc_against_http(report: dict[str, Any]) -> dict[str, Any]:
    """What the protocol costs: the gRPC row against the HTTP row of the same process."""
    rows = {r["name"]: r for r in report["servers"]}
    over_grpc, over_http = rows[OVER_GRPC], rows[OVER_HTTP]

    def p99_at_half(row: dict[str, Any]) -> float | None:
        p99: float | None = next(
            x["p99_ms"] for x in row["loads"] if x["label"] == "50% of bucketing"
        )
        return p99

    return {
        "seq_per_s_ratio": over_grpc["seq_per_s"] / over_http["seq_per_s"],
        "seq_per_s": [over_grpc["seq_per_s"], over_http["seq_per_s"]],
        "lone_p50_ms": [over_grpc["lone"]["p50_ms"], over_http["lone"]["p50_ms"]],
        "p99_at_half_ms": [p99_at_half(over_grpc), p99_at_half(over_http)],
        # (both clients run on the server's machine: a costlier client leaves it less CPU)
        "client_cores": [
            over_grpc["client_cores_at_saturation"],
            over_http["client_cores_at_saturation"],
        ],
    }


def openai_against_predict(report: dict[str, Any]) -> dict[str, Any] | None:
    """What OpenAI's route costs: its row against /predict's, the same texts, one process."""
    rows = {r["name"]: r for r in report["servers"]}
    if OVER_OPENAI not in rows:
        return None
    openai, predict = rows[OVER_OPENAI], rows["bucketing"]
    return {
        "seq_per_s_ratio": openai["seq_per_s"] / predict["seq_per_s"],
        "seq_per_s": [openai["seq_per_s"], predict["seq_per_s"]],
        "lone_p50_ms": [openai["lone"]["p50_ms"], predict["lone"]["p50_ms"]],
        "lone_p50_ratio": openai["lone"]["p50_ms"] / predict["lone"]["p50_ms"],
    }


def per_s(row: dict[str, Any]) -> str:
    """The median over the rounds and its spread."""
    spread = row["seq_per_s_spread"]
    return f"{spread['median']:.1f} ({spread['min']:.0f}-{spread['max']:.0f})"


def markdown(report: dict[str, Any]) -> str:
    ceiling, protocols = report["ceiling"], report["grpc_against_http"]
    loads = report["servers"][0]["loads"]
    out = [
        f"Model `{report['model']}`, {report['requests']} distinct requests of one "
        f"{'text' if report['payload'] == 'text' else 'token sequence'} each "
        f"(outputs {', '.join(report['outputs'])}), "
        f"lengths in tokens median {report['length_median']}, p99 {report['length_p99']}; "
        f"{CONCURRENCY} closed-loop clients at saturation, {report['rounds']} rounds of "
        f"{report['seconds_per_turn']:.0f} s each with every server taking its turn: seq/s is "
        "the median over the rounds (lowest-highest).",
        "",
        "| configuration | seq/s | tokens/s | / ceiling | padding waste | peak Pss MiB | "
        + " | ".join(f"p50/p95/p99 ms @ {load['label']}" for load in loads)
        + " | lone request p50/p99 ms |",
        "|---" * (7 + len(loads)) + "|",
        f"| engine ceiling (in-process, best layout) | {per_s(ceiling)} | "
        f"{ceiling['tok_per_s']:.0f} | 1.00 | {100 * ceiling['waste']:.1f}% | | "
        + " | ".join("" for _ in loads)
        + " | |",
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
        lone = f"{row['lone']['p50_ms']:.1f}/{row['lone']['p99_ms']:.1f}"
        out.append(
            f"| {row['name']} | {per_s(row)} | {row['tok_per_s']:.0f} | "
            f"{row['seq_per_s'] / ceiling['seq_per_s']:.2f} | {waste} | "
            f"{row['peak_pss_mib']:.0f} | " + " | ".join(cells) + f" | {lone} |"
        )
    out += [
        "",
        "Engine ceiling by layout (median over the rounds, seq/s): "
        + "; ".join(f"{name}: {v:.1f}" for name, v in ceiling["layouts"].items())
        + f". Best in each round: {', '.join(ceiling['best_layout_per_round'])}.",
        "",
        *[f"- {t}" for t in report["targets"]],
        f"- load generator CPU at saturation: {report['client_cores']:.2f} cores",
        "- gRPC against HTTP, one process, the same token ids (gRPC, HTTP): "
        f"{protocols['seq_per_s_ratio']:.2f}x the throughput at saturation "
        f"({protocols['seq_per_s'][0]:.1f}, {protocols['seq_per_s'][1]:.1f} seq/s); "
        f"lone request p50 {protocols['lone_p50_ms'][0]:.1f}, {protocols['lone_p50_ms'][1]:.1f}"
        " ms; p99 at 50% of bucketing's saturation "
        f"{ms(protocols['p99_at_half_ms'][0])}, {ms(protocols['p99_at_half_ms'][1])} ms; "
        f"the load generator's own CPU at saturation {protocols['client_cores'][0]:.2f}, "
        f"{protocols['client_cores'][1]:.2f} cores",
    ]
    route = report.get("openai_against_predict")
    if route is not None:
        out.append(
            "- /v1/embeddings against /predict, one process, the same texts (/v1, /predict): "
            f"{route['seq_per_s_ratio']:.2f}x the throughput at saturation "
            f"({route['seq_per_s'][0]:.1f}, {route['seq_per_s'][1]:.1f} seq/s); lone request "
            f"p50 {route['lone_p50_ms'][0]:.2f}, {route['lone_p50_ms'][1]:.2f} ms "
            f"({route['lone_p50_ratio']:.2f}x)"
        )
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
    parser.add_argument(
        "--payload",
        choices=["text", "tokens"],
        help="what clients send (default: text for a model with a tokenizer, else tokens)",
    )
    parser.add_argument("--smoke", action="store_true", help="seconds, not minutes: for tests")
    args = parser.parse_args(argv)

    model = args.model or (
        "minilm" if (args.models / "minilm" / "1" / "model.onnx").is_file() else "tiny-encoder"
    )
    spec = load_model_spec(args.models / model)
    assert spec is not None
    payload = args.payload or ("text" if spec.tokenizer_path is not None else "tokens")
    times = (
        {"warm": 0.3, "saturation": 0.6, "load": 0.6, "ceiling": 0.2, "lone": 0.3}
        if args.smoke
        else {"warm": 3.0, "saturation": 10.0, "load": 8.0, "ceiling": 3.0, "lone": 3.0}
    )
    rounds = 2 if args.smoke else args.rounds
    work = workload(spec, 200 if args.smoke else args.requests, payload, seed=1)
    lengths = [len(s) for s in work.sequences]
    real_tokens = float(np.mean(lengths))
    engine = Ceiling(spec, work.sequences, usable_cores())
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"model {model}, {payload}: starting one server per configuration", file=sys.stderr)
    grpc_port = free_port()
    started = {**configs(spec), BESIDE_GRPC: ["--grpc-port", str(grpc_port)]}
    with servers(args.models, model, started, args.out) as running:
        table = rows_of(running, spec, work, grpc_port)
        print(f"{rounds} rounds at saturation, taking turns", file=sys.stderr)
        ceiling_row, saturated = saturation_rounds(
            table, lambda: engine.measure(times["ceiling"]), rounds, times
        )
        top, naive = saturated["bucketing"]["seq_per_s"], saturated[NAIVE]["seq_per_s"]
        labelled = [
            (0.25 * top, "25% of bucketing"),
            (0.5 * top, "50% of bucketing"),
            (0.75 * top, "75% of bucketing"),
            (0.5 * naive, "50% of naive"),
        ]
        print("latency at the offered loads, taking turns", file=sys.stderr)
        loads = load_turns(table, labelled, times)
        print("lone requests, taking turns", file=sys.stderr)
        lone = lone_turns(table, rounds, times["lone"])
        rows = []
        for entry in table:
            row = saturated[entry.name]
            row["tok_per_s"] = row["seq_per_s"] * real_tokens
            row["peak_pss_mib"] = entry.server.peak_pss / 2**20
            row["loads"] = loads[entry.name]
            row["lone"] = lone[entry.name]
            rows.append(row)
    report: dict[str, Any] = {
        "model": model,
        "payload": payload,
        "requests": len(work.sequences),
        "outputs": requested_outputs(spec),
        "smoke": args.smoke,
        "length_median": int(np.median(lengths)),
        "length_p99": int(np.percentile(lengths, 99)),
        "machine": {"cores": usable_cores(), "onnxruntime": ort.__version__},
        "bucket_edges": spec.config.batching.edges,
        "rounds": rounds,
        "seconds_per_turn": times["saturation"],
        "ceiling": ceiling_row,
        "expected_waste_model_edges": padding_waste(lengths, spec.config.batching.edges),
        "servers": rows,
        "client_cores": max(r["client_cores_at_saturation"] for r in rows),
    }
    report["targets"] = targets(report)
    report["grpc_against_http"] = grpc_against_http(report)
    report["openai_against_predict"] = openai_against_predict(report)
    (args.out / "bench.json").write_text(json.dumps(report, indent=2))
    (args.out / "bench.md").write_text(markdown(report))
    plot(report, args.out / "bench.png")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What running on Ray costs bucketserve, in one run on minilm's sentences:

- serving: `--clients` closed-loop clients, one sentence a request, against `bucketserve serve`
  on one thread, then against one replica of one CPU behind Ray's HTTP proxy, then the same
  with Ray's direct ingress (`RAY_SERVE_THROUGHPUT_OPTIMIZED=1`: the replica takes HTTP
  itself, on a port of its own, which the clients are sent to): the server's mean batch (its
  own histogram) and the requests answered a second;
- a corpus: `--texts` sentences embedded by `bucketserve batch run` on one machine (every
  core) and by Ray Data over two nodes of one CPU each (`bucketserve.ray.Embed`, two actors):
  texts a second, each from its start to its last answer (the cluster's own start left out).

Each Ray part runs on a loopback cluster of its own (`ray.cluster_utils.Cluster`: a head
without CPUs, workers of one CPU), so on one machine the cluster shares its cores with the
clients and the proxy: the ratios say what Ray's layers cost, not what more machines give.

    python -m loadtest.ray_bench --clients 32 --requests 12 --texts 4000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bucketserve.loading import load_model_spec
from loadtest.lengths import LengthDistribution
from loadtest.payloads import natural_texts
from loadtest.process import ROOT, free_port, running_server
from loadtest.scheduling_bench import metric, scrape

MODEL = "minilm"


def direct_ingress(port: int) -> dict[str, str]:
    """Ray's throughput-optimised mode, whose replicas take HTTP themselves (from `port`)."""
    return {
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 100),
    }


def sentences(count: int, seed: int = 3) -> list[str]:
    """`count` texts of the benchmark's natural sentence lengths (median ~22 tokens)."""
    spec = load_model_spec(ROOT / "models" / MODEL)
    if spec is None or spec.tokenizer_path is None:
        raise SystemExit(f"{MODEL} is not built: bucketserve models build {MODEL}")
    drawn = LengthDistribution.parse("natural", spec.config.batching.longest)
    lengths = drawn.sample(np.random.default_rng(seed), count)
    texts = natural_texts(str(spec.tokenizer_path), [int(n) for n in lengths], seed=seed)
    return [" ".join(text.split()) for text in texts]  # (one line each)


def batch_sizes(url: str, model: str) -> tuple[float, float]:
    """The sum and the count of the model's batch sizes, from a server's /metrics."""
    text = scrape(url)
    return (
        metric(text, "bucketserve_batch_size_sum", model=model),
        metric(text, "bucketserve_batch_size_count", model=model),
    )


def mean_batch(
    url: str, texts: Sequence[str], clients: int, requests: int, model: str = MODEL
) -> tuple[float, float]:
    """`clients` each sending `requests` texts to `/v1/embeddings`, one at a time: the
    server's mean batch over them, and the requests answered a second."""
    before = batch_sizes(url, model)

    def client(n: int) -> None:
        with httpx.Client(timeout=300) as session:
            for i in range(requests):
                body = {"model": model, "input": texts[(n * requests + i) % len(texts)]}
                session.post(url + "/v1/embeddings", json=body).raise_for_status()

    began = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    rate = clients * requests / (time.monotonic() - began)
    after = batch_sizes(url, model)
    return (after[0] - before[0]) / (after[1] - before[1]), rate


@dataclass
class Loopback:
    """A Ray cluster on this machine (`ray.cluster_utils.Cluster`) and Serve's HTTP address."""

    cluster: Any
    url: str
    workers: list[Any]  # (its worker nodes: `cluster.remove_node` kills one)


@contextlib.contextmanager
def cluster(workers: int, env: dict[str, str] | None = None) -> Iterator[Loopback]:
    """A loopback Ray cluster (a head without CPUs, `workers` nodes of one CPU), this process
    its driver, with Serve started (its one HTTP proxy on the head), its processes under
    `env`."""
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})  # (the cluster's processes inherit it)
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        nodes = [made.add_node(num_cpus=1) for _ in range(workers)]
        made.wait_for_nodes()
        ray.init(address=made.address, log_to_driver=False)
        port = free_port()
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        yield Loopback(made, f"http://127.0.0.1:{port}", nodes)
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
        made.shutdown()  # type: ignore[no-untyped-call]
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def serving(models: Path, texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """The mean batch and requests a second: alone, through Ray's proxy, with direct
    ingress (each after a warm-up of two requests a client)."""
    from ray import serve

    from bucketserve.ray import app

    found: dict[str, Any] = {}
    flags = ("--intra-op-threads", "1", "--result-cache-mb", "0")
    with running_server(models, *flags, log_path=models.parent / "server.log") as (_, url):
        mean_batch(url, texts, args.clients, 2)
        found["alone"] = mean_batch(url, texts, args.clients, args.requests)
    replica_port = free_port()
    for name, env in (("proxy", {}), ("direct_ingress", direct_ingress(replica_port))):
        with cluster(1, env) as ray_cluster:
            serve.run(
                app({"models": str(models), "result_cache_mb": "0"}), name="b", route_prefix="/"
            )
            url = f"http://127.0.0.1:{replica_port}" if env else ray_cluster.url
            mean_batch(url, texts, args.clients, 2)
            found[name] = mean_batch(url, texts, args.clients, args.requests)
    alone_batch, alone_rate = found["alone"]
    return {
        name: {
            "mean_batch": batch,
            "requests_per_s": rate,
            "batch_over_alone": batch / alone_batch,
            "rate_over_alone": rate / alone_rate,
        }
        for name, (batch, rate) in found.items()
    }


def corpus(models: Path, texts: list[str]) -> dict[str, Any]:
    """Texts a second: `bucketserve batch run` on this machine, Ray Data on two nodes."""
    import ray

    from bucketserve.ray import Embed

    source, out = models.parent / "texts.txt", models.parent / "out.jsonl"
    source.write_text("\n".join(texts) + "\n")
    command = [sys.executable, "-m", "bucketserve", "batch", "run", str(source), "--out", str(out)]
    flags = ["--models", str(models), "--model", MODEL, "--result-cache-mb", "0"]
    began = time.monotonic()
    subprocess.run([*command, *flags], check=True, capture_output=True)
    job_s = time.monotonic() - began
    answered = sum(1 for _ in out.open())
    with cluster(2):
        began = time.monotonic()
        rows = (
            ray.data.from_items([{"text": text} for text in texts])
            .map_batches(
                Embed,
                fn_constructor_kwargs={"models": str(models), "model": MODEL},
                concurrency=2,
                num_cpus=1,
                batch_size=512,
            )
            .materialize()
        )
        embedded = rows.count()
        data_s = time.monotonic() - began
        del rows  # (its blocks released while the cluster still runs, not at the exit)
    assert answered == embedded == len(texts), (answered, embedded, len(texts))
    job, data = len(texts) / job_s, len(texts) / data_s
    return {
        "batch_run_per_s": job,
        "ray_data_per_s": data,
        "ray_data_over_batch_run": data / job,
    }


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    models = root / "models"
    shutil.copytree(ROOT / "models" / MODEL, models / MODEL)
    texts = sentences(max(args.texts, args.clients * (args.requests + 2)))
    return {
        "model": MODEL,
        "cores": os.cpu_count(),
        "clients": args.clients,
        "texts": args.texts,
        "serving": serving(models, texts, args),
        "corpus": corpus(models, texts[: args.texts]),
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| served by | mean batch | against alone | requests/s | against alone |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, row in report["serving"].items():
        lines.append(
            f"| {name.replace('_', ' ')} | {row['mean_batch']:.1f} | "
            f"{row['batch_over_alone']:.2f} | {row['requests_per_s']:.0f} | "
            f"{row['rate_over_alone']:.2f} |"
        )
    c = report["corpus"]
    lines.append(
        f"\ncorpus of {report['texts']} sentences: batch run {c['batch_run_per_s']:.0f}/s, "
        f"Ray Data on two nodes {c['ray_data_per_s']:.0f}/s ({c['ray_data_over_batch_run']:.2f})"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32, help="closed-loop clients")
    parser.add_argument("--requests", type=int, default=12, help="requests each client sends")
    parser.add_argument("--texts", type=int, default=4000, help="the corpus's sentences")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        report = measure(args, Path(root))
    print(markdown(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

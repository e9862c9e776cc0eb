"""What the pad-safe rewrite buys: an unmasked BiGRU tagger (no `sequence_lens`) served three
ways from one server, each measured in turn under the same closed loop of clients sending one
sequence per request, natural lengths:

- `bigru`: as loaded (the check finds padding moves it, the server's copy gives its GRU each
  row's length, the copy passes: length buckets);
- `bigru-exact`: `policy = "exact-length"`, what it was served as before the rewrite;
- `bigru-single`: `policy = "single"`, one sequence per run.

    python -m loadtest.pad_safe_bench --clients 16 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
import orjson

from loadtest.lengths import LengthDistribution
from loadtest.loadgen import closed_loop, encode_post, http
from loadtest.process import running_server
from modelgen.families import unmasked_bigru
from modelgen.save import save_model

VOCAB = 500
CONFIG = """
[inputs.ids]
role = "tokens"
vocab_size = 500

[outputs.tags]

[batching]
buckets = [8, 16, 32, 64, 128, 256]
max_batch_size = 16
max_batch_tokens = 4096
max_queue_delay_ms = 0
policy = "{policy}"
"""
SERVED = {"bigru": "auto", "bigru-exact": "exact-length", "bigru-single": "single"}


def repository(root: Path) -> Path:
    for name, policy in SERVED.items():
        save_model(unmasked_bigru(), root / name / "1" / "model.onnx")  # (saving moves weights)
        (root / name / "config.toml").write_text(CONFIG.format(policy=policy))
    return root


def requests(model: str, count: int) -> list[bytes]:
    lengths = LengthDistribution.parse("natural", 256).sample(np.random.default_rng(0), count)
    bodies = []
    for i, n in enumerate(lengths):
        ids = [1 + (i * 31 + j * 7) % (VOCAB - 1) for j in range(int(n))]
        body = orjson.dumps({"model": model, "sequences": [ids]})
        bodies.append(encode_post("/predict", body))
    return bodies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = repository(Path(folder) / "models")
        log = Path(folder) / "server.log"
        with running_server(root, "--cache-dir", str(Path(folder) / "cache"), log_path=log) as (
            _,
            url,
        ):
            host, port = url.removeprefix("http://").split(":")
            print("| model | policy served | sequences/s | p50 ms | p99 ms |")
            print("| --- | --- | --- | --- | --- |")
            for model in SERVED:
                with urllib.request.urlopen(f"{url}/v2/models/{model}/config") as answer:
                    served = orjson.loads(answer.read())["batching"]["policy"]
                bodies = requests(model, 4000)
                connect = http(host, int(port))
                asyncio.run(closed_loop(connect, bodies, args.clients, 2))  # warm every key
                result = asyncio.run(closed_loop(connect, bodies, args.clients, args.seconds))
                latencies = sorted(result.latencies)
                p99 = latencies[int(0.99 * (len(latencies) - 1))] * 1000
                print(
                    f"| {model} | {served} | {len(latencies) / result.wall_s:.0f} | "
                    f"{statistics.median(latencies) * 1000:.1f} | {p99:.1f} |"
                    + (f" errors {dict(result.errors)}" if result.errors else "")
                )


if __name__ == "__main__":
    main()

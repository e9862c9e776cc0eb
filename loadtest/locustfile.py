"""Locust users for bucketserve: each posts one variable-length sequence per request to /predict.

    locust -f loadtest/locustfile.py --host http://127.0.0.1:8000 --lengths natural
    locust -f loadtest/locustfile.py,loadtest/step_shape.py ...   # with the step-load shape
    python -m loadtest.locust_run ...   # headless: starts a server, runs, plots a report

Lengths come from a named distribution (`--lengths`, see loadtest/lengths.py). Requests are
named by the bucket their length falls in (`/predict [<=32]`), so locust's tables and CSVs
show each bucket's latency apart. Each user reads the model's bucket edges and inputs from
the server (`/v2/models/{name}/config`) when it starts, so the same file drives any model:
token ids for token models, random feature frames for feature models, and with
`--payload text` words for models with a tokenizer (named by word count, which approximates
their token count).
"""

from __future__ import annotations

import bisect
import sys
from pathlib import Path
from typing import Any

import numpy as np
from locust import FastHttpUser, events, task
from locust.argument_parser import LocustArgumentParser

# locust puts only this file's folder on the import path; the project root holds `loadtest`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtest.lengths import SPECS, LengthDistribution
from loadtest.payloads import WORDS


@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _options(parser: LocustArgumentParser) -> None:
    group = parser.add_argument_group("bucketserve")
    group.add_argument(
        "--model", default="", env_var="BUCKETSERVE_LOCUST_MODEL",
        help="model to load (default: the server's default model)",
    )  # fmt: skip
    group.add_argument(
        "--lengths", default="natural", env_var="BUCKETSERVE_LOCUST_LENGTHS",
        help=f"length distribution: {SPECS}",
    )  # fmt: skip
    group.add_argument(
        "--payload", choices=["sequences", "text"], default="sequences",
        env_var="BUCKETSERVE_LOCUST_PAYLOAD",
        help="token ids / feature frames, or words (models with a tokenizer)",
    )  # fmt: skip
    group.add_argument(
        "--outputs", default="", env_var="BUCKETSERVE_LOCUST_OUTPUTS",
        help="comma-separated outputs to ask for (default: all)",
    )  # fmt: skip
    group.add_argument(
        "--think-ms", type=float, default=0.0, env_var="BUCKETSERVE_LOCUST_THINK_MS",
        help="pause between a user's requests",
    )  # fmt: skip


class SequenceUser(FastHttpUser):
    """A client that sends one sequence per request, waiting for each answer."""

    def wait_time(self) -> float:
        think_ms: float = self.environment.parsed_options.think_ms
        return think_ms / 1000

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.model: str = options.model or self._get("/v2")["default_model"]
        config = self._get(f"/v2/models/{self.model}/config")
        metadata = self._get(f"/v2/models/{self.model}")
        self.edges: list[int] = config["batching"]["buckets"]
        self.lengths = LengthDistribution.parse(options.lengths, self.edges[-1])
        self.rng = np.random.default_rng()
        self.text = options.payload == "text"
        if self.text and config.get("tokenizer") is None:  # (absent when there is none)
            raise ValueError(f"model {self.model} has no tokenizer: use --payload sequences")
        self.outputs = [o for o in options.outputs.split(",") if o]
        name, sequence = next(
            (n, i) for n, i in config["inputs"].items() if i["role"] in ("tokens", "features")
        )
        self.vocab: int | None = sequence.get("vocab_size")  # (absent for features)
        shape = next(i["shape"] for i in metadata["inputs"] if i["name"] == name)
        self.feature_dim: int | None = shape[2] if len(shape) == 3 else None

    def _get(self, path: str) -> Any:
        with self.client.get(path, name="setup", catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"{path}: {response.status_code}")
                raise RuntimeError(f"GET {path} answered {response.status_code}")
            return response.json()

    def _item(self, length: int) -> Any:
        if self.text:
            return " ".join(self.rng.choice(WORDS, length))
        if self.feature_dim is not None:
            return np.round(self.rng.standard_normal((length, self.feature_dim)), 3).tolist()
        vocab = self.vocab or 1000
        return self.rng.integers(min(1000, vocab // 2), vocab, length).tolist()

    @task
    def predict(self) -> None:
        length = int(self.lengths.sample(self.rng, 1)[0])
        edge = self.edges[min(bisect.bisect_left(self.edges, length), len(self.edges) - 1)]
        body: dict[str, Any] = {
            "model": self.model,
            "text" if self.text else "sequences": [self._item(length)],
        }
        if self.outputs:
            body["outputs"] = self.outputs
        name = f"/predict{' text' if self.text else ''} [<={edge}]"
        with self.client.post("/predict", json=body, name=name, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"{response.status_code}: {response.text[:200]}")
            elif len(response.json()["outputs"]) != 1:
                response.failure("expected one output per sequence")

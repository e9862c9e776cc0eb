"""Shared test helpers that run no model: paths, repositories copied into temporary folders,
random lengths, padded ids, a server process, error bodies, waiting. Those that run models
(ONNX Runtime, load time) are in `tests.engines`."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from loadtest.process import running_server

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"


@dataclass(frozen=True)
class TextServer:
    """A server process on `tiny-encoder` and `st` (conftest's `text_server`)."""

    url: str
    address: str  # gRPC's host:port


def copy_bundled(root: Path, name: str, config: str | None = None) -> Path:
    """A copy of a bundled model, optionally with another config."""
    target = root / name
    shutil.copytree(MODELS / name, target)
    if config is not None:
        (target / "config.toml").write_text(config)
    return target


def lengths_over_buckets(edges: list[int], count: int, seed: int = 0) -> list[int]:
    """`count` lengths spread evenly over the buckets, uniform inside each bucket."""
    rng = np.random.default_rng(seed)
    lows = [1, *[e + 1 for e in edges[:-1]]]
    return [
        int(rng.integers(lows[i % len(edges)], edges[i % len(edges)] + 1)) for i in range(count)
    ]


ENCODER_CONFIG = """
binding = "{binding}"
mode = "{mode}"
[inputs.input_ids]
role = "tokens"
vocab_size = {vocab}
[inputs.attention_mask]
role = "mask"
[inputs.token_type_ids]
role = "token_types"
[outputs.last_hidden_state]
per_step = true
[outputs.sentence_embedding]
[batching]
buckets = {buckets}
max_batch_size = {max_batch_size}
max_batch_tokens = {max_batch_tokens}
"""


def padded(sequences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token id rows padded with 0 to the longest, and their 0/1 mask."""
    longest = max(len(s) for s in sequences)
    ids = np.zeros((len(sequences), longest), np.int64)
    mask = np.zeros_like(ids)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return ids, mask


@contextlib.contextmanager
def server_process(
    models: Path, *flags: str
) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """`bucketserve serve` in its own process, as a user runs it (the result cache at its
    default), logging JSON lines beside `models`."""
    log_path = models.parent / "server.log"
    env = {"BUCKETSERVE_LOG_JSON": "1"}
    with running_server(models, *flags, log_path=log_path, env=env, result_cache=True) as (
        process,
        url,
    ):
        yield process, url, log_path


def error_of(answer: httpx.Response | dict[str, Any]) -> tuple[str, str]:
    """(code, message) of an error answer, in whichever form its route answers errors: KServe
    v2's (`{"error": message, "code": code}`) or the one error form (OpenAI's adds to it)."""
    body = answer.json() if isinstance(answer, httpx.Response) else answer
    error = body["error"]
    if isinstance(error, str):
        return body["code"], error
    return error["code"], error["message"]


def until(condition: Callable[[], bool], what: str, within_s: float = 120) -> None:
    """Wait (polling, in a thread of the test's own) until `condition` holds: for what the
    test needs to have happened, never for how fast; `within_s` only bounds a hang."""
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)

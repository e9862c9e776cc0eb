"""Embedding types on the real all-MiniLM-L6-v2 (slow tier): on a retrieval set made for the
test (each passage one fact about one subject, each query asking it back in other words),
int8 and uint8 vectors, scaled over the ranges the model's calibration found at load, find the
relevant passage in their top 10 at least 0.95 as often as float vectors do; binary too, by
Hamming distance, as a first-pass index uses it."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from bucketserve.loading import load_engine
from bucketserve.settings import Settings
from tests.engines import serving

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SUBJECTS = [
    "the lighthouse keeper", "a retired violinist", "the night baker", "my neighbour's son",
    "the harbour pilot", "an old beekeeper", "the village doctor", "a young glassblower",
    "the museum guard", "our chess teacher", "the ferry captain", "a tired librarian",
]  # fmt: skip
FACTS = [
    ("grows tomatoes on the roof", "Who keeps a vegetable garden up on top of the house?"),
    ("repairs bicycles for free", "Who fixes bikes without asking for money?"),
    ("swims in the cold lake each morning", "Who takes an early dip in icy water every day?"),
    ("collects stamps from Peru", "Who has a collection of Peruvian postage?"),
    ("paints portraits of stray cats", "Who makes pictures of homeless cats?"),
]
PLACES = ["in Lisbon", "near the old mill"]


def retrieval_set() -> tuple[list[str], list[str], list[int]]:
    """Passages (every subject with every fact, in a place), and queries asking for one
    subject's fact in other words; the index of each query's passage."""
    passages, queries, relevant = [], [], []
    combos = list(itertools.product(range(len(SUBJECTS)), range(len(FACTS)), PLACES))
    for subject, fact, place in combos:
        passages.append(f"{SUBJECTS[subject].capitalize()} {FACTS[fact][0]} {place}.")
    for n, (subject, fact, place) in enumerate(combos):
        if n % 2 == 0:  # (half of them asked: sixty queries)
            question = FACTS[fact][1].removesuffix("?")
            queries.append(f"{question} {place}, is it {SUBJECTS[subject]}?")
            relevant.append(n)
    return passages, queries, relevant


def hits(
    queries: np.ndarray, passages: np.ndarray, relevant: list[int], score: Any, top: int = 10
) -> float:
    """How often the relevant passage is in a query's `top`."""
    ranked = [np.argsort(-score(q, passages), kind="stable")[:top] for q in queries]
    return float(np.mean([i in best for best, i in zip(ranked, relevant, strict=True)]))


def dot(q: np.ndarray, p: np.ndarray) -> np.ndarray:
    return np.asarray(p.astype(np.int64) @ q.astype(np.int64), np.float64)


def near(q: np.ndarray, p: np.ndarray) -> np.ndarray:
    return -np.linalg.norm(p.astype(np.float64) - q.astype(np.float64), axis=1)


def hamming(q: np.ndarray, p: np.ndarray) -> np.ndarray:
    return -np.unpackbits(np.bitwise_xor(p, q), axis=1).sum(axis=1).astype(np.float64)


async def test_int8_and_uint8_find_what_floats_find_on_minilm(
    minilm_spec: Any, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    shutil.copytree(minilm_spec.onnx_path.parent.parent, models / "minilm")
    passages, queries, relevant = retrieval_set()
    kinds = ["float", "int8", "uint8", "ubinary"]

    async def embedded(client: httpx.AsyncClient, texts: list[str]) -> dict[str, np.ndarray]:
        body = {"model": "minilm", "texts": texts, "embedding_types": kinds}
        answer = await client.post("/v2/embed", json=body)
        assert answer.status_code == 200, answer.text
        types = {"float": np.float32, "int8": np.int8, "uint8": np.uint8, "ubinary": np.uint8}
        return {k: np.asarray(v, types[k]) for k, v in answer.json()["embeddings"].items()}

    async with serving(load_engine(Settings(models=models))) as client:
        p = await embedded(client, passages)
        q = await embedded(client, queries)
    scores = {"float": lambda a, b: b @ a, "int8": dot, "uint8": near, "ubinary": hamming}
    for top in (1, 10):  # (top 1 shown beside the asked top 10: where the types part)
        found = {k: hits(q[k], p[k], relevant, scores[k], top) for k in kinds}
        print(f"top-{top} hits of {len(queries)} queries in {len(passages)} passages: {found}")
    floats, int8, uint8 = (hits(q[k], p[k], relevant, scores[k]) for k in kinds[:3])
    assert floats > 0.5  # (the set is one a real model answers)
    assert int8 >= 0.95 * floats
    assert uint8 >= 0.95 * floats

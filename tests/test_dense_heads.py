"""Embedders whose module list goes on past the pooling, end to end: an EmbeddingGemma (Gemma3
text under transformers 5, two Dense modules, its prompts) and a LaBSE (BERT, the CLS token,
one Dense with tanh), tiny and made from their releases' configs (`modelgen.dense_heads`),
saved by sentence-transformers as released, imported by the command as a user runs it (the
weights exported, checked against the original past every sliding window, the pooling and
Dense modules folded into the graph), then served by a server process to 16 concurrent
clients over OpenAI's and TEI's routes: every vector sentence-transformers' own on that text
alone, with that prompt, within 1e-5, in the order sent."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from loadtest.long_context import imported, texts_of
from tests.helpers import server_process

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

TOLERANCE = 1e-5
CLIENTS = 16
REQUESTS = 64


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("sentence_transformers")
    return tmp_path_factory.mktemp("dense")


def requests_of(lengths: list[int], prompts: list[str | None], seed: int) -> list[dict[str, Any]]:
    """REQUESTS bodies of 1 to 4 texts each, of the given lengths in turn, each with one of
    `prompts`, half to OpenAI's route and half to TEI's."""
    rng = np.random.default_rng(seed)
    texts = iter(texts_of([lengths[i % len(lengths)] for i in range(4 * REQUESTS)], seed))
    bodies = []
    for i in range(REQUESTS):
        batch = [next(texts) for _ in range(int(rng.integers(1, 5)))]
        prompt = prompts[i % len(prompts)]
        bodies.append({"route": "openai" if i % 2 else "tei", "texts": batch, "prompt": prompt})
    return bodies


def send(url: str, model: str, body: dict[str, Any]) -> list[list[float]]:
    """One request on its route: the vectors answered, in the order given."""
    named = {} if body["prompt"] is None else {"prompt_name": body["prompt"]}
    if body["route"] == "openai":
        answer = httpx.post(
            f"{url}/v1/embeddings",
            json={"model": model, "input": body["texts"], **named},
            timeout=300,
        )
        assert answer.status_code == 200, answer.text
        data = answer.json()["data"]
        assert [d["index"] for d in data] == list(range(len(body["texts"])))
        return [d["embedding"] for d in data]
    answer = httpx.post(
        f"{url}/embed", json={"model": model, "inputs": body["texts"], **named}, timeout=300
    )
    assert answer.status_code == 200, answer.text
    vectors: list[list[float]] = answer.json()
    return vectors


def served_as_the_reference(models: Path, model: str, embedder: Any, bodies: list[Any]) -> None:
    """Every body sent by CLIENTS clients at once; each vector against sentence-transformers'
    on its text alone, with its prompt."""
    with server_process(models) as (process, url, _):
        with ThreadPoolExecutor(CLIENTS) as clients:
            answers = list(clients.map(lambda body: send(url, model, body), bodies))
        assert process.poll() is None
    largest = 0.0
    for body, vectors in zip(bodies, answers, strict=True):
        assert len(vectors) == len(body["texts"])
        for text, got in zip(body["texts"], vectors, strict=True):
            want = embedder.encode([text], prompt_name=body["prompt"], batch_size=1)[0]
            largest = max(largest, float(np.abs(np.asarray(got) - want).max()))
    assert largest <= TOLERANCE


def test_embeddinggemma_is_imported_and_serves_as_sentence_transformers(root: Path) -> None:
    from modelgen.dense_heads import GEMMA_CONTEXT, GEMMA_WINDOW, embeddinggemma

    embedder = embeddinggemma(root)
    said = imported(root / "embeddinggemma", root / "models")
    assert "checked it against the original: 5 texts of 1 to 2048 tokens" in said
    assert "#   pooling: mean (1_Pooling/config.json)" in said
    assert "#   Dense: 2_Dense 32 -> 128, 3_Dense 128 -> 32, folded with the pooling" in said
    assert "#   Normalize: applied" in said
    assert "Summarization, document, query (config_sentence_transformers.json)" in said
    assert "#   pad: id 0 (config.json's pad_token_id)" in said
    assert '"query" = "task: search result | query: "' in said
    assert "embedding: sentence_embedding, pooling none, normalised, width 32" in said
    # texts from one token to past the context, across the sliding windows of 512
    lengths = [1, 3, 20, GEMMA_WINDOW - 5, GEMMA_WINDOW + 40, 2 * GEMMA_WINDOW + 100]
    lengths += [GEMMA_CONTEXT - 2, GEMMA_CONTEXT + 300, 60, 7]
    bodies = requests_of(lengths, [None, "query", "document"], seed=50)
    served_as_the_reference(root / "models", "embeddinggemma", embedder, bodies)


def test_labse_is_imported_and_serves_as_sentence_transformers(root: Path) -> None:
    from modelgen.dense_heads import LABSE_CONTEXT, labse

    embedder = labse(root)
    said = imported(root / "labse", root / "labse-models")
    assert "#   pooling: cls (1_Pooling/config.json)" in said
    assert "#   Dense: 2_Dense 32 -> 32 Tanh, folded with the pooling" in said
    assert "#   Normalize: applied" in said
    assert "embedding: sentence_embedding, pooling none, normalised, width 32" in said
    lengths = [1, 2, 9, 30, 120, LABSE_CONTEXT - 2, LABSE_CONTEXT + 40, 17]
    bodies = requests_of(lengths, [None], seed=51)
    served_as_the_reference(root / "labse-models", "labse", embedder, bodies)

"""Long inputs in windows: a text longer than the model is embedded whole, as windows of the
model's length (each with its special tokens, `window_overlap` tokens shared with the one
before), each window alone through the model, the text's vector their pooled vectors'
mean weighted by each window's tokens, normalised after. Against a reference made apart from
the server: transformers' tokenizer cutting the text into overflowing windows with that
stride, and the ONNX model alone at batch 1 on each."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bucketserve.loading import load_engine
from bucketserve.runtime.sessions import GraphFile, side_session
from bucketserve.settings import Settings
from tests.engines import serving
from tests.exports import texts, tokenizer
from tests.helpers import error_of
from tests.task_exports import TaskRepository as Repository

TOLERANCE = 1e-5
MAX_LENGTH = 64  # (the embedder's config)


def entry_with(task_repository: Repository, root: Path, **tokenizer_fields: Any) -> Path:
    """The embedder's entry, its [tokenizer] given these fields."""
    entry = root / "models" / "embedder"
    shutil.copytree(task_repository.models / "embedder", entry)
    config = entry / "config.toml"
    extra = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in tokenizer_fields.items())
    config.write_text(config.read_text().replace("[tokenizer]\n", "[tokenizer]\n" + extra))
    return entry.parent


def reference(entry: Path, text: str, overlap: int) -> np.ndarray:
    """The text's windows as transformers cuts them (overflowing, `overlap` as its stride),
    each through the ONNX model alone, mean-pooled, averaged by their tokens, normalised."""
    from transformers import PreTrainedTokenizerFast

    own = tokenizer()
    own.no_padding()
    own.no_truncation()
    fast = PreTrainedTokenizerFast(tokenizer_object=own, pad_token="[PAD]")
    windows = fast(text, max_length=MAX_LENGTH, truncation=True, stride=overlap,
                   return_overflowing_tokens=True)["input_ids"]  # fmt: skip
    session = side_session(GraphFile(entry / "1" / "model.onnx", ("CPUExecutionProvider",)))
    pooled, weights = [], []
    for ids in windows:
        feeds = {"input_ids": np.array([ids], np.int64)}
        feeds |= {"attention_mask": np.ones_like(feeds["input_ids"])}
        feeds |= {"token_type_ids": np.zeros_like(feeds["input_ids"])}
        states = session.run(["last_hidden_state"], feeds)[0][0].astype(np.float64)
        pooled.append(states.mean(axis=0))
        weights.append(len(ids))
    mean = np.average(np.stack(pooled), axis=0, weights=weights)
    return mean / np.linalg.norm(mean)


LONG = [" ".join(texts(40, seed=s)) for s in (41, 42)]  # (hundreds of tokens each)


@pytest.mark.parametrize("overlap", [0, 8])
async def test_a_long_text_is_the_token_weighted_mean_of_its_windows(
    task_repository: Repository, tmp_path: Path, overlap: int
) -> None:
    models = entry_with(task_repository, tmp_path, window_overlap=overlap)
    short = "a cat sat"
    async with serving(load_engine(Settings(models=models))) as client:
        body = {"model": "embedder", "input": [*LONG, short], "long_inputs": "windows"}
        windowed = await client.post("/v1/embeddings", json=body)
        tei = await client.post("/embed", json={"inputs": [*LONG, short], "long_inputs": "windows"})
        cut = await client.post("/v1/embeddings", json=body | {"long_inputs": "truncate"})
    assert windowed.status_code == tei.status_code == 200, windowed.text
    got = [d["embedding"] for d in windowed.json()["data"]]
    for vector, text in zip(got[:2], LONG, strict=True):
        np.testing.assert_allclose(vector, reference(models / "embedder", text, overlap),
                                   atol=TOLERANCE)  # fmt: skip
    np.testing.assert_allclose(tei.json(), got, atol=TOLERANCE)
    truncated = [d["embedding"] for d in cut.json()["data"]]
    np.testing.assert_allclose(got[2], truncated[2], atol=TOLERANCE)  # (one window: the same)
    assert not np.allclose(got[0], truncated[0], atol=1e-3)  # (the whole text, not its start)
    tokens = windowed.json()["usage"]["prompt_tokens"]
    assert tokens > cut.json()["usage"]["prompt_tokens"] + 2 * MAX_LENGTH  # (every window)


async def test_the_config_chooses_windows_and_a_request_may_cut(
    task_repository: Repository, tmp_path: Path
) -> None:
    """A model whose config says windows embeds long texts whole unasked; a request may
    still ask to cut; a route whose task answers from one sequence (classification) has no
    such field, and one sent there is ignored and said."""
    models = entry_with(task_repository, tmp_path, long_inputs="windows", window_overlap=4)
    async with serving(load_engine(Settings(models=models))) as client:
        unasked = await client.post("/embed", json={"inputs": LONG[0]})
        asked_cut = await client.post("/embed", json={"inputs": LONG[0], "long_inputs": "truncate"})
    np.testing.assert_allclose(unasked.json()[0], reference(models / "embedder", LONG[0], 4),
                               atol=TOLERANCE)  # fmt: skip
    assert not np.allclose(asked_cut.json()[0], unasked.json()[0], atol=1e-3)


def window_ids(text: str, overlap: int, length: int) -> list[list[int]]:
    """The text's windows' token ids, as transformers cuts them (overflowing, that stride)."""
    from transformers import PreTrainedTokenizerFast

    own = tokenizer()
    own.no_padding()
    own.no_truncation()
    fast = PreTrainedTokenizerFast(tokenizer_object=own, pad_token="[PAD]")
    cut = fast(text, max_length=length, truncation=True, stride=overlap,
               return_overflowing_tokens=True)  # fmt: skip
    return [list(ids) for ids in cut["input_ids"]]


async def test_sparse_weights_and_per_token_vectors_merge_their_windows(
    task_repository: Repository, tmp_path: Path
) -> None:
    """SPLADE weights in windows: each entry's largest over the windows' (each window sent
    as its own token ids, alone); per-token vectors: the windows' one after another."""
    models = tmp_path / "models"
    for name in ("splade", "embedder"):
        shutil.copytree(task_repository.models / name, models / name)
    text = LONG[0]
    sparse = {"model": "splade", "inputs": text, "long_inputs": "windows"}
    per_token = {"model": "embedder", "inputs": text, "long_inputs": "windows"}
    ids = window_ids(text, 0, 128)
    async with serving(load_engine(Settings(models=models))) as client:
        whole = await client.post("/embed_sparse", json=sparse)
        top = await client.post("/embed_sparse", json=sparse | {"top_k": 5})
        alone = await client.post("/embed_sparse", json={"model": "splade", "inputs": ids})
        vectors = await client.post("/embed_all", json=per_token)
        windows = window_ids(text, 0, MAX_LENGTH)
        each = await client.post("/embed_all", json={"model": "embedder", "inputs": windows})
    assert len(ids) > 1
    want: dict[int, float] = {}
    for window in alone.json():
        for item in window:
            want[item["index"]] = max(want.get(item["index"], 0.0), item["value"])
    got = {item["index"]: item["value"] for item in whole.json()[0]}
    assert got.keys() == want.keys()
    np.testing.assert_allclose([got[k] for k in sorted(got)], [want[k] for k in sorted(want)],
                               atol=TOLERANCE)  # fmt: skip
    best = sorted(want, key=lambda k: -want[k])[:5]
    assert sorted(item["index"] for item in top.json()[0]) == sorted(best)
    np.testing.assert_allclose(vectors.json()[0], np.concatenate(each.json()), atol=TOLERANCE)


def test_an_overlap_a_window_cannot_hold_is_refused_at_load(
    task_repository: Repository, tmp_path: Path
) -> None:
    from bucketserve.errors import ConfigError

    models = entry_with(task_repository, tmp_path, window_overlap=MAX_LENGTH)
    with pytest.raises(ConfigError, match="window_overlap 64: a window holds 62 tokens"):
        load_engine(Settings(models=models))


async def test_windows_are_bounded_by_the_request_token_limit(
    task_repository: Repository, tmp_path: Path
) -> None:
    models = entry_with(task_repository, tmp_path)
    settings = Settings(models=models, max_request_tokens=200)
    async with serving(load_engine(settings)) as client:
        refused = await client.post("/embed", json={"inputs": LONG[0], "long_inputs": "windows"})
    assert refused.status_code == 422
    assert "more than the limit of 200 per request" in error_of(refused)[1]


@pytest.mark.slow
async def test_a_5000_token_document_on_minilm_as_sentence_transformers_windows_it(
    minilm_spec: Any, tmp_path: Path
) -> None:
    """The real all-MiniLM-L6-v2 served with a short max_length (128) and windows overlapping
    by 16: a document of over 5,000 tokens (11,612 in 91 windows) embedded whole equals the
    token-weighted mean of its windows, each embedded alone by sentence-transformers' own
    modules (its Transformer and Pooling, normalised after), as its tokenizer cuts them."""
    import torch
    from sentence_transformers import SentenceTransformer

    from modelgen.minilm import _model_source

    models = tmp_path / "models"
    shutil.copytree(minilm_spec.onnx_path.parent.parent, models / "minilm")
    config = models / "minilm" / "config.toml"
    text = config.read_text()
    start = text.index("[tokenizer]\n")
    end = text.find("\n[", start + 1)
    tokenizer_section = text[start : end if end >= 0 else len(text)]
    served = "\n".join(
        line for line in tokenizer_section.splitlines() if not line.startswith("max_length")
    )
    served += '\nmax_length = 128\nlong_inputs = "windows"\nwindow_overlap = 16\n'
    # (its per-token states pooled here, as sentence-transformers' Pooling pools them: the
    # graph's own sentence_embedding is normalised already, and windows average what it gives)
    pooled_here = 'output = "last_hidden_state"\npooling = "mean"'
    text = text.replace('output = "sentence_embedding"\npooling = "none"', pooled_here)
    config.write_text(text.replace(tokenizer_section, served))
    document = " ".join(texts(700, seed=43))
    st_model = SentenceTransformer(str(_model_source()), device="cpu")
    windows = st_model.tokenizer(document, max_length=128, truncation=True, stride=16,
                                 return_overflowing_tokens=True)["input_ids"]  # fmt: skip
    assert sum(len(w) for w in windows) > 5000
    pooled, weights = [], []
    with torch.no_grad():
        for ids in windows:
            features = {"input_ids": torch.tensor([ids])}
            features["attention_mask"] = torch.ones_like(features["input_ids"])
            features["token_type_ids"] = torch.zeros_like(features["input_ids"])
            out = st_model[1](st_model[0](features))["sentence_embedding"][0]
            pooled.append(out.numpy().astype(np.float64))
            weights.append(len(ids))
    mean = np.average(np.stack(pooled), axis=0, weights=weights)
    want = mean / np.linalg.norm(mean)
    async with serving(load_engine(Settings(models=models))) as client:
        answer = await client.post("/v1/embeddings", json={"model": "minilm", "input": document})
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(answer.json()["data"][0]["embedding"], want, atol=TOLERANCE)
    assert answer.json()["usage"]["prompt_tokens"] == sum(weights)


def reranker_windows(repository: Repository, query: str, document: str, overlap: int) -> Any:
    """The document's windows as transformers cuts a pair (the query whole, `only_second`,
    `overlap` as its stride), each scored by the cross-encoder alone: logits and spans."""
    fast = repository.reranker.fast
    options = {"return_overflowing_tokens": True, "return_offsets_mapping": True}
    cut = fast(query, document, max_length=RERANK_LENGTH, truncation="only_second",
               stride=overlap, **options)  # fmt: skip
    import torch

    logits, spans = [], []
    for n, ids in enumerate(cut["input_ids"]):
        feeds = {k: torch.tensor([cut[k][n]]) for k in ("input_ids", "token_type_ids")}
        feeds["attention_mask"] = torch.ones_like(feeds["input_ids"])
        with torch.no_grad():
            logits.append(float(repository.reranker.model(**feeds).logits[0][0]))
        second = [o for o, t in zip(cut["offset_mapping"][n], cut["token_type_ids"][n],
                                    strict=True) if t == 1 and o[1] > o[0]]  # fmt: skip
        spans.append((second[0][0], second[-1][1]))
        assert len(ids) <= RERANK_LENGTH
    return logits, spans


RERANK_LENGTH = 128  # (the reranker's config: its positions)
QUERY = "where do the cats sleep"


def reranker_entry(task_repository: Repository, root: Path, overlap: int) -> Path:
    entry = root / "models" / "reranker"
    shutil.copytree(task_repository.models / "reranker", entry)
    config = entry / "config.toml"
    config.write_text(config.read_text().replace(
        "[tokenizer]\n", f"[tokenizer]\nwindow_overlap = {overlap}\n"))  # fmt: skip
    return entry.parent


async def test_a_long_document_is_scored_by_its_best_window(
    task_repository: Repository, tmp_path: Path
) -> None:
    """Rerank in windows: the query whole in each window of the document; the document's
    score its best window's, and the answer says which (its characters), on each rerank
    route; against transformers' overflowing pairs and the cross-encoder on each alone."""
    models = reranker_entry(task_repository, tmp_path, overlap=8)
    docs = [" ".join(texts(30, seed=s)) for s in (51, 52)]
    async with serving(load_engine(Settings(models=models))) as client:
        body = {"query": QUERY, "texts": docs, "raw_scores": True, "long_inputs": "windows"}
        tei = (await client.post("/rerank", json=body)).json()
        cohere = await client.post("/v1/rerank", json={"query": QUERY, "documents": docs,
                                                       "long_inputs": "windows"})  # fmt: skip
        score = await client.post("/score", json={"text_1": QUERY, "text_2": docs,
                                                  "long_inputs": "windows"})  # fmt: skip
    for result in tei:
        logits, spans = reranker_windows(task_repository, QUERY, docs[result["index"]], 8)
        assert len(logits) > 2  # (long enough for several windows)
        best = int(np.argmax(logits))
        assert result["score"] == pytest.approx(logits[best], abs=TOLERANCE)
        assert (result["window"]["start"], result["window"]["end"]) == spans[best]
    by_index = {r["index"]: r for r in tei}
    for result in cohere.json()["results"]:
        want = 1 / (1 + np.exp(-by_index[result["index"]]["score"]))
        assert result["relevance_score"] == pytest.approx(want, abs=TOLERANCE)
        assert result["window"] == by_index[result["index"]]["window"]
    for item in score.json()["data"]:
        assert item["window"] == by_index[item["index"]]["window"]


async def test_a_relevant_sentence_at_the_end_is_found_where_a_cut_loses_it(
    task_repository: Repository, tmp_path: Path
) -> None:
    """The sentence the cross-encoder finds most relevant, put at the end of a long document
    of others: cut, the document is scored by its start; in windows, by that sentence's
    window, which the answer points to."""
    reference = task_repository.reranker
    candidates = texts(60, seed=53)
    ranked = sorted(candidates, key=lambda c: reference.cross_encoder_score(QUERY, c))
    filler, relevant = " ".join(ranked[:40]), ranked[-1]
    document = f"{filler} {relevant}"
    models = reranker_entry(task_repository, tmp_path, overlap=8)
    async with serving(load_engine(Settings(models=models))) as client:
        body = {"query": QUERY, "documents": [document], "truncate": True}
        cut = (await client.post("/v1/rerank", json=body)).json()["results"][0]
        whole = await client.post("/v1/rerank", json=body | {"long_inputs": "windows"})
    found = whole.json()["results"][0]
    assert found["relevance_score"] > cut["relevance_score"]
    assert found["window"]["end"] == len(document)  # (the last window: the sentence's)
    assert document.index(relevant) >= found["window"]["start"]


async def test_late_chunking_pools_each_text_in_the_context_of_the_others(
    task_repository: Repository, tmp_path: Path
) -> None:
    """Jina's late chunking: the texts as one sequence inside the special tokens, each text's
    vector the mean of the model's states over its own tokens, normalised; against the ONNX
    model alone on that sequence, made here with transformers' tokenizer."""
    from transformers import PreTrainedTokenizerFast

    models = entry_with(task_repository, tmp_path)
    chunks = ["a cat sat on the mat", "it was warm there", "then the dog came"]
    body = {"model": "embedder", "input": chunks, "late_chunking": True}
    async with serving(load_engine(Settings(models=models))) as client:
        late = await client.post("/v1/embeddings", json=body)
        alone = await client.post("/v1/embeddings", json={"model": "embedder", "input": chunks})
        too_long = await client.post("/v1/embeddings", json=body | {"input": LONG[:1] * 2})
    assert late.status_code == 200, late.text
    own = tokenizer()
    own.no_padding()
    own.no_truncation()
    fast = PreTrainedTokenizerFast(tokenizer_object=own, pad_token="[PAD]")
    parts = [fast(c, add_special_tokens=False)["input_ids"] for c in chunks]
    ids = [
        fast.convert_tokens_to_ids("[CLS]"),
        *(token for part in parts for token in part),
        fast.convert_tokens_to_ids("[SEP]"),
    ]
    session = side_session(GraphFile(models / "embedder" / "1" / "model.onnx",
                                     ("CPUExecutionProvider",)))  # fmt: skip
    feeds = {"input_ids": np.array([ids], np.int64)}
    feeds |= {"attention_mask": np.ones_like(feeds["input_ids"])}
    feeds |= {"token_type_ids": np.zeros_like(feeds["input_ids"])}
    states = session.run(["last_hidden_state"], feeds)[0][0].astype(np.float64)
    start = 1
    rows = [d["embedding"] for d in late.json()["data"]]
    for row, part in zip(rows, parts, strict=True):
        mean = states[start : start + len(part)].mean(axis=0)
        np.testing.assert_allclose(row, mean / np.linalg.norm(mean), atol=TOLERANCE)
        start += len(part)
    assert late.json()["usage"]["prompt_tokens"] == len(ids)
    apart = [d["embedding"] for d in alone.json()["data"]]
    assert not np.allclose(rows[1], apart[1], atol=1e-3)  # (in the others' context)
    assert too_long.status_code == 422
    assert "late_chunking: the inputs together take" in error_of(too_long)[1]


async def test_late_chunking_needs_an_embedding_pooled_by_mean(
    task_repository: Repository, tmp_path: Path
) -> None:
    models = entry_with(task_repository, tmp_path)
    config = models / "embedder" / "config.toml"
    config.write_text(config.read_text().replace('pooling = "mean"', 'pooling = "cls"'))
    body = {"model": "embedder", "input": ["a", "b"], "late_chunking": True}
    async with serving(load_engine(Settings(models=models))) as client:
        refused = await client.post("/v1/embeddings", json=body)
        ids = await client.post("/v1/embeddings", json=body | {"input": [[5, 6]]})
    assert refused.status_code == 422
    assert "embedder's embedding is pooled cls" in error_of(refused)[1]
    assert ids.status_code == 422
    assert "late_chunking takes texts" in error_of(ids)[1]


async def test_a_pair_classified_in_windows_takes_its_best_windows_labels(
    task_repository: Repository, tmp_path: Path
) -> None:
    """/classify of a pair in windows: the labels of the window whose best label scores
    highest, as the cross-encoder scores each window alone; a text alone is refused windows."""
    models = reranker_entry(task_repository, tmp_path, overlap=8)
    document = " ".join(texts(30, seed=54))
    async with serving(load_engine(Settings(models=models))) as client:
        body = {"inputs": [[QUERY, document]], "raw_scores": True, "long_inputs": "windows"}
        pair = await client.post("/classify", json=body)
        alone = await client.post("/classify", json=body | {"inputs": [[document]]})
    assert pair.status_code == 200, pair.text
    logits, _ = reranker_windows(task_repository, QUERY, document, 8)
    assert pair.json()[0][0]["score"] == pytest.approx(max(logits), abs=TOLERANCE)
    assert alone.status_code == 422
    assert "windows are for pairs" in error_of(alone)[1]

"""Rerank, classify and tokenize: transformers' own sequence classifiers exported as optimum
writes them, brought in with `models import`, served beside an embedder, every score equal
(1e-5) to what transformers gives for that input alone (`tests.task_exports.Reference`)."""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import re
import shutil
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import cohere
import httpx
import numpy as np
import onnx
import pytest
import torch

from bucketserve.core.quantize import Calibration, EmbeddingType, quantized
from bucketserve.core.tasks.sparse import SparsePooling, SparseRule
from bucketserve.errors import InvalidInput
from bucketserve.loading import load_engine
from bucketserve.loading.check import difference
from bucketserve.loading.importer import import_model
from bucketserve.runtime.sessions import GraphFile, side_session
from bucketserve.settings import Settings
from modelgen import zoo
from tests.engines import serving
from tests.exports import (
    MAX_SEQ_LENGTH,
    SPECIALS,
    WORDS,
    texts,
    tokenizer,
    vocabulary,
)
from tests.helpers import error_of, server_process
from tests.task_exports import (
    MAX_POSITIONS,
    SENTIMENT,
)
from tests.task_exports import (
    TaskRepository as Repository,
)

QUERY = "what is a bucket"
TOLERANCE = 1e-5

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def repository(task_repository: Repository) -> Repository:
    return task_repository


@pytest.fixture
async def client(repository: Repository) -> AsyncIterator[httpx.AsyncClient]:
    engine = load_engine(Settings(models=repository.models, max_sequences=64))
    async with serving(engine) as served:
        yield served


def documents(count: int, seed: int) -> list[str]:
    return texts(count, seed)


def test_import_writes_each_task_from_the_export(repository: Repository) -> None:
    reranker = tomllib.loads(repository.configs["reranker"])
    assert reranker["classifier"] == {
        "output": "logits",
        "labels": ["LABEL_0"],
        "activation": "sigmoid",  # (the CrossEncoder's activation_fn)
        "rerank_label": 0,
    }
    assert "embedding" not in reranker
    sentiment = tomllib.loads(repository.configs["sentiment"])
    assert sentiment["classifier"] == {
        "output": "logits",
        "labels": SENTIMENT,
        "activation": "softmax",  # (problem_type single_label_classification)
    }


async def test_tei_rerank_scores_each_pair_as_the_cross_encoder(
    client: httpx.AsyncClient, repository: Repository
) -> None:
    docs = documents(24, seed=1)
    answer = await client.post("/rerank", json={"query": QUERY, "texts": docs, "return_text": True})
    assert answer.status_code == 200, answer.text
    results = answer.json()
    assert sorted(r["index"] for r in results) == list(range(len(docs)))
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    for r in results:
        assert r["text"] == docs[r["index"]]
        want = repository.reranker.cross_encoder_score(QUERY, docs[r["index"]])
        assert r["score"] == pytest.approx(want, abs=TOLERANCE)
    raw = await client.post("/rerank", json={"query": QUERY, "texts": docs[:3], "raw_scores": True})
    for r in raw.json():
        logit = repository.reranker.logits(QUERY, docs[r["index"]])[0]
        assert r["score"] == pytest.approx(float(logit), abs=TOLERANCE)
        assert "text" not in r


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
async def test_cohere_and_jina_rerank(
    client: httpx.AsyncClient, repository: Repository, path: str
) -> None:
    docs = documents(10, seed=2)
    body = {
        "model": "reranker",
        "query": QUERY,
        "documents": [docs[0], *({"text": d} for d in docs[1:])],
        "top_n": 4,
        "return_documents": True,
    }
    answer = await client.post(path, json=body)
    assert answer.status_code == 200, answer.text
    reply = answer.json()
    assert reply["model"] == "reranker"
    assert reply["usage"]["total_tokens"] > 0
    scores = [repository.reranker.cross_encoder_score(QUERY, d) for d in docs]
    best = sorted(range(len(docs)), key=lambda i: -scores[i])[:4]
    assert [r["index"] for r in reply["results"]] == best
    for r in reply["results"]:
        assert r["relevance_score"] == pytest.approx(scores[r["index"]], abs=TOLERANCE)
        assert r["document"] == {"text": docs[r["index"]]}


async def test_coheres_sdk_reranks_unchanged(
    client: httpx.AsyncClient, repository: Repository
) -> None:
    """Cohere's Python SDK, both its clients, pointed at the server with nothing changed."""
    docs = documents(8, seed=5)
    scores = [repository.reranker.cross_encoder_score(QUERY, d) for d in docs]
    best = sorted(range(len(docs)), key=lambda i: -scores[i])[:3]
    v1 = cohere.AsyncClient(api_key="unused", base_url="http://test", httpx_client=client)
    v2 = cohere.AsyncClientV2(api_key="unused", base_url="http://test", httpx_client=client)
    for sdk in (v1, v2):
        reply = await sdk.rerank(model="reranker", query=QUERY, documents=docs, top_n=3)
        assert [r.index for r in reply.results] == best
        for r in reply.results:
            assert r.relevance_score == pytest.approx(scores[r.index], abs=TOLERANCE)


def test_langchains_cohere_rerank_against_a_server_process(repository: Repository) -> None:
    """LangChain's CohereRerank (langchain-cohere, on Cohere's sync client) pointed at a real
    server process, nothing else changed: the documents it keeps and their scores are the
    cross-encoder's."""
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    docs = documents(8, seed=11)
    scores = [repository.reranker.cross_encoder_score(QUERY, d) for d in docs]
    best = sorted(range(len(docs)), key=lambda i: -scores[i])[:3]
    with server_process(repository.models) as (_, url, _), httpx.Client() as http:
        # (its own HTTP client, which the test closes; CohereRerank's own base_url works too)
        sdk = cohere.ClientV2(api_key="unused", base_url=url, httpx_client=http)
        reranker = CohereRerank(client=sdk, model="reranker", top_n=3)
        kept = reranker.compress_documents([Document(page_content=d) for d in docs], QUERY)
    assert [d.page_content for d in kept] == [docs[i] for i in best]
    for document, i in zip(kept, best, strict=True):
        assert document.metadata["relevance_score"] == pytest.approx(scores[i], abs=TOLERANCE)


async def test_pairs_over_kserve_v2_as_a_bytes_tensor_of_two_columns(
    client: httpx.AsyncClient, repository: Repository
) -> None:
    """Triton's clients reach a reranker: a BYTES `text` of [n, 2], each row a (query,
    document) pair, answered with each pair's logits, as the model gives them alone."""
    docs = documents(5, seed=9)
    rows = [[QUERY, d] for d in docs]
    body = {"inputs": [{"name": "text", "shape": [5, 2], "datatype": "BYTES", "data": rows}]}
    answer = await client.post("/v2/models/reranker/infer", json=body)
    assert answer.status_code == 200, answer.text
    (logits,) = answer.json()["outputs"]
    assert logits["shape"] == [5, 1]
    want = [float(repository.reranker.logits(QUERY, d)[0]) for d in docs]
    np.testing.assert_allclose(logits["data"], want, atol=TOLERANCE, rtol=TOLERANCE)
    flat = {"inputs": [{"name": "text", "shape": [5, 2], "datatype": "BYTES",
                        "data": [t for row in rows for t in row]}]}  # fmt: skip
    assert (await client.post("/v2/models/reranker/infer", json=flat)).json() == answer.json()
    wide = {"inputs": [{"name": "text", "shape": [1, 3], "datatype": "BYTES", "data": ["a"] * 3}]}
    refused = await client.post("/v2/models/reranker/infer", json=wide)
    assert refused.status_code == 422
    assert "[n], [n, 1] or [n, 2]" in refused.json()["error"]
    embedder = {
        "inputs": [{"name": "text", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}]
    }
    refused = await client.post("/v2/models/embedder/infer", json=embedder)
    assert refused.status_code == 422
    assert "[n] or [n, 1]" in refused.json()["error"]


async def test_classify_a_text_a_pair_and_a_batch(
    client: httpx.AsyncClient, repository: Repository
) -> None:
    reference = repository.sentiment
    one = await client.post("/classify", json={"model": "sentiment", "inputs": "the cat read"})
    assert one.status_code == 200, one.text
    want = reference.pipeline_scores("the cat read")
    assert [r["label"] for r in one.json()] == sorted(want, key=lambda k: -want[k])
    for r in one.json():
        assert r["score"] == pytest.approx(want[r["label"]], abs=TOLERANCE)

    pair = await client.post(
        "/classify", json={"model": "sentiment", "inputs": ["a query", "a reply"], "top_k": 1}
    )
    want = reference.pipeline_scores("a query", "a reply")
    (best,) = pair.json()
    assert best["label"] == max(want, key=lambda k: want[k])
    assert best["score"] == pytest.approx(max(want.values()), abs=TOLERANCE)

    batch = texts(9, seed=4)
    many = await client.post(
        "/classify",
        json={"model": "sentiment", "inputs": [[t] for t in batch], "raw_scores": True},
    )
    assert many.status_code == 200, many.text
    for text, scores in zip(batch, many.json(), strict=True):
        logits = reference.logits(text)
        for r in scores:
            index = SENTIMENT.index(r["label"])
            assert r["score"] == pytest.approx(float(logits[index]), abs=TOLERANCE)


@pytest.mark.parametrize("count", [1, 3, 5])
async def test_a_flat_list_of_texts_is_a_batch_with_an_answer_each(
    client: httpx.AsyncClient, repository: Repository, count: int
) -> None:
    """As TEI reads its /predict body: a list of one, or of three or more, strings is a batch
    of texts (two strings are one pair); never one text with the rest dropped."""
    batch = ["good movie", "bad movie", "meh", "the cat read", "a long day"][:count]
    answer = await client.post("/classify", json={"model": "sentiment", "inputs": batch})
    assert answer.status_code == 200, answer.text
    assert len(answer.json()) == count
    for text, scores in zip(batch, answer.json(), strict=True):
        want = repository.sentiment.pipeline_scores(text)
        for r in scores:
            assert r["score"] == pytest.approx(want[r["label"]], abs=TOLERANCE)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/rerank", {"query": QUERY, "texts": ["a"], "prompt_name": "query"}),
        ("/rerank", {"query": QUERY, "texts": ["a"], "prompt_name": "no such prompt"}),
        ("/classify", {"model": "sentiment", "inputs": ["a", "b"], "prompt_name": "query"}),
        ("/classify", {"model": "sentiment", "inputs": [["a", "b"]], "prompt_name": "x"}),
    ],
)
async def test_a_prompt_named_for_a_pair_is_refused_not_ignored(
    client: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> None:
    answer = await client.post(path, json=body)
    assert answer.status_code == 422, answer.text
    assert "a text pair is scored as sent" in error_of(answer)[1]


async def test_cohere_document_objects_are_ranked_by_their_fields(
    client: httpx.AsyncClient, repository: Repository
) -> None:
    """As Cohere takes them: objects with fields beside `text`, ranked by `text`, or by the
    fields `rank_fields` names (two or more as `field: value` lines), returned as sent."""
    docs = [
        {"id": 7, "title": "buckets", "text": "a bucket holds sequences of one length"},
        {"id": 8, "title": "rivers", "text": "the river runs past the old house"},
    ]
    plain = await client.post(
        "/v1/rerank", json={"query": QUERY, "documents": docs, "return_documents": True}
    )
    fields = await client.post(
        "/v2/rerank", json={"query": QUERY, "documents": docs, "rank_fields": ["title", "text"]}
    )
    missing = await client.post(
        "/v1/rerank", json={"query": QUERY, "documents": docs, "rank_fields": ["author"]}
    )
    assert plain.status_code == 200, plain.text
    for r in plain.json()["results"]:
        want = repository.reranker.cross_encoder_score(QUERY, docs[r["index"]]["text"])
        assert r["relevance_score"] == pytest.approx(want, abs=TOLERANCE)
        assert r["document"] == docs[r["index"]]
    assert fields.status_code == 200, fields.text
    for r in fields.json()["results"]:
        doc = docs[r["index"]]
        text = f"title: {doc['title']}\ntext: {doc['text']}"
        want = repository.reranker.cross_encoder_score(QUERY, text)
        assert r["relevance_score"] == pytest.approx(want, abs=TOLERANCE)
    assert missing.status_code == 422
    assert "no field 'author' of text to rank it by" in error_of(missing)[1]
    for bad, kind, named in (  # (a text is a string: a number is not answered as its spelling)
        ({"text": 5}, "a number", None),
        ({"text": True}, "a boolean", None),
        ({"text": None}, "null", None),
        ({"text": {"en": "a"}}, "an object", None),
        (docs[0], "a number", ["title", "id"]),
    ):
        body = {"query": QUERY, "documents": [bad]} | ({"rank_fields": named} if named else {})
        refused = await client.post("/v1/rerank", json=body)
        assert refused.status_code == 422, refused.text
        assert f"a document's text must be a string, not {kind}" in error_of(refused)[1]


async def test_rerank_and_classify_beside_embeddings_under_concurrent_traffic(
    client: httpx.AsyncClient, repository: Repository
) -> None:
    """Mixed traffic on one server, every answer exact: one request's pairs of many lengths
    are batched by length with other requests'."""
    queries = [(f"query {i} {QUERY}", documents(12, seed=10 + i)) for i in range(6)]
    classified = texts(12, seed=20)
    embedded = texts(12, seed=21)
    replies = await asyncio.gather(
        *(client.post("/v1/rerank", json={"query": q, "documents": d}) for q, d in queries),
        *(client.post("/classify", json={"model": "sentiment", "inputs": t}) for t in classified),
        *(client.post("/v1/embeddings", json={"model": "embedder", "input": t}) for t in embedded),
    )
    assert [r.status_code for r in replies] == [200] * len(replies), [r.text for r in replies]
    for (query, docs), reply in zip(queries, replies[: len(queries)], strict=True):
        for r in reply.json()["results"]:
            want = repository.reranker.cross_encoder_score(query, docs[r["index"]])
            assert r["relevance_score"] == pytest.approx(want, abs=TOLERANCE)
    for text, reply in zip(classified, replies[len(queries) :], strict=False):
        want = repository.sentiment.pipeline_scores(text)
        for r in reply.json():
            assert r["score"] == pytest.approx(want[r["label"]], abs=TOLERANCE)
    assert all(len(r.json()["data"][0]["embedding"]) > 0 for r in replies[-len(embedded) :])


def encoded(text: str) -> dict[str, torch.Tensor]:
    """One text as the export's tokenizer makes it, as torch tensors."""
    own = tokenizer()
    own.no_padding()
    own.enable_truncation(MAX_POSITIONS)
    e = own.encode(text)
    return {
        "input_ids": torch.tensor([e.ids]),
        "attention_mask": torch.tensor([e.attention_mask]),
        "token_type_ids": torch.tensor([e.type_ids]),
    }


@pytest.mark.parametrize("aggregation", ["none", "simple", "first", "average", "max"])
async def test_token_classification_as_the_pipeline_gives_it(
    client: httpx.AsyncClient, repository: Repository, aggregation: str
) -> None:
    """Every entity, label, score and span equals transformers' token-classification
    pipeline's for that text alone (`O` left out, as it leaves it out)."""
    assert "[token_classifier]" in repository.configs["tagger"]
    batch = [*texts(6, seed=8), "The zebra reads quixotic books"]
    answer = await client.post(
        "/classify_tokens", json={"inputs": batch, "aggregation": aggregation}
    )
    assert answer.status_code == 200, answer.text
    for text, found in zip(batch, answer.json(), strict=True):
        want = repository.tagger.entities(text, aggregation)
        assert len(found) == len(want), text
        for got, expected in zip(found, want, strict=True):
            assert got["score"] == pytest.approx(float(expected["score"]), abs=TOLERANCE)
            assert {k: v for k, v in got.items() if k != "score"} == {
                k: v.item() if isinstance(v, np.generic) else v
                for k, v in expected.items()
                if k != "score"
            }


async def test_sparse_weights_pool_the_masked_lm_as_splade(
    client: httpx.AsyncClient, repository: Repository
) -> None:
    """Each text's weights: the masked-LM's logits (transformers') pooled here, the max of
    log(1 + relu) over its tokens, the special tokens' entries dropped; and the top 5."""
    assert "[sparse]" in repository.configs["splade"]
    batch = texts(8, seed=6)
    answer = await client.post("/embed_sparse", json={"model": "splade", "inputs": batch})
    assert answer.status_code == 200, answer.text
    top = await client.post("/embed_sparse", json={"inputs": batch[0], "top_k": 5})
    special = [vocabulary()[t] for t in SPECIALS]
    for text, weights in zip(batch, answer.json(), strict=True):
        with torch.no_grad():
            logits = repository.splade(**encoded(text)).logits[0]
        want = torch.log1p(torch.relu(logits)).max(dim=0).values.numpy()
        want[special] = 0
        assert [w["index"] for w in weights] == np.flatnonzero(want > 0).tolist()
        got = np.array([w["value"] for w in weights])
        np.testing.assert_allclose(got, want[want > 0], atol=TOLERANCE, rtol=TOLERANCE)
    (five,) = top.json()
    largest = sorted(answer.json()[0], key=lambda w: -w["value"])[:5]
    assert five == sorted(largest, key=lambda w: w["index"])


async def test_the_cache_keeps_sparse_answers_not_the_logits_they_came_from(
    repository: Repository,
) -> None:
    """A head answers as its batch finishes, and the result cache keeps that answer: a text's
    few weights, not its [T, vocab] logits (the bytes the cache reports, keys and overhead
    included, are a fraction of the logits')."""
    engine = load_engine(Settings(models=repository.models))
    text = "the model read a long book about the river"
    async with serving(engine) as client:
        answer = await client.post("/embed_sparse", json={"model": "splade", "inputs": [text]})
        metrics = (await client.get("/metrics")).text
    assert answer.status_code == 200, answer.text
    kept = re.search(r'bucketserve_result_cache_bytes\{model="splade",version="1"\} (\S+)', metrics)
    assert kept is not None
    logits = len(encoded(text)["input_ids"][0]) * len(vocabulary()) * 4
    assert 0 < float(kept.group(1)) < logits / 4


async def test_embed_all_gives_one_vector_per_token(
    client: httpx.AsyncClient, repository: Repository
) -> None:
    """ColBERT-shaped, imported from PyLate's files: each token's projection, normalised; an
    embedder's per-token states as they are, cut to the text's own tokens."""
    config = tomllib.loads(repository.configs["colbert"])
    assert config["multi_vector"] == {"output": "token_vectors", "normalize": True}
    assert config["prompts"] == {"query": "[Q] ", "document": "[D] "}  # (PyLate's prefixes)
    batch = texts(6, seed=7)
    answer = await client.post("/embed_all", json={"model": "colbert", "inputs": batch})
    assert answer.status_code == 200, answer.text
    for text, vectors in zip(batch, answer.json(), strict=True):
        with torch.no_grad():
            want = torch.nn.functional.normalize(repository.colbert(**encoded(text))[0], dim=-1)
        np.testing.assert_allclose(np.array(vectors), want.numpy(), atol=TOLERANCE)
    states = await client.post("/embed_all", json={"model": "embedder", "inputs": "the cat"})
    (one,) = states.json()
    assert np.array(one).shape == (len(encoded("the cat")["input_ids"][0]), 32)


async def test_a_prompt_named_goes_before_each_text(
    client: httpx.AsyncClient, repository: Repository
) -> None:
    """sentence-transformers' prompts, imported: `prompt_name` puts the named one before each
    text, as if the client had written it; an unknown name is refused, naming the known."""
    assert '"query" = "query: "' in repository.configs["embedder"]
    batch = texts(4, seed=12)
    asked = {"model": "embedder", "input": batch, "prompt_name": "query"}
    prompted = await client.post("/v1/embeddings", json=asked)
    assert prompted.status_code == 200, prompted.text
    written = await client.post(
        "/v1/embeddings", json={"model": "embedder", "input": [f"query: {t}" for t in batch]}
    )
    assert prompted.json()["data"] == written.json()["data"]
    assert (
        prompted.json()["data"]
        != (await client.post("/v1/embeddings", json={"model": "embedder", "input": batch})).json()[
            "data"
        ]
    )
    unknown = await client.post("/v1/embeddings", json=asked | {"prompt_name": "nope"})
    assert unknown.status_code == 422
    assert "its prompts: passage, query" in error_of(unknown)[1]
    assert unknown.json()["error"]["param"] == "prompt_name"
    vectors = await client.post(
        "/embed_all", json={"model": "embedder", "inputs": "a", "prompt_name": "passage"}
    )
    (one,) = vectors.json()
    assert len(one) == len(encoded("passage: a")["input_ids"][0])


async def test_truncation_on_the_embeddings_and_predict_routes(client: httpx.AsyncClient) -> None:
    """A text longer than the model takes: cut at its end by default, at its start when asked
    (equal to the text's last words sent alone), refused with 422 when truncate is false."""
    words = (WORDS * 3)[: MAX_SEQ_LENGTH + 20]  # (one token each; 2 more for [CLS], [SEP])
    text, tail = " ".join(words), " ".join(words[-(MAX_SEQ_LENGTH - 2) :])
    body = {"model": "embedder", "input": text}

    async def vector(**fields: Any) -> list[float]:
        answer = await client.post("/v1/embeddings", json=body | fields)
        assert answer.status_code == 200, answer.text
        return answer.json()["data"][0]["embedding"]  # type: ignore[no-any-return]

    assert await vector(truncation_direction="left") == await vector(input=tail)
    assert await vector() != await vector(truncation_direction="left")
    for path, refused in [
        ("/v1/embeddings", body | {"truncate": False}),
        ("/predict", {"model": "embedder", "text": [text], "truncate": False}),
    ]:
        answer = await client.post(path, json=refused)
        assert answer.status_code == 422, answer.text
        assert "text 0: longer than the model takes (64 tokens)" in answer.text
    cut = await client.post(
        "/predict",
        json={"model": "embedder", "text": [text], "truncation_direction": "left"},
    )
    assert cut.status_code == 200, cut.text
    # KServe v2's text, cut as Triton's request parameters say
    v2 = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}
    path = "/v2/models/embedder/infer"
    refused = await client.post(path, json=v2 | {"parameters": {"truncate": False}})
    assert refused.status_code == 422, refused.text
    left = await client.post(path, json=v2 | {"parameters": {"truncation_direction": "left"}})
    assert left.status_code == 200, left.text
    (hidden,) = [o for o in left.json()["outputs"] if o["name"] == "last_hidden_state"]
    want = np.asarray(cut.json()["outputs"][0]["last_hidden_state"])
    np.testing.assert_allclose(np.reshape(hidden["data"], hidden["shape"])[0], want, atol=1e-6)


async def test_coheres_sdk_embeds_with_the_prompt_of_its_input_type(
    client: httpx.AsyncClient, repository: Repository
) -> None:
    """Cohere's embed, both clients of its SDK: `search_query` takes the model's `query`
    prompt, `search_document` its `passage` (no `document` prompt), as prompt_name would."""
    batch = texts(3, seed=13)

    async def named(prompt: str) -> list[list[float]]:
        body = {"model": "embedder", "input": batch, "prompt_name": prompt}
        answer = await client.post("/v1/embeddings", json=body)
        return [d["embedding"] for d in answer.json()["data"]]

    v1 = cohere.AsyncClient(api_key="unused", base_url="http://test", httpx_client=client)
    v2 = cohere.AsyncClientV2(api_key="unused", base_url="http://test", httpx_client=client)
    query = await v1.embed(model="embedder", texts=batch, input_type="search_query")
    np.testing.assert_allclose(query.embeddings, await named("query"), atol=1e-6)
    document = await v2.embed(
        model="embedder", texts=batch, input_type="search_document", embedding_types=["float"]
    )
    np.testing.assert_allclose(document.embeddings.float_, await named("passage"), atol=1e-6)
    assert document.meta.billed_units.input_tokens > 0


async def test_coheres_embedding_types_as_sentence_transformers_quantizes_them(
    client: httpx.AsyncClient,
) -> None:
    """Every embedding type through Cohere's SDK, each equal to sentence-transformers'
    `quantize_embeddings` of the float vectors (int8 and uint8 over the ranges the model's
    calibration found, which its config route reports); base64 as float32's bytes."""
    from sentence_transformers.util.quantization import quantize_embeddings

    batch = [*texts(7, seed=31), "a", " ".join(["bucket"] * 200)]
    v2 = cohere.AsyncClientV2(api_key="unused", base_url="http://test", httpx_client=client)
    kinds = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    got = await v2.embed(model="embedder", texts=batch, input_type="search_document",
                         embedding_types=kinds)  # fmt: skip
    floats = np.asarray(got.embeddings.float_, np.float32)
    config = (await client.get("/v2/models/embedder/config")).json()
    calibration = config["embedding_calibration"]
    assert (calibration["source"], calibration["texts"]) == ("generated", 256)
    ranges = np.asarray(calibration["ranges"], np.float32)
    for kind in ("int8", "uint8"):
        want = quantize_embeddings(floats, precision=kind, ranges=ranges)
        np.testing.assert_array_equal(getattr(got.embeddings, kind), want)
    for kind in ("binary", "ubinary"):
        np.testing.assert_array_equal(
            getattr(got.embeddings, kind), quantize_embeddings(floats, precision=kind)
        )
    decoded = [np.frombuffer(base64.b64decode(b), "<f4") for b in got.embeddings.base64]
    np.testing.assert_array_equal(decoded, floats)
    v1 = await client.post(
        "/v1/embed",
        json={
            "model": "embedder",
            "texts": batch,
            "embedding_types": ["ubinary"],
            "input_type": "search_document",
        },
    )
    assert v1.json()["response_type"] == "embeddings_by_type"
    assert v1.json()["embeddings"]["ubinary"] == got.embeddings.ubinary
    whole = Calibration(ranges[0], ranges[1], 256, "generated")
    with pytest.raises(InvalidInput, match="calibrated on the whole vector"):  # (a cut vector)
        quantized(floats[:, :16], EmbeddingType.INT8, whole)


async def test_tokenize_and_decode_with_the_models_tokenizer(client: httpx.AsyncClient) -> None:
    text = "The zebra reads"
    answer = await client.post("/tokenize", json={"model": "sentiment", "inputs": text})
    assert answer.status_code == 200, answer.text
    (tokens,) = answer.json()
    own = tokenizer()
    own.no_padding()
    made = own.encode(text)
    assert [t["id"] for t in tokens] == made.ids
    assert tokens[0] == {"id": made.ids[0], "text": "[CLS]", "special": True, "piece": "[CLS]"}
    first = {"id": made.ids[1], "text": "The", "special": False, "start": 0, "stop": 3}
    assert tokens[1] == first | {"piece": "the"}  # (the text it covers; its string, lowered)
    decoded = await client.post("/decode", json={"model": "sentiment", "ids": made.ids})
    assert decoded.json() == [own.decode(made.ids)]
    plain = await client.post(
        "/tokenize", json={"model": "sentiment", "inputs": [text], "add_special_tokens": False}
    )
    assert [t["id"] for t in plain.json()[0]] == own.encode(text, add_special_tokens=False).ids


LONG = " ".join(["bucket"] * (MAX_POSITIONS + 10))


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/v1/rerank", {"query": QUERY, "documents": []}, 400, "documents"),
        ("/v1/rerank", {"query": "", "documents": ["a"]}, 422, "query"),
        ("/v1/rerank", {"query": QUERY, "documents": ["a"] * 65}, 422, "too many sequences: 65"),
        ("/rerank", {"query": QUERY, "texts": ["a", LONG], "truncate": False}, 422,
         "text 1: longer than the model"),
        ("/v1/rerank", {"model": "sentiment", "query": QUERY, "documents": ["a"]}, 400,
         "does not rerank: its [classifier] names no rerank_label (it serves predict, classify, "
         "tokenize)"),
        ("/classify", {"model": "embedder", "inputs": "a"}, 400, "does not classify"),
        ("/classify", {"model": "sentiment", "inputs": [["a"], ["b", "c"]]}, 422, "not both"),
        ("/decode", {"model": "sentiment", "ids": [1, 10**6]}, 422, "is not a token id"),
    ],
    ids=["no-documents", "empty-query", "too-many", "too-long", "not-a-reranker",
         "not-a-classifier", "mixed", "foreign-id"],
)  # fmt: skip
async def test_bad_input_is_refused_in_the_routes_form(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], status: int, says: str
) -> None:
    answer = await client.post(path, json=body)
    assert answer.status_code == status, answer.text
    assert says in error_of(answer)[1]


EMPTY_TEXTS = [
    ("/embed", {"inputs": ""}),
    ("/embed", {"inputs": ["a", ""]}),
    ("/embed_all", {"model": "embedder", "inputs": [""]}),
    ("/embed_sparse", {"inputs": ""}),
    ("/similarity", {"inputs": {"source_sentence": "", "sentences": ["a"]}}),
    ("/rerank", {"query": "", "texts": ["a"]}),
    ("/rerank", {"query": QUERY, "texts": [""]}),
    ("/predict", {"model": "sentiment", "inputs": ""}),
    ("/predict", {"model": "embedder", "text": [""]}),
    ("/classify", {"model": "sentiment", "inputs": ["a", ""]}),
    ("/classify", {"model": "sentiment", "input": [""]}),
    ("/classify_tokens", {"inputs": ""}),
    ("/fill_mask", {"inputs": [""]}),
    ("/tokenize", {"inputs": ""}),
    ("/", {"model": "embedder", "inputs": ""}),
    ("/v1/embeddings", {"input": ""}),
    ("/v1/embeddings", {"input": ["a", ""]}),
    ("/embeddings", {"input": [""]}),
    ("/v1/embed", {"model": "embedder", "texts": [""]}),
    ("/v2/embed", {"model": "embedder", "texts": [""], "embedding_types": ["float"]}),
    ("/v1/rerank", {"query": QUERY, "documents": [""]}),
    ("/v2/rerank", {"query": QUERY, "documents": [{"text": ""}]}),
    ("/score", {"model": "reranker", "text_1": "", "text_2": ["a"]}),
    ("/v2/models/embedder/infer",
     {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [""]}]}),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body"), EMPTY_TEXTS)
async def test_an_empty_text_is_422_on_every_route(
    client: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> None:
    """As docs/apis.md says: a refused empty string has one status wherever it is sent, the
    route's own error form around it."""
    answer = await client.post(path, json=body)
    assert answer.status_code == 422, answer.text
    assert error_of(answer)[0] == "invalid_input"
    assert "empty" in error_of(answer)[1]


async def test_a_long_pair_is_cut_when_truncate_is_asked(
    client: httpx.AsyncClient, repository: Repository
) -> None:
    """Cut to the model's length, the longer text first, as transformers' truncation=True."""
    answer = await client.post(
        "/rerank", json={"query": QUERY, "texts": [LONG], "truncate": True, "raw_scores": True}
    )
    assert answer.status_code == 200, answer.text
    (only,) = answer.json()
    want = repository.reranker.logits(QUERY, LONG)[0]
    assert math.isclose(only["score"], float(want), abs_tol=TOLERANCE)


async def test_the_config_route_and_models_list_say_the_tasks(
    client: httpx.AsyncClient,
) -> None:
    listed = (await client.get("/v1/models")).json()["data"]
    tasks = {card["id"]: card["tasks"] for card in listed}
    assert tasks == {
        "colbert": ["predict", "embed_all", "tokenize"],
        "embedder": ["predict", "embed", "embed_all", "tokenize"],
        "reranker": ["predict", "classify", "rerank", "tokenize"],
        "sentiment": ["predict", "classify", "tokenize"],
        "splade": ["predict", "embed_sparse", "tokenize", "fill_mask"],
        "tagger": ["predict", "classify_tokens", "tokenize"],
    }
    for name, served in tasks.items():
        config = (await client.get(f"/v2/models/{name}/config")).json()
        assert config["tasks"] == served


def test_token_weights_keep_each_token_ids_largest_weight() -> None:
    """BGE-M3's sparse head: relu of each token's weight, the largest per id, special ids
    (here 0 and 2) and non-positive weights dropped; `top_k` keeps the largest, by index."""
    rule = SparseRule("weights", SparsePooling.TOKEN_WEIGHTS, special_ids=(0, 2))
    ids = np.array([2, 7, 5, 7, 9, 4, 0])
    weights = np.array([[0.9], [0.3], [-0.2], [0.8], [0.1], [0.4], [0.5]], np.float32)
    indices, values = rule.weights(weights, ids)
    assert indices.tolist() == [4, 7, 9]
    np.testing.assert_allclose(values, [0.4, 0.8, 0.1])
    indices, values = rule.weights(weights, ids, top_k=2)
    assert indices.tolist() == [4, 7]


async def test_a_forced_policys_warning_states_a_bound_rerank_traffic_keeps(
    repository: Repository, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An int8 cross-encoder (dynamic quantisation: a batch-wide scale) forced to length
    buckets: the check runs full batches of text pairs, and the figure its warning states
    bounds how far real rerank traffic, batched by length, moves each score from the model's
    own run of that pair alone."""
    export = tmp_path / "int8"
    shutil.copytree(repository.models.parent / "exports" / "reranker", export)
    (export / "model.onnx").unlink()
    for data in export.glob("*.data"):
        data.unlink()
    source = onnx.load(str(repository.models / "reranker" / "1" / "model.onnx"))
    onnx.save(zoo.quantized(source), str(export / "model.onnx"))
    models = tmp_path / "models"
    import_model(export, models, "int8")
    config = models / "int8" / "config.toml"
    config.write_text(config.read_text().replace("[batching]", '[batching]\npolicy = "buckets"'))
    with caplog.at_level(logging.WARNING):
        engine = load_engine(Settings(models=models))
    check = engine.model("int8").info.served_config["check"]
    bound = max(check["padding"], check["batching"])
    assert "batching.policy = 'buckets' is set" in caplog.text
    assert bound > 1e-3  # (int8: it moves, and says so)
    pairs = [(QUERY, d) for d in documents(48, seed=30)] + [
        (f"query {i}", " ".join(documents(4, seed=40 + i))) for i in range(16)
    ]
    async with serving(engine) as client:
        answers = await asyncio.gather(
            *(
                client.post("/rerank", json={"query": q, "texts": [d], "raw_scores": True})
                for q, d in pairs
            )
        )
    alone = side_session(GraphFile(models / "int8" / "1" / "model.onnx", ("CPUExecutionProvider",)))
    for (query, document), answer in zip(pairs, answers, strict=True):
        assert answer.status_code == 200, answer.text
        own = encoded_pair(query, document)
        want = float(alone.run(["logits"], own)[0][0, 0])
        got = np.array([answer.json()[0]["score"]], np.float32)
        assert difference(got, np.array([want], np.float32)) <= bound


def encoded_pair(query: str, document: str) -> dict[str, np.ndarray]:
    own = tokenizer()
    own.no_padding()
    own.enable_truncation(MAX_POSITIONS)
    e = own.encode(query, document)
    return {
        "input_ids": np.array([e.ids]),
        "attention_mask": np.array([e.attention_mask]),
        "token_type_ids": np.array([e.type_ids]),
    }


def _answers(path: str, reply: Any) -> int:
    """How many items a route's answer holds, in its own shape."""
    if path in ("/v1/embeddings",):
        return len(reply["data"])
    if path in ("/v1/embed", "/v2/embed"):
        vectors = reply["embeddings"]
        return len(vectors["float"] if isinstance(vectors, dict) else vectors)
    if path in ("/v1/rerank", "/v2/rerank"):
        return len(reply["results"])
    if path == "/predict":
        return len(reply["outputs"])
    if path.startswith("/v2/models/"):
        return int(reply["outputs"][0]["shape"][0])
    return len(reply)


ONE, TWO, THREE = ["the cat"], ["the cat", "a dog"], ["the cat", "a dog", "a red house"]
V2_TEXT = "/v2/models/embedder/infer"


def v2_texts(rows: list[list[str]]) -> dict[str, Any]:
    shape = [len(rows), len(rows[0])]
    data = [t for row in rows for t in row]
    return {"inputs": [{"name": "text", "shape": shape, "datatype": "BYTES", "data": data}]}


BODY_FORMS = [
    ("/v1/embeddings", {"model": "embedder", "input": "the cat"}, 1),
    ("/v1/embeddings", {"model": "embedder", "input": ONE}, 1),
    ("/v1/embeddings", {"model": "embedder", "input": TWO}, 2),
    ("/v1/embeddings", {"model": "embedder", "input": THREE}, 3),
    ("/v1/embed", {"model": "embedder", "texts": THREE}, 3),
    ("/v2/embed", {"model": "embedder", "texts": TWO, "embedding_types": ["float"]}, 2),
    ("/predict", {"model": "embedder", "text": THREE}, 3),
    ("/embed_all", {"model": "embedder", "inputs": "the cat"}, 1),
    ("/embed_all", {"model": "embedder", "inputs": TWO}, 2),
    ("/embed_sparse", {"inputs": "the cat"}, 1),
    ("/embed_sparse", {"inputs": THREE}, 3),
    ("/classify_tokens", {"inputs": "the cat"}, None),  # (one text: its entities, unnested)
    ("/classify_tokens", {"inputs": TWO}, 2),
    ("/rerank", {"query": QUERY, "texts": ONE}, 1),
    ("/rerank", {"query": QUERY, "texts": THREE}, 3),
    ("/v1/rerank", {"query": QUERY, "documents": TWO}, 2),
    ("/v2/rerank", {"query": QUERY, "documents": [{"text": t} for t in THREE]}, 3),
    ("/v1/rerank", {"query": QUERY, "documents": THREE, "top_n": 2}, 2),
    ("/classify", {"model": "sentiment", "inputs": "the cat"}, None),  # (one: unnested)
    ("/classify", {"model": "sentiment", "inputs": TWO}, None),  # (one pair: unnested)
    ("/classify", {"model": "sentiment", "inputs": ONE}, 1),
    ("/classify", {"model": "sentiment", "inputs": THREE}, 3),
    ("/classify", {"model": "sentiment", "inputs": [[t] for t in THREE]}, 3),
    ("/classify", {"model": "sentiment", "inputs": [TWO, TWO]}, 2),
    ("/tokenize", {"model": "sentiment", "inputs": "the cat"}, 1),
    ("/tokenize", {"model": "sentiment", "inputs": THREE}, 3),
    ("/decode", {"model": "sentiment", "ids": [5, 6]}, 1),
    ("/decode", {"model": "sentiment", "ids": [[5, 6], [7], [8, 9]]}, 3),
    (V2_TEXT, v2_texts([[t] for t in THREE]), 3),
    ("/v2/models/reranker/infer", v2_texts([[QUERY, t] for t in TWO]), 2),
]


async def test_every_body_form_gets_an_answer_for_each_item(client: httpx.AsyncClient) -> None:
    """Each route's body forms (a text, a list of one, two, three, pairs, objects), each
    answered with one result per item it holds: nothing dropped, nothing added. (Forms the
    routes refuse are in test_bad_input_is_refused_in_the_routes_form.)"""
    for path, body, items in BODY_FORMS:
        answer = await client.post(path, json=body)
        assert answer.status_code == 200, (path, body, answer.text)
        reply = answer.json()
        if items is None:  # one item answered unnested: a list of label scores, or entities
            assert isinstance(reply, list), (path, body)
            assert all(isinstance(r, dict) for r in reply), (path, body)
        else:
            assert _answers(path, reply) == items, (path, body)


async def test_a_drain_refuses_tokenize_and_decode_as_it_refuses_embeddings(
    repository: Repository, caplog: pytest.LogCaptureFixture
) -> None:
    """/tokenize and /decode are core calls like the rest: admitted before a drain (and
    counted in its tally), refused with 503 and Retry-After once it began, as /v1/embeddings
    is."""
    engine = load_engine(Settings(models=repository.models))
    with caplog.at_level(logging.INFO):
        async with serving(engine) as client:
            before = await client.post("/tokenize", json={"model": "sentiment", "inputs": "a"})
            await engine.drain()
            refused = [
                await client.post(path, json=body)
                for path, body in (
                    ("/v1/embeddings", {"model": "embedder", "input": "the cat"}),
                    ("/tokenize", {"model": "sentiment", "inputs": "the cat"}),
                    ("/decode", {"model": "sentiment", "ids": [5, 6]}),
                )
            ]
    assert before.status_code == 200, before.text
    for answer in refused:
        assert answer.status_code == 503, answer.text
        assert int(answer.headers["retry-after"]) >= 1
        assert "draining" in answer.text
    assert "1 requests admitted since start, 1 answered" in caplog.text


async def test_fill_mask_as_transformers_pipeline_gives_it(
    client: httpx.AsyncClient, repository: Repository
) -> None:
    """A masked LM (the SPLADE export) fills each [MASK] as transformers' fill-mask pipeline
    does for that text alone: the same tokens, scores, strings and filled texts; a text with
    two masks gets a list a mask; a text with none is refused naming it."""
    from transformers import PreTrainedTokenizerFast, pipeline

    own = tokenizer()
    own.no_padding()
    fast = PreTrainedTokenizerFast(tokenizer_object=own, pad_token="[PAD]", mask_token="[MASK]")
    fill = pipeline("fill-mask", model=repository.splade, tokenizer=fast)
    texts = ["the cat [MASK] a book", "a [MASK] river runs by the old [MASK]"]
    answer = await client.post("/fill_mask", json={"model": "splade", "inputs": texts, "top_k": 3})
    alone = await client.post("/fill_mask", json={"inputs": texts[0]})
    refused = await client.post("/fill_mask", json={"inputs": ["no mask here"]})
    assert answer.status_code == 200, answer.text
    for text, got in zip(texts, answer.json(), strict=True):
        want = fill(text, top_k=3)
        want = want if isinstance(want[0], list) else [want]
        got = got if isinstance(got[0], list) else [got]
        for guesses, expected in zip(got, want, strict=True):
            assert [g["token"] for g in guesses] == [e["token"] for e in expected]
            assert [g["token_str"] for g in guesses] == [e["token_str"] for e in expected]
            assert [g["sequence"] for g in guesses] == [e["sequence"] for e in expected]
            for g, e in zip(guesses, expected, strict=True):
                assert g["score"] == pytest.approx(e["score"], abs=TOLERANCE)
    assert len(alone.json()) == 5  # (no model named: the one model that fills masks; 5 best)
    assert [g["token"] for g in alone.json()[:3]] == [g["token"] for g in answer.json()[0]]
    assert refused.status_code == 422
    assert "text 0: no mask token to fill" in error_of(refused)[1]

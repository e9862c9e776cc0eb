"""The clients users point at text-embeddings-inference, Infinity, vLLM and Jina, driven
unchanged against a server process, each set up exactly as its own docs set it up for the
server it stands in for (a base URL, and nothing else), each answer against the reference
library on the same input alone: sentence-transformers for the real all-MiniLM-L6-v2,
transformers' model (CrossEncoder's score, the pipelines) for the task exports. And each
client's own error path reads the server's message.

Two servers: minilm (the default) with the cross-encoder, named as Jina's clients name their
default model; and the classifier (the default) with the tagger.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.exports import texts
from tests.helpers import server_process
from tests.task_exports import SENTIMENT
from tests.task_exports import TaskRepository as Repository

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    # LiteLLM keeps its HTTP clients' sockets open past the test
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # (no fetch of its price list)

TOLERANCE = 1e-5
QUERY = "where do the cats sleep"
JINA = "jina-reranker-v1-base-en"  # (JinaRerank's default model)


@pytest.fixture(autouse=True)
def hub_clients_reach_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's offline mode refuses every request of its client, a server's URL
    included: off for these tests, whose clients reach only their servers on 127.0.0.1
    (each model here is a local folder; nothing is downloaded)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def repository_of(root: Path, copies: dict[str, Path]) -> Path:
    for name, source in copies.items():
        shutil.copytree(source, root / name)
    return root


@pytest.fixture(scope="module")
def retrieval(
    task_repository: Repository, minilm_spec: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The URL of a server of minilm (the default) and the cross-encoder."""
    models = repository_of(
        tmp_path_factory.mktemp("clients-retrieval") / "models",
        {
            "minilm": minilm_spec.onnx_path.parent.parent,
            "reranker": task_repository.models / "reranker",
        },
    )
    flags = ("--default-model", "minilm", "--served-model-name", f"{JINA}=reranker")
    with server_process(models, *flags) as (_, url, _log):
        yield url


@pytest.fixture(scope="module")
def labels(task_repository: Repository, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a server of the classifier (the default) and the tagger."""
    models = repository_of(
        tmp_path_factory.mktemp("clients-labels") / "models",
        {name: task_repository.models / name for name in ("sentiment", "tagger")},
    )
    with server_process(models, "--default-model", "sentiment") as (_, url, _log):
        yield url


@pytest.fixture(scope="module")
def st_model() -> Any:
    from sentence_transformers import SentenceTransformer

    from modelgen.minilm import _model_source

    return SentenceTransformer(str(_model_source()), device="cpu")


BATCH = texts(5, seed=11)


# -- huggingface_hub --------------------------------------------------------------------------


def test_huggingface_hubs_inference_client(retrieval: str, labels: str, st_model: Any,
                                           task_repository: Repository) -> None:  # fmt: skip
    """InferenceClient with the server's URL as its model, as TEI's docs set it up: feature
    extraction (at the root and at /embed), sentence similarity, text and token
    classification (at /classify_tokens, and at the root with the task's parameters)."""
    from huggingface_hub import InferenceClient

    want = st_model.encode(BATCH[:1], normalize_embeddings=True)
    for url in (retrieval, f"{retrieval}/embed"):
        got = InferenceClient(model=url).feature_extraction(BATCH[0])
        np.testing.assert_allclose(np.asarray(got).reshape(1, -1), want, atol=TOLERANCE)
    similarity = InferenceClient(model=retrieval).sentence_similarity(BATCH[0], BATCH[1:])
    vectors = st_model.encode(BATCH, normalize_embeddings=True)
    np.testing.assert_allclose(similarity, vectors[1:] @ vectors[0], atol=TOLERANCE)

    text = "a fine day in the park"
    classified = InferenceClient(model=labels).text_classification(text, top_k=3)
    reference = task_repository.sentiment.pipeline_scores(text)
    assert {c.label for c in classified} == set(SENTIMENT)
    for element in classified:
        assert element.score == pytest.approx(reference[element.label], abs=TOLERANCE)
    tagger = InferenceClient(model=f"{labels}/classify_tokens")
    tagged = tagger.token_classification("Alice met Bob in Paris")
    wanted = task_repository.tagger.entities("Alice met Bob in Paris", "none")
    assert [(e.word, e.start, e.end) for e in tagged] == [
        (w["word"], w["start"], w["end"]) for w in wanted
    ]
    for element, w in zip(tagged, wanted, strict=True):
        assert element.score == pytest.approx(float(w["score"]), abs=TOLERANCE)
    # at the server's URL, whose default model classifies texts: the task's parameters say
    # it is token classification, answered by the tagger as one list for the one text
    grouped = InferenceClient(model=labels).token_classification(
        "Alice met Bob in Paris", aggregation_strategy="simple"
    )
    wanted = task_repository.tagger.entities("Alice met Bob in Paris", "simple")
    assert [(e.entity_group, e.word, e.start, e.end) for e in grouped] == [
        (w["entity_group"], w["word"], w["start"], w["end"]) for w in wanted
    ]
    for element, w in zip(grouped, wanted, strict=True):
        assert element.score == pytest.approx(float(w["score"]), abs=TOLERANCE)


# -- LlamaIndex -----------------------------------------------------------------------------


def test_llama_index_tei_embeddings_and_jina_rerank(
    retrieval: str, st_model: Any, task_repository: Repository
) -> None:
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference
    from llama_index.postprocessor.jinaai_rerank import JinaRerank

    embedder = TextEmbeddingsInference(model_name="minilm", base_url=retrieval)
    got = embedder.get_text_embedding_batch(BATCH)
    np.testing.assert_allclose(
        got, st_model.encode(BATCH, normalize_embeddings=True), atol=TOLERANCE
    )

    docs = texts(4, seed=12)
    nodes = [NodeWithScore(node=TextNode(text=d)) for d in docs]
    rerank = JinaRerank(base_url=f"{retrieval}/v1", api_key="unused", top_n=2)
    best = rerank.postprocess_nodes(nodes, QueryBundle(QUERY))
    scores = {d: task_repository.reranker.cross_encoder_score(QUERY, d) for d in docs}
    assert [n.node.get_content() for n in best] == sorted(docs, key=lambda d: -scores[d])[:2]
    for n in best:
        assert n.score == pytest.approx(scores[n.node.get_content()], abs=TOLERANCE)


# -- Haystack -------------------------------------------------------------------------------


def test_haystacks_tei_embedders_and_ranker(
    retrieval: str, st_model: Any, task_repository: Repository
) -> None:
    from haystack import Document
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceAPIDocumentEmbedder,
        HuggingFaceAPITextEmbedder,
    )
    from haystack_integrations.components.rankers.huggingface_api import HuggingFaceTEIRanker

    params = {"url": retrieval}
    text = HuggingFaceAPITextEmbedder(api_type="text_embeddings_inference", api_params=params)
    got = text.run(text=BATCH[0])["embedding"]
    # (normalize: false, Haystack's default, goes in HF's `parameters`, which TEI's /embed
    # and its root ignore: its vectors are normalised, TEI's default, and so are these)
    want = st_model.encode(BATCH, normalize_embeddings=True)
    np.testing.assert_allclose(got, want[0], atol=TOLERANCE)
    documents = HuggingFaceAPIDocumentEmbedder(
        api_type="text_embeddings_inference", api_params=params
    )
    embedded = documents.run(documents=[Document(content=t) for t in BATCH])["documents"]
    want = st_model.encode(BATCH, normalize_embeddings=True)
    np.testing.assert_allclose([d.embedding for d in embedded], want, atol=TOLERANCE)

    docs = texts(4, seed=13)
    ranker = HuggingFaceTEIRanker(url=retrieval, top_k=3)
    ranked = ranker.run(query=QUERY, documents=[Document(content=d) for d in docs])["documents"]
    scores = {d: task_repository.reranker.cross_encoder_score(QUERY, d) for d in docs}
    assert [d.content for d in ranked] == sorted(docs, key=lambda d: -scores[d])[:3]
    for d in ranked:
        assert d.score == pytest.approx(scores[d.content], abs=TOLERANCE)


# -- chromadb -------------------------------------------------------------------------------


def test_chromadbs_huggingface_embedding_server(retrieval: str, st_model: Any) -> None:
    from chromadb.utils.embedding_functions import HuggingFaceEmbeddingServer

    embed = HuggingFaceEmbeddingServer(url=f"{retrieval}/embed")
    got = embed(BATCH)
    np.testing.assert_allclose(
        np.asarray(got), st_model.encode(BATCH, normalize_embeddings=True), atol=TOLERANCE
    )


# -- LiteLLM --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "base"),
    [("huggingface", ""), ("hosted_vllm", "/v1"), ("infinity", "")],
)
def test_litellms_providers(
    retrieval: str, st_model: Any, task_repository: Repository, provider: str, base: str
) -> None:
    """LiteLLM's embeddings and rerank of TEI (`huggingface/`), vLLM (`hosted_vllm/`) and
    Infinity (`infinity/`), with the server's URL as each one's api_base."""
    import litellm

    api_base = retrieval + base
    # (huggingface/: the task named, as LiteLLM's docs do for an endpoint, else it asks the Hub)
    task = {"input_type": "feature-extraction"} if provider == "huggingface" else {}
    embedded = litellm.embedding(
        model=f"{provider}/minilm", input=BATCH, api_base=api_base, api_key="unused", **task
    )
    got = [item["embedding"] for item in embedded.data]
    np.testing.assert_allclose(
        got, st_model.encode(BATCH, normalize_embeddings=True), atol=TOLERANCE
    )

    docs = texts(4, seed=14)
    # (infinity/ reads each document as a text, as Infinity answers; vLLM's and Cohere's
    # answers, which /rerank gives a body of their shape, hold it as {text}: documented)
    documents = {"return_documents": False} if provider == "infinity" else {}
    ranked = litellm.rerank(
        model=f"{provider}/reranker", query=QUERY, documents=docs, top_n=2,
        api_base=retrieval, api_key="unused", **documents,
    )  # fmt: skip
    scores = [task_repository.reranker.cross_encoder_score(QUERY, d) for d in docs]
    best_first = sorted(range(len(docs)), key=lambda i: -scores[i])
    # (TEI's /rerank, huggingface/'s, answers every text: TEI ignores top_n)
    assert [r["index"] for r in ranked.results] == best_first[
        : 4 if provider == "huggingface" else 2
    ]
    for r in ranked.results:
        assert r["relevance_score"] == pytest.approx(scores[r["index"]], abs=TOLERANCE)


# -- infinity_client ------------------------------------------------------------------------


def test_infinity_client(
    retrieval: str, labels: str, st_model: Any, task_repository: Repository
) -> None:
    """Infinity's own generated client, its models left at its default name."""
    from infinity_client import Client
    from infinity_client.api.default import classify, embeddings, rerank
    from infinity_client.models import ClassifyInput, OpenAIEmbeddingInputText, RerankInput

    with Client(base_url=retrieval) as client:
        embedded = embeddings.sync(client=client, body=OpenAIEmbeddingInputText(input_=BATCH))
        docs = texts(4, seed=15)
        body = RerankInput(query=QUERY, documents=docs, return_documents=True)
        ranked = rerank.sync(client=client, body=body)
    assert embedded is not None
    got = [item.embedding for item in embedded.data]
    want = st_model.encode(BATCH, normalize_embeddings=True)
    np.testing.assert_allclose(got, want, atol=TOLERANCE)
    assert ranked is not None
    for r in ranked.results:
        assert r.document == docs[r.index]
        want = task_repository.reranker.cross_encoder_score(QUERY, docs[r.index])
        assert r.relevance_score == pytest.approx(want, abs=TOLERANCE)

    text = "a fine day in the park"
    with Client(base_url=labels) as client:
        classes = classify.sync(client=client, body=ClassifyInput(input_=[text]))
    assert classes is not None
    reference = task_repository.sentiment.pipeline_scores(text)
    for item in classes.data[0]:
        assert item.score == pytest.approx(reference[item.label], abs=TOLERANCE)


# -- each client family's error path --------------------------------------------------------


def test_each_clients_error_path_reads_the_servers_message(retrieval: str) -> None:
    """A request the server refuses, through each client family's own error handling: the
    server's message is what the client shows."""
    from huggingface_hub import InferenceClient
    from huggingface_hub.errors import HfHubHTTPError
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.postprocessor.jinaai_rerank import JinaRerank

    with pytest.raises(HfHubHTTPError, match="inputs: empty") as raised:
        InferenceClient(model=f"{retrieval}/embed").feature_extraction("")
    assert raised.value.response.status_code == 422  # (an empty text, on every route)

    nodes = [NodeWithScore(node=TextNode(text="a"))]
    unknown = JinaRerank(base_url=f"{retrieval}/v1", api_key="unused", model="no-such-model")
    with pytest.raises(Exception, match="unknown model 'no-such-model'"):
        unknown.postprocess_nodes(nodes, QueryBundle(QUERY))

    import openai

    sdk = openai.OpenAI(base_url=f"{retrieval}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        sdk.embeddings.create(model="minilm", input="a", dimensions=-1)

    import litellm

    with pytest.raises(Exception, match="unknown model 'no-such-model'"):
        litellm.rerank(model="hosted_vllm/no-such-model", query=QUERY, documents=["a"],
                       api_base=f"{retrieval}/v1", api_key="unused")  # fmt: skip
    with pytest.raises(Exception, match="text 0: empty"):
        litellm.embedding(model="infinity/minilm", input=[""], api_base=retrieval,
                          api_key="unused")  # fmt: skip


def test_more_clients_error_paths_read_the_servers_message(retrieval: str) -> None:
    """Haystack's TEI ranker (TEI's `error` and `error_type`), infinity_client (the body, when
    told to raise), Cohere's SDK (its `message`), LiteLLM's huggingface/ (the body): each
    shows the server's message for a request the server refuses."""
    import cohere
    from haystack import Document
    from haystack_integrations.components.rankers.huggingface_api import HuggingFaceTEIRanker
    from infinity_client import Client
    from infinity_client.api.default import rerank
    from infinity_client.errors import UnexpectedStatus
    from infinity_client.models import HTTPValidationError, RerankInput

    many = [Document(content=f"document {i}") for i in range(300)]
    with pytest.raises(RuntimeError, match="too many sequences: 300 > 256"):
        HuggingFaceTEIRanker(url=retrieval, max_retries=1).run(query=QUERY, documents=many)

    with Client(base_url=retrieval, raise_on_unexpected_status=True) as client:
        body = RerankInput(query=QUERY, documents=[f"document {i}" for i in range(300)])
        invalid = rerank.sync(client=client, body=body)  # (a 422 is its validation error)
        empty = rerank.sync(client=client, body=RerankInput(query="", documents=["a"]))
        with pytest.raises(UnexpectedStatus) as raised:
            rerank.sync(client=client, body=RerankInput(query=QUERY, documents=[]))
    assert isinstance(invalid, HTTPValidationError)
    assert invalid.additional_properties["error"] == "too many sequences: 300 > 256"
    assert isinstance(empty, HTTPValidationError)
    assert "query: empty" in empty.additional_properties["error"]
    assert raised.value.status_code == 400
    assert b"documents" in raised.value.content

    sdk = cohere.ClientV2(base_url=retrieval, api_key="unused")
    with pytest.raises(cohere.core.ApiError) as refused:
        sdk.rerank(model="rerank-v3.5", query=QUERY, documents=["a"])
    assert refused.value.status_code == 404
    assert "unknown model 'rerank-v3.5'" in refused.value.body["message"]

    import litellm

    with pytest.raises(Exception, match="too many sequences: 300 > 256"):
        litellm.rerank(model="huggingface/reranker", query=QUERY, api_base=retrieval,
                       documents=[f"d {i}" for i in range(300)], api_key="unused")  # fmt: skip

"""text-embeddings-inference's API as TEI serves it, beside ours on the task repository: its
routes (`/embed`, `/similarity`, `/info`, `/health`, the root), its defaults (`normalize`,
`--auto-truncate`), the bodies it shares a path with (its `/predict`, Cohere's `/rerank`),
Hugging Face's task parameters, and model names as the servers it stands in for treat them
(aliases; a name TEI would ignore). Each answer against the route it must equal, or the
reference (the differential suite draws the inputs for the exact ones)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from bucketserve.errors import ConfigError
from bucketserve.loading import load_engine
from bucketserve.settings import Settings
from tests.engines import serving
from tests.exports import texts
from tests.helpers import error_of
from tests.task_exports import MAX_POSITIONS, SENTIMENT
from tests.task_exports import TaskRepository as Repository

TOLERANCE = 1e-5
QUERY = "where do the cats sleep"
LONG = " ".join(["bucket"] * (MAX_POSITIONS + 10))

pytestmark = pytest.mark.timeout(600)


def settings(repository: Repository, **given: Any) -> Settings:
    return Settings(models=repository.models, default_model="embedder", **given)


@pytest.fixture
async def client(task_repository: Repository) -> AsyncIterator[httpx.AsyncClient]:
    engine = load_engine(settings(task_repository, served_model_name="rerank-v3.5=reranker"))
    async with serving(engine) as served:
        yield served


async def test_embed_answers_the_vectors_of_openais_route(client: httpx.AsyncClient) -> None:
    batch = texts(5, seed=2)
    tei = await client.post("/embed", json={"inputs": batch})
    assert tei.status_code == 200, tei.text
    openai = await client.post("/v1/embeddings", json={"model": "embedder", "input": batch})
    want = [item["embedding"] for item in openai.json()["data"]]
    np.testing.assert_allclose(tei.json(), want, atol=TOLERANCE)
    one = await client.post("/embed", json={"inputs": batch[0]})
    np.testing.assert_allclose(one.json(), want[:1], atol=TOLERANCE)  # (a batch of one)
    raw = await client.post("/embed", json={"inputs": batch, "normalize": False})
    vectors = np.array(raw.json())
    norms = np.linalg.norm(vectors, axis=1)
    assert not np.allclose(norms, 1)  # (the mean of the states, as it is)
    np.testing.assert_allclose(vectors / norms[:, None], want, atol=TOLERANCE)


async def test_embed_takes_the_models_own_token_ids(client: httpx.AsyncClient) -> None:
    tokens = await client.post("/tokenize", json={"inputs": ["the cat sat", "a dog"]})
    ids = [[t["id"] for t in text] for text in tokens.json()]
    by_ids = await client.post("/embed", json={"inputs": ids})
    by_text = await client.post("/embed", json={"inputs": ["the cat sat", "a dog"]})
    assert by_ids.status_code == 200, by_ids.text
    np.testing.assert_allclose(by_ids.json(), by_text.json(), atol=TOLERANCE)
    single = await client.post("/embed", json={"inputs": ids[1]})
    np.testing.assert_allclose(single.json(), by_text.json()[1:], atol=TOLERANCE)
    mixed = await client.post("/embed", json={"inputs": ["the cat", ids[1]]})
    assert mixed.status_code == 422
    assert "not both" in error_of(mixed)[1]


async def test_similarity_is_the_cosine_of_the_embeddings(client: httpx.AsyncClient) -> None:
    source, *others = texts(4, seed=3)
    body = {"inputs": {"source_sentence": source, "sentences": others}}
    answer = await client.post("/similarity", json=body)
    assert answer.status_code == 200, answer.text
    vectors = np.array((await client.post("/embed", json={"inputs": [source, *others]})).json())
    np.testing.assert_allclose(answer.json(), vectors[1:] @ vectors[0], atol=TOLERANCE)
    prompted = body | {"parameters": {"prompt_name": "query"}}
    with_prompt = await client.post("/similarity", json=prompted)
    assert with_prompt.status_code == 200
    assert not np.allclose(with_prompt.json(), answer.json())


async def test_info_describes_the_default_model_and_health_says_ready(
    client: httpx.AsyncClient,
) -> None:
    info = (await client.get("/info")).json()
    assert info["model_id"] == info["served_model_name"] == "embedder"
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 64  # (the embedder's config: its tokenizer's max_length)
    assert info["auto_truncate"] is True
    for path in ("/health", "/", "/ping"):
        healthy = await client.get(path)
        assert healthy.status_code == 200
        assert healthy.json()["unix"] > 0  # (Infinity's body; TEI's clients read the status)


async def test_a_drain_makes_health_say_so_in_teis_form(task_repository: Repository) -> None:
    engine = load_engine(settings(task_repository))
    async with serving(engine) as client:
        await engine.drain()
        unhealthy = await client.get("/health")
        refused = await client.post("/embed", json={"inputs": "a"})
    assert unhealthy.status_code == refused.status_code == 503
    assert unhealthy.json()["error_type"] == "Unhealthy"
    assert refused.json()["error_type"] == "Overloaded"  # (retry, on another replica)


@pytest.mark.parametrize(
    ("model", "body", "same_as"),
    [
        ("embedder", {"inputs": ["a cat", "a dog"]}, ("/embed", {})),
        ("splade", {"inputs": ["a cat"]}, ("/embed_sparse", {})),
        ("sentiment", {"inputs": "a fine day"}, ("/classify", {})),
        ("tagger", {"inputs": "Alice met Bob"}, ("/classify_tokens", {})),
        ("reranker", {"query": QUERY, "texts": ["a", "b"]}, ("/rerank", {})),
        ("embedder", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}, ("/similarity", {})),
    ],
    ids=["embed", "sparse", "classify", "tag", "rerank", "similarity"],
)
async def test_the_root_answers_the_models_own_task(
    client: httpx.AsyncClient, model: str, body: dict[str, Any], same_as: tuple[str, Any]
) -> None:
    """TEI's root (and SageMaker's /invocations): what huggingface_hub's InferenceClient and
    Haystack's TEI embedders post to a server's URL."""
    path, extra = same_as
    want = await client.post(path, json=body | {"model": model} | extra)
    assert want.status_code == 200, want.text
    for root in ("/", "/invocations"):
        answer = await client.post(root, json=body | {"model": model})
        assert answer.status_code == 200, answer.text
        assert answer.json() == want.json()
    default = await client.post("/", json={"inputs": "a cat"})  # (the default model: embedder)
    assert default.json() == (await client.post("/embed", json={"inputs": "a cat"})).json()
    for given in ({"aggregation_strategy": "simple"}, {"ignore_labels": []}, {"stride": 4}):
        # (huggingface_hub's token_classification: its parameters say the task)
        body = {"inputs": "Alice met Bob", "parameters": given}
        tagged = await client.post("/", json=body)
        alone = await client.post("/classify_tokens", json=body)
        assert tagged.status_code == 200, tagged.text
        assert tagged.json() == alone.json()
        assert all(isinstance(entity, dict) for entity in tagged.json())  # (one text: one list)
    colbert = await client.post("/", json={"model": "colbert", "inputs": "a"})
    assert colbert.status_code == 400
    assert "serves none of the tasks of the root" in error_of(colbert)[1]


async def test_shared_paths_tell_the_bodies_apart(client: httpx.AsyncClient) -> None:
    """/predict: ours or TEI's classification; /rerank: TEI's or Cohere's (vLLM's, Infinity's)."""
    tei = await client.post("/predict", json={"model": "sentiment", "inputs": "a fine day"})
    ours = await client.post("/classify", json={"model": "sentiment", "inputs": "a fine day"})
    assert tei.status_code == 200, tei.text
    assert tei.json() == ours.json()
    assert {r["label"] for r in tei.json()} == set(SENTIMENT)
    own = await client.post("/predict", json={"model": "sentiment", "text": ["a fine day"]})
    assert own.status_code == 200
    assert "outputs" in own.json()
    docs = texts(3, seed=4)
    cohere = await client.post("/rerank", json={"query": QUERY, "documents": docs, "top_n": 2})
    want = await client.post("/v1/rerank", json={"query": QUERY, "documents": docs, "top_n": 2})
    assert cohere.status_code == 200, cohere.text
    assert cohere.json()["results"] == want.json()["results"]
    all_of_them = await client.post("/v1/rerank", json={"query": QUERY, "documents": docs[:1],
                                                         "top_n": 2})  # fmt: skip
    assert len(all_of_them.json()["results"]) == 1  # (top_n past the documents: all, as Jina)


async def test_hugging_faces_task_parameters(client: httpx.AsyncClient) -> None:
    """huggingface_hub's text_classification and token_classification send the task API's
    `parameters`: honoured, and a single text's labels answered in a list of one, as the API
    answers them; a parameter not served (stride) is ignored and said."""
    plain = (await client.post("/classify", json={"model": "sentiment", "inputs": "fine"})).json()
    raw = (await client.post("/classify", json={"model": "sentiment", "inputs": "fine",
                                                "raw_scores": True})).json()  # fmt: skip
    body = {"model": "sentiment", "inputs": "fine"}
    asked = await client.post("/classify", json=body | {"parameters": {"top_k": 2}})
    assert asked.json() == [plain[:2]]
    logits = await client.post(
        "/classify", json=body | {"parameters": {"function_to_apply": "none"}}
    )
    assert logits.json() == [raw]
    tagged = await client.post(
        "/classify_tokens",
        json={
            "model": "tagger",
            "inputs": "Alice met Bob in Paris",
            "parameters": {"aggregation_strategy": "simple", "ignore_labels": [], "stride": 4},
        },
    )
    want = await client.post(
        "/classify_tokens",
        json={"model": "tagger", "inputs": "Alice met Bob in Paris", "aggregation": "simple",
              "ignore_labels": []},
    )  # fmt: skip
    assert tagged.status_code == 200, tagged.text
    assert tagged.json() == want.json()
    assert tagged.headers["x-ignored-fields"] == "'parameters.stride'"


async def test_a_name_teis_routes_ignore_goes_to_the_one_model_of_the_task(
    client: httpx.AsyncClient,
) -> None:
    """TEI serves one model and ignores the name a client sends (its own docs send
    `text-embeddings-inference`): on its routes an unknown name goes to the one model that
    serves the task, said in X-Model-Substituted; on Cohere's, it is a 404 naming none."""
    named = await client.post("/embed", json={"inputs": "a cat", "model": "embedder"})
    other = await client.post(
        "/embed", json={"inputs": "a cat", "model": "text-embeddings-inference"}
    )
    assert other.status_code == 200, other.text
    assert other.json() == named.json()
    assert other.headers["x-model-substituted"] == "'text-embeddings-inference' -> 'embedder'"
    assert "x-model-substituted" not in named.headers
    openai = await client.post("/v1/embeddings", json={"input": "a cat", "model": "tei"})
    assert openai.json()["model"] == "embedder"
    np.testing.assert_allclose(openai.json()["data"][0]["embedding"], named.json()[0])
    nameless = await client.post("/v1/embeddings", json={"input": "a cat"})
    assert nameless.json()["data"] == openai.json()["data"]
    unknown = await client.post(
        "/v1/rerank", json={"model": "rerank-english-v3.0", "query": QUERY, "documents": ["a"]}
    )
    assert unknown.status_code == 404
    several = await client.post("/embed_all", json={"inputs": "a", "model": "colbert-v2"})
    assert several.status_code == 404  # (colbert and embedder both do: which is not said)
    assert "2 serve embed_all: name one of colbert, embedder" in error_of(several)[1]


async def test_infinitys_fields_on_openais_route(client: httpx.AsyncClient) -> None:
    """infinity_client sends `dimensions: 0` (the whole vector) and `modality: text`."""
    body = {"model": "embedder", "input": ["a cat"]}
    whole = await client.post("/v1/embeddings", json=body)
    infinity = await client.post(
        "/v1/embeddings", json=body | {"dimensions": 0, "modality": "text"}
    )
    assert infinity.status_code == 200, infinity.text
    assert infinity.json()["data"] == whole.json()["data"]
    image = await client.post("/v1/embeddings", json=body | {"modality": "image"})
    assert image.status_code == 400


async def test_a_vendors_name_is_an_alias(client: httpx.AsyncClient) -> None:
    """--served-model-name rerank-v3.5=reranker: Cohere's SDKs' default name answers as the
    reranker, on every route and protocol, and is no substitution."""
    body = {"query": QUERY, "documents": ["a", "b"]}
    alias = await client.post("/v1/rerank", json=body | {"model": "rerank-v3.5"})
    named = await client.post("/v1/rerank", json=body | {"model": "reranker"})
    assert alias.status_code == 200, alias.text
    assert alias.json()["results"] == named.json()["results"]
    assert alias.json()["model"] == "reranker"
    assert "x-model-substituted" not in alias.headers
    ready = await client.get("/v2/models/rerank-v3.5/ready")
    assert ready.status_code == 200


def test_aliases_from_configs_and_clashes_refused(
    task_repository: Repository, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    shutil.copytree(task_repository.models, models)
    config = models / "reranker" / "config.toml"
    config.write_text(
        'aliases = ["rerank-v3.5", "jina-reranker-v1-base-en"]\n' + config.read_text()
    )
    engine = load_engine(Settings(models=models))
    assert engine.registry.aliases == {
        "rerank-v3.5": "reranker",
        "jina-reranker-v1-base-en": "reranker",
    }
    assert engine.model("jina-reranker-v1-base-en").name == "reranker"
    with pytest.raises(ConfigError, match=r"alias 'rerank-v3\.5' is claimed by models"):
        load_engine(Settings(models=models, served_model_name="rerank-v3.5=sentiment"))
    with pytest.raises(ConfigError, match="alias 'sentiment' is a model's name"):
        load_engine(Settings(models=models, served_model_name="sentiment=reranker"))
    with pytest.raises(ConfigError, match="no model 'nope' in the repository"):
        load_engine(Settings(models=models, served_model_name="x=nope"))
    two = "embed=embedder, rerank=reranker, embed=colbert"  # (one name, two models)
    with pytest.raises(ConfigError, match="'embed' is given to two models, embedder and colbert"):
        load_engine(Settings(models=models, served_model_name=two))


async def test_a_long_text_is_cut_unless_the_server_or_the_request_says_not(
    task_repository: Repository,
) -> None:
    """TEI's --auto-truncate: on by default, a request's `truncate` over it."""
    for auto in (True, False):
        engine = load_engine(settings(task_repository, auto_truncate=auto))
        async with serving(engine) as client:
            default = await client.post("/embed", json={"inputs": LONG})
            cut = await client.post("/embed", json={"inputs": LONG, "truncate": True})
            kept = await client.post("/embed", json={"inputs": LONG, "truncate": False})
            info = (await client.get("/info")).json()
        assert default.status_code == (200 if auto else 422), default.text
        assert cut.status_code == 200
        assert kept.status_code == 422
        assert "longer than the model" in error_of(kept)[1]
        assert info["auto_truncate"] is auto


async def test_info_of_a_classifier_names_its_labels(task_repository: Repository) -> None:
    """TEI's /info with a classifier the default model: its labels by their ids, as strings
    (a JSON object's keys; the id2label of integers answered 500)."""
    engine = load_engine(Settings(models=task_repository.models, default_model="sentiment"))
    async with serving(engine) as client:
        info = await client.get("/info")
    assert info.status_code == 200, info.text
    labels = info.json()["model_type"]["classifier"]
    assert labels["id2label"]["0"] == next(iter(labels["label2id"]))


async def test_vllms_score_is_the_rerank_or_the_cosine(client: httpx.AsyncClient) -> None:
    """vLLM's /score: a cross-encoder's relevance of each pair (as /v1/rerank scores it), or
    an embedding model's cosine (as /similarity); one against many, or pairwise."""
    docs = texts(3, seed=7)
    cohere = (await client.post("/v1/rerank", json={"query": QUERY, "documents": docs})).json()
    relevance = {r["index"]: r["relevance_score"] for r in cohere["results"]}
    for path in ("/score", "/v1/score"):
        scored = await client.post(
            path, json={"model": "reranker", "text_1": QUERY, "text_2": docs}
        )
        assert scored.status_code == 200, scored.text
        body = scored.json()
        assert (body["object"], body["model"]) == ("list", "reranker")
        assert [d["index"] for d in body["data"]] == [0, 1, 2]
        got = [d["score"] for d in body["data"]]
        np.testing.assert_allclose(got, [relevance[i] for i in range(3)], atol=TOLERANCE)
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    newer = await client.post("/score", json={"queries": [QUERY] * 3, "documents": docs})
    assert newer.status_code == 200, newer.text  # (pairwise; the one reranker by default)
    np.testing.assert_allclose([d["score"] for d in newer.json()["data"]],
                               [relevance[i] for i in range(3)], atol=TOLERANCE)  # fmt: skip
    cosine = await client.post(
        "/score", json={"model": "embedder", "text_1": "a", "text_2": ["b", "c"]}
    )
    sentences = {"source_sentence": "a", "sentences": ["b", "c"]}
    similar = await client.post("/similarity", json={"model": "embedder", "inputs": sentences})
    np.testing.assert_allclose([d["score"] for d in cosine.json()["data"]], similar.json(),
                               atol=TOLERANCE)  # fmt: skip
    uneven = await client.post("/score", json={"text_1": ["a", "b"], "text_2": docs})
    assert uneven.status_code == 422
    assert "send one text_1, or as many as text_2" in error_of(uneven)[1]
    assert "message" in uneven.json()  # (the hosted form: vLLM's clients read error.message)
    tagger = await client.post("/score", json={"model": "tagger", "text_1": "a", "text_2": "b"})
    assert tagger.status_code == 400
    assert "neither reranks nor embeds" in error_of(tagger)[1]


async def test_vllms_and_infinitys_classify(client: httpx.AsyncClient) -> None:
    """/classify with `input`: vLLM's answer (each text's label and probabilities in the
    labels' order), or Infinity's (a body with `raw_scores`: each label's score, best first);
    both the scores of our /classify."""
    batch = ["a fine day", "a dreadful day", "a day"]  # (three: two strings are a pair)
    ours = (await client.post("/classify", json={"model": "sentiment", "inputs": batch})).json()
    vllm = await client.post("/classify", json={"model": "sentiment", "input": batch})
    assert vllm.status_code == 200, vllm.text
    for item, want in zip(vllm.json()["data"], ours, strict=True):
        assert item["num_classes"] == len(SENTIMENT)
        by_label = {w["label"]: w["score"] for w in want}
        np.testing.assert_allclose(item["probs"], [by_label[label] for label in SENTIMENT],
                                   atol=TOLERANCE)  # fmt: skip
        assert item["label"] == want[0]["label"]
    logits = await client.post(
        "/classify", json={"model": "sentiment", "input": batch, "use_activation": False}
    )
    raw = await client.post("/classify", json={"model": "sentiment", "inputs": batch,
                                               "raw_scores": True})  # fmt: skip
    for item, want in zip(logits.json()["data"], raw.json(), strict=True):
        by_label = {w["label"]: w["score"] for w in want}
        np.testing.assert_allclose(item["probs"], [by_label[label] for label in SENTIMENT],
                                   atol=TOLERANCE)  # fmt: skip
    infinity = await client.post(
        "/classify", json={"model": "sentiment", "input": batch, "raw_scores": False}
    )
    assert infinity.status_code == 200, infinity.text
    assert infinity.json()["object"] == "classify"
    assert [[(x["label"], round(x["score"], 5)) for x in scores]
            for scores in infinity.json()["data"]] == [
        [(x["label"], round(x["score"], 5)) for x in scores] for scores in ours
    ]  # fmt: skip
    infinitys_default = {"model": "default/not-specified", "input": batch, "raw_scores": False}
    two = await client.post("/classify", json=infinitys_default)
    assert two.status_code == 404  # (the reranker classifies too: a name is needed)
    assert "2 serve classify: name one of reranker, sentiment" in error_of(two)[1]


async def test_infinitys_rerank_answers_documents_as_texts(client: httpx.AsyncClient) -> None:
    docs = texts(3, seed=8)
    body = {"query": QUERY, "documents": docs, "return_documents": True}
    cohere = (await client.post("/rerank", json=body)).json()
    infinity = (await client.post("/rerank", json=body | {"raw_scores": False})).json()
    assert [r["document"] for r in infinity["results"]] == [
        r["document"]["text"] for r in cohere["results"]
    ]
    assert infinity["usage"]["prompt_tokens"] == infinity["usage"]["total_tokens"] > 0
    raw = (await client.post("/rerank", json=body | {"raw_scores": True})).json()
    tei = await client.post("/rerank", json={"query": QUERY, "texts": docs, "raw_scores": True})
    assert [(r["index"], round(r["relevance_score"], 4)) for r in raw["results"]] == [
        (r["index"], round(r["score"], 4)) for r in tei.json()
    ]


async def test_openais_routes_at_the_root_as_tei_and_infinity_serve_them(
    client: httpx.AsyncClient,
) -> None:
    body = {"model": "default/not-specified", "input": ["a cat", "a dog"]}
    bare = await client.post("/embeddings", json=body)
    assert bare.status_code == 200, bare.text
    want = await client.post("/v1/embeddings", json=body | {"model": "embedder"})
    assert bare.json()["data"] == want.json()["data"]
    listed = (await client.get("/models")).json()
    assert listed == (await client.get("/v1/models")).json()


# Every field of each request schema in text-embeddings-inference's OpenAPI document, and
# of vLLM's pooling requests (its protocol's fields), on the route that serves it: answered,
# with the fields that server ignores too (TEI's `user`; vLLM's `priority` of its own
# scheduler, `add_special_tokens`) said in X-Ignored-Fields, never refused.
TEI_REQUESTS = [
    ("/embed", {"inputs": ["a cat"], "truncate": True, "truncation_direction": "Left",
                "prompt_name": "query", "normalize": True, "dimensions": 32}, ""),
    ("/embed_all", {"model": "embedder", "inputs": "a cat", "truncate": False,
                    "truncation_direction": "Right", "prompt_name": None}, ""),
    ("/embed_sparse", {"inputs": ["a cat"], "truncate": True,
                       "truncation_direction": "Right", "prompt_name": None}, ""),
    ("/predict", {"model": "sentiment", "inputs": [["a cat"], ["a dog"]], "raw_scores": True,
                  "truncate": True, "truncation_direction": "Left"}, ""),
    ("/rerank", {"query": "What is Deep Learning?", "texts": ["Deep Learning is ..."],
                 "raw_scores": False, "return_text": True, "truncate": True,
                 "truncation_direction": "Right"}, ""),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]},
                     "parameters": {"prompt_name": None, "truncate": True,
                                    "truncation_direction": "Right"}}, ""),
    ("/tokenize", {"inputs": ["a cat"], "add_special_tokens": True, "prompt_name": "query"}, ""),
    ("/decode", {"ids": [101, 102], "skip_special_tokens": True}, ""),
    ("/v1/embeddings", {"input": ["a cat"], "model": None, "encoding_format": "float",
                        "dimensions": None, "user": "someone"}, ""),
]  # fmt: skip
VLLM_REQUESTS = [
    ("/v1/embeddings", {"model": "embedder", "input": ["a cat"], "encoding_format": "float",
                        "dimensions": 32, "user": None, "truncate_prompt_tokens": -1,
                        "add_special_tokens": True, "priority": 0},
     "'add_special_tokens', 'priority'"),
    ("/score", {"model": "reranker", "text_1": "a", "text_2": ["b", "c"],
                "truncate_prompt_tokens": -1}, ""),
    ("/v1/score", {"model": "reranker", "queries": "a", "documents": ["b"]}, ""),
    ("/rerank", {"model": "reranker", "query": "a", "documents": ["b", "c"], "top_n": 1,
                 "truncate_prompt_tokens": -1}, ""),
    ("/v1/rerank", {"model": "reranker", "query": "a", "documents": ["b"]}, ""),
    ("/classify", {"model": "sentiment", "input": ["a cat"], "truncate_prompt_tokens": -1,
                   "priority": 0, "user": None, "request_id": "r1", "add_special_tokens": True,
                   "use_activation": False},
     "'add_special_tokens', 'priority', 'request_id', 'user'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "ignored"),
    [pytest.param(*r, id=f"tei {r[0]}") for r in TEI_REQUESTS]
    + [pytest.param(*r, id=f"vllm {r[0]}") for r in VLLM_REQUESTS],
)
async def test_every_field_of_teis_and_vllms_requests(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], ignored: str
) -> None:
    answer = await client.post(path, json=body)
    assert answer.status_code == 200, answer.text
    assert answer.headers.get("X-Ignored-Fields", "") == ignored


async def test_a_vllm_cut_shorter_than_the_model_is_refused(client: httpx.AsyncClient) -> None:
    """vLLM's `truncate_prompt_tokens` of a count would answer for a shorter text than this
    server ever cuts to: refused, never answered for the whole text."""
    body = {"model": "embedder", "input": ["a cat"], "truncate_prompt_tokens": 8}
    for path, form in (("/v1/embeddings", body), ("/score", {"text_1": "a", "text_2": "b"})):
        refused = await client.post(path, json=form | {"truncate_prompt_tokens": 8})
        assert refused.status_code == 400, refused.text
        assert "truncate_prompt_tokens" in error_of(refused)[1]


@pytest.mark.parametrize(
    ("inputs", "status", "said"),
    [
        ("", 422, "body: inputs: empty (a text holds at least one character)"),
        ([""], 422, "body: inputs.0: empty (a text holds at least one character)"),
        ([["0"]], 400, "body: inputs.0.0: Input should be a valid integer"),
        (5, 400, "body: inputs: Input should be a valid string or a valid list"),
    ],
)
async def test_a_refused_body_names_its_field_not_the_types_a_union_tried(
    client: httpx.AsyncClient, inputs: Any, status: int, said: str
) -> None:
    """A body that none of a field's forms takes is refused naming the field by its path in
    the body, the likeliest reason first (the branch that went deepest), never pydantic's
    names of the types it tried (what huggingface_hub shows its user). An empty text is
    invalid input (422), as on every route; a body of the wrong shape is malformed (400)."""
    refused = await client.post("/embed", json={"inputs": inputs})
    assert refused.status_code == status
    assert error_of(refused)[1] == said

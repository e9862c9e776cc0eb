"""OpenAI's embeddings API, through the `openai` SDK unchanged: texts and token ids in, floats
and base64 out, `dimensions` refused or honoured as the config says, errors in OpenAI's form,
and every embedding what /predict gives for the same input, pooled as the model's config says.

In process here (the SDK on an ASGI transport); over a real server process in the full tier.
"""

from __future__ import annotations

import base64
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from bucketserve.core.engine import Engine
from bucketserve.core.task import Task
from bucketserve.errors import ConfigError
from bucketserve.loading import load_engine
from bucketserve.loading.importer import import_model
from bucketserve.settings import Settings
from tests.engines import serving
from tests.exports import pooled_reference, texts, write_export
from tests.helpers import copy_bundled, server_process

openai = pytest.importorskip("openai")

ST = "st-mean"  # an imported sentence-transformers export: mean pooling, normalised
CUT = "st-cut"  # the same, with dimensions = [8, 16] in its config


def repository(root: Path) -> Path:
    models = root / "models"
    import_model(write_export(root / "export"), models, ST)
    entry = import_model(write_export(root / "export-cut"), models, CUT).entry
    config = (entry / "config.toml").read_text()
    (entry / "config.toml").write_text(
        config.replace("normalize = true", "normalize = true\ndimensions = [8, 16]")
    )
    copy_bundled(models, "tiny-encoder")  # token ids only; its graph pools and normalises
    copy_bundled(models, "tiny-lstm")  # no [embedding]: it does not embed
    return models


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return repository(tmp_path_factory.mktemp("openai"))


@pytest.fixture
async def served(models: Path) -> AsyncIterator[tuple[Any, httpx.AsyncClient, Engine]]:
    engine = load_engine(Settings(models=models, default_model="tiny-encoder"))
    async with serving(engine) as client:
        sdk = openai.AsyncOpenAI(
            base_url="http://test/v1", api_key="unused", http_client=client, max_retries=0
        )
        yield sdk, client, engine


async def predicted(client: httpx.AsyncClient, model: str, field: str, items: Any) -> Any:
    response = await client.post("/predict", json={"model": model, field: items})
    assert response.status_code == 200, response.text
    return response.json()["outputs"]


def decoded(item: Any) -> np.ndarray:
    if isinstance(item.embedding, str):
        return np.frombuffer(base64.b64decode(item.embedding), "<f4")
    return np.asarray(item.embedding, np.float32)


async def test_one_string_and_64_texts_equal_predict_pooled(served: Any) -> None:
    sdk, client, _ = served
    batch = texts(64, seed=3)
    one = await sdk.embeddings.create(model=ST, input="The model reads a long text.")
    many = await sdk.embeddings.create(model=ST, input=batch)  # the SDK asks for base64
    floats = await sdk.embeddings.create(model=ST, input=batch, encoding_format="float")
    assert [d.index for d in many.data] == list(range(64))
    assert many.model == ST
    assert many.object == "list"
    states = await predicted(client, ST, "text", ["The model reads a long text.", *batch])
    expected = [pooled_reference(s["last_hidden_state"], "mean", True) for s in states]
    np.testing.assert_allclose(decoded(one.data[0]), expected[0], atol=1e-6)
    for got, also, want in zip(many.data, floats.data, expected[1:], strict=True):
        assert isinstance(got.embedding, list)  # (the SDK decodes base64 into floats itself)
        np.testing.assert_allclose(decoded(got), want, atol=1e-6)
        np.testing.assert_array_equal(decoded(got), decoded(also))  # base64 == float, exactly
    lengths = [len(s["last_hidden_state"]) for s in states[1:]]
    assert len(set(lengths)) > 10  # mixed lengths, batched together
    assert many.usage.prompt_tokens == many.usage.total_tokens == sum(lengths)


async def test_base64_is_little_endian_float32(served: Any) -> None:
    _, client, _ = served
    body = {"model": ST, "input": ["a cat"], "encoding_format": "base64"}
    raw = (await client.post("/v1/embeddings", json=body)).json()["data"][0]["embedding"]
    floats = (await client.post("/v1/embeddings", json={**body, "encoding_format": "float"})).json()
    vector = np.frombuffer(base64.b64decode(raw), "<f4")
    assert vector.shape == (32,)
    np.testing.assert_array_equal(vector, np.asarray(floats["data"][0]["embedding"], np.float32))


async def test_token_ids_one_list_and_lists_equal_predict(served: Any) -> None:
    sdk, client, _ = served
    sequences = [[5, 9, 2, 44], [7, 1], [3] * 30]
    one = await sdk.embeddings.create(model="tiny-encoder", input=sequences[0])
    many = await sdk.embeddings.create(model="tiny-encoder", input=sequences)
    expected = await predicted(client, "tiny-encoder", "sequences", sequences)
    np.testing.assert_allclose(decoded(one.data[0]), expected[0]["sentence_embedding"], atol=1e-6)
    for got, want in zip(many.data, expected, strict=True):
        np.testing.assert_allclose(decoded(got), want["sentence_embedding"], atol=1e-6)
    assert many.usage.prompt_tokens == 36


async def test_dimensions_honoured_where_the_config_allows_them(served: Any) -> None:
    sdk, _, _ = served
    text = "a long river runs by the old house"
    full = decoded((await sdk.embeddings.create(model=CUT, input=text)).data[0])
    cut = decoded((await sdk.embeddings.create(model=CUT, input=text, dimensions=16)).data[0])
    assert cut.shape == (16,)
    np.testing.assert_allclose(cut, full[:16] / np.linalg.norm(full[:16]), atol=1e-6)
    same = await sdk.embeddings.create(model=CUT, input=text, dimensions=32)  # its own width
    np.testing.assert_array_equal(decoded(same.data[0]), full)
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        await sdk.embeddings.create(model=CUT, input=text, dimensions=12)
    assert refused.value.body["param"] == "dimensions"
    assert "[8, 16]" in refused.value.body["message"]
    with pytest.raises(openai.UnprocessableEntityError) as never:
        await sdk.embeddings.create(model=ST, input=text, dimensions=16)
    assert "cannot be shortened" in never.value.body["message"]


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"model": "nope", "input": "x"}, 404, "model_not_found", "model"),
        ({"model": "tiny-lstm", "input": [[1, 2]]}, 400, "task_not_served", "model"),
        ({"model": ST, "input": ""}, 422, "invalid_input", "input"),
        ({"model": ST, "input": ["fine", ""]}, 422, "invalid_input", "input"),
        ({"model": "tiny-encoder", "input": "text"}, 422, "invalid_input", "input"),
        ({"model": "tiny-encoder", "input": [[1, 99999]]}, 422, "invalid_input", "input"),
        ({"model": "tiny-encoder", "input": [[]]}, 400, "malformed", "input"),
        ({"model": ST, "input": []}, 400, "malformed", "input"),
        ({"model": ST, "input": ["a", 1]}, 400, "malformed", "input"),
        ({"model": ST, "input": [1.5]}, 400, "malformed", "input"),
        ({"model": ST, "input": [True]}, 400, "malformed", "input"),
        (
            {"model": ST, "input": "x", "encoding_format": "int8"},
            400,
            "malformed",
            "encoding_format",
        ),
        ({"model": ST, "input": "x", "dimensions": -1}, 400, "malformed", "dimensions"),
        ({"model": ST, "input": "x", "modality": "image"}, 400, "malformed", "modality"),
        ({"model": ST, "input": "x", "user": 7}, 400, "malformed", "user"),
    ],
)
async def test_errors_come_in_openais_form(
    served: Any, body: dict[str, Any], status: int, code: str, param: str
) -> None:
    _, client, _ = served
    response = await client.post("/v1/embeddings", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error == {
        "code": code,
        "message": error["message"],
        "type": "invalid_request_error",
        "param": param,
    }
    assert error["message"]


async def test_fields_the_servers_it_stands_in_for_ignore_are_ignored_and_said(
    served: Any,
) -> None:
    """TEI, vLLM and Infinity serve this route and ignore fields they do not take: so does
    this server, saying which in X-Ignored-Fields (escaped: a header holds any name sent)."""
    _, client, _ = served
    plain = await client.post("/v1/embeddings", json={"model": ST, "input": "x"})
    odd = {"temperature": 1, "add_special_tokens": True, "f\u00e9\n\u4e2d": 1}
    extra = await client.post("/v1/embeddings", json={"model": ST, "input": "x"} | odd)
    assert extra.status_code == 200, extra.text
    assert extra.json()["data"] == plain.json()["data"]
    said = "'add_special_tokens', 'f\\xe9\\n\\u4e2d', 'temperature'"
    assert extra.headers["x-ignored-fields"] == said
    assert "x-ignored-fields" not in plain.headers


async def test_a_body_that_is_not_json_or_too_large(served: Any) -> None:
    _, client, engine = served
    bad = await client.post("/v1/embeddings", content=b"{", headers={"content-type": JSON})
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"
    form = await client.post("/v1/embeddings", data={"model": ST})
    assert form.status_code == 415
    size = engine.settings.max_body_bytes
    large = await client.post("/v1/embeddings", json={"model": ST, "input": "a " * size})
    assert large.status_code == 413
    assert large.json()["error"]["param"] is None


JSON = "application/json"


async def test_overload_is_503_with_retry_after_in_openais_form(served: Any) -> None:
    sdk, client, engine = served
    await engine.drain()  # nothing in flight: it drains at once, and refuses from now on
    response = await client.post("/v1/embeddings", json={"model": ST, "input": "x"})
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1
    assert response.json()["error"]["type"] == "server_error"
    with pytest.raises(openai.InternalServerError):
        await sdk.embeddings.create(model=ST, input="x")


async def test_models_lists_those_that_embed_or_score(served: Any) -> None:
    sdk, client, _ = served
    listed = await sdk.models.list()
    assert sorted(m.id for m in listed.data) == sorted([ST, CUT, "tiny-encoder"])
    assert (await sdk.models.retrieve(ST)).id == ST
    with pytest.raises(openai.NotFoundError):
        await sdk.models.retrieve("nope")
    assert (await client.get("/v1/models/tiny-lstm")).status_code == 400


async def test_the_route_is_counted_like_the_others(served: Any) -> None:
    sdk, client, _ = served
    await sdk.embeddings.create(model=ST, input=["one", "two words"])
    metrics = (await client.get("/metrics")).text
    assert 'bucketserve_requests_total{route="/v1/embeddings",status="200"} 1.0' in metrics
    assert 'bucketserve_sequence_length_count{model="st-mean"} 2.0' in metrics


def answering(config: Path, kind: str) -> None:
    """The model's config, with `[embedding] answer_type = kind`."""
    text = config.read_text()
    config.write_text(text.replace("[embedding]\n", f'[embedding]\nanswer_type = "{kind}"\n'))


def typed_repository(root: Path, types: dict[str, str]) -> Path:
    """A repository of the imported export once per answer type: name -> type."""
    models = root / "models"
    export = write_export(root / "export")
    for name, kind in types.items():
        answering(import_model(export, models, name).entry / "config.toml", kind)
    return models


async def test_the_models_answer_type_is_what_the_embeddings_routes_answer(
    tmp_path: Path,
) -> None:
    """Infinity's --embedding-dtype, as a model's `[embedding] answer_type`: /v1/embeddings
    and /embeddings answer its integers (or their bytes in base64), each equal to
    sentence-transformers' `quantize_embeddings` of the model's floats (Cohere's, which still
    asks for its own types) over the ranges its config route reports."""
    from sentence_transformers.util.quantization import quantize_embeddings

    types = {"st-int8": "int8", "st-uint8": "uint8", "st-binary": "binary", "st-ubinary": "ubinary"}
    engine = load_engine(Settings(models=typed_repository(tmp_path, types)))
    batch = [*texts(9, seed=41), "a", " ".join(["bucket"] * 90)]
    async with serving(engine) as client:
        for name, kind in types.items():
            cohere = {"model": name, "texts": batch, "embedding_types": ["float"]}
            answer = await client.post("/v2/embed", json=cohere)
            floats = np.asarray(answer.json()["embeddings"]["float"], np.float32)
            config = (await client.get(f"/v2/models/{name}/config")).json()
            ranges = np.asarray(config["embedding_calibration"]["ranges"], np.float32)
            want = quantize_embeddings(floats, precision=kind, ranges=ranges)
            for path in ("/v1/embeddings", "/embeddings"):
                body = {"model": name, "input": batch, "encoding_format": "float"}
                numbers = (await client.post(path, json=body)).json()["data"]
                np.testing.assert_array_equal([d["embedding"] for d in numbers], want)
                assert all(isinstance(n, int) for n in numbers[0]["embedding"])
            body = {"model": name, "input": batch, "encoding_format": "base64"}
            packed = (await client.post("/v1/embeddings", json=body)).json()["data"]
            raw = [np.frombuffer(base64.b64decode(d["embedding"]), want.dtype) for d in packed]
            np.testing.assert_array_equal(raw, want)


def test_a_scaled_answer_type_needs_a_tokenizer_to_calibrate(tmp_path: Path) -> None:
    """int8 on a model that takes token ids only (no texts to fit its ranges on) is refused
    at load, naming the field and the types it may answer, not refused on every request."""
    models = tmp_path / "models"
    copy_bundled(models, "tiny-encoder")
    answering(models / "tiny-encoder" / "config.toml", "int8")
    with pytest.raises(ConfigError, match=r"answer_type: int8 scales .* answer float, binary"):
        load_engine(Settings(models=models))
    shutil.rmtree(models / "tiny-encoder")
    answering(copy_bundled(models, "tiny-encoder") / "config.toml", "ubinary")  # (no ranges)
    rule = load_engine(Settings(models=models)).model("tiny-encoder").info.rule(Task.EMBED)
    assert rule.answer_type == "ubinary"


# -- the full tier: the SDK over a real socket, and the real all-MiniLM-L6-v2 -----------------


@pytest.fixture(scope="module")
def server(models: Path) -> Iterator[str]:
    with server_process(models, "--default-model", "tiny-encoder") as (_, url, _log):
        yield url


@pytest.mark.slow
def test_the_sdk_against_a_server_process(server: str) -> None:
    sdk = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    batch = texts(64, seed=5)
    many = sdk.embeddings.create(model=ST, input=batch)
    states = httpx.post(f"{server}/predict", json={"model": ST, "text": batch}).json()["outputs"]
    for got, state in zip(many.data, states, strict=True):
        want = pooled_reference(state["last_hidden_state"], "mean", True)
        np.testing.assert_allclose(got.embedding, want, atol=1e-6)
    ids = sdk.embeddings.create(model="tiny-encoder", input=[[5, 6, 7], [8] * 20])
    assert len(ids.data) == 2
    cut = sdk.embeddings.create(model=CUT, input="x", dimensions=8, encoding_format="float")
    assert len(cut.data[0].embedding) == 8
    with pytest.raises(openai.UnprocessableEntityError):
        sdk.embeddings.create(model=ST, input="x", dimensions=8)


@pytest.mark.slow
async def test_minilm_embeddings_equal_predict_and_the_model_alone(
    minilm_spec: Any, tmp_path: Path
) -> None:
    from tests.engines import Reference

    models = tmp_path / "models"
    copy_bundled(models, "minilm")
    engine = load_engine(Settings(models=models))
    batch = [*texts(16, seed=1), "A man is eating food.", "The new movie is awesome."]
    async with serving(engine) as client:
        sdk = openai.AsyncOpenAI(base_url="http://test/v1", api_key="k", http_client=client)
        answer = await sdk.embeddings.create(model="minilm", input=batch)
        expected = await predicted(client, "minilm", "text", batch)
    reference = Reference(minilm_spec)
    model = engine.model("minilm")
    for got, want, ids in zip(answer.data, expected, model.encode(batch), strict=True):
        np.testing.assert_allclose(decoded(got), want["sentence_embedding"], atol=1e-6)
        np.testing.assert_allclose(decoded(got), reference(ids)["sentence_embedding"], atol=1e-5)


async def test_token_ids_for_a_model_that_takes_text_are_refused_with_the_fix(
    served: Any, models: Path
) -> None:
    """LangChain's OpenAIEmbeddings, by default, tokenises with OpenAI's tokenizer and sends
    those ids: a text model would read them as other tokens and answer 200 with a wrong
    vector. So ids for a model with a tokenizer are refused, naming the fix; a model without
    one takes ids (the only thing it takes), and `--openai-token-ids` says the ids are the
    model's own."""
    _, client, _ = served
    langchain = {"model": ST, "input": [[15339, 1917]], "encoding_format": "base64"}
    refused = await client.post("/v1/embeddings", json=langchain)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["param"] == "input"
    assert "check_embedding_ctx_length=False" in error["message"]
    assert "--openai-token-ids" in error["message"]
    text_to_ids = await client.post("/v1/embeddings", json={"model": "tiny-encoder", "input": "hi"})
    assert "takes token ids (or features), not text" in text_to_ids.json()["error"]["message"]

    engine = load_engine(Settings(models=models, openai_token_ids=True))
    async with serving(engine) as own:
        model = engine.model(ST)
        tokens = [int(t) for t in model.encode(["a short text"])[0]]
        answer = await own.post("/v1/embeddings", json={"model": ST, "input": [tokens]})
        by_text = await own.post("/v1/embeddings", json={"model": ST, "input": "a short text"})
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(
        answer.json()["data"][0]["embedding"], by_text.json()["data"][0]["embedding"], atol=1e-6
    )

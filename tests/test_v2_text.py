"""Text over KServe v2: a BYTES input `text`, as JSON strings or the binary extension's
length-prefixed elements, tokenised as /predict's `text` is: the same answers, and the same
errors for bad UTF-8, empty strings and over-long texts. (tritonclient over HTTP and gRPC, in
the full tier: tests/test_triton_client.py, tests/test_grpc.py.)"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from bucketserve.loading import load_engine
from bucketserve.settings import Settings
from tests.engines import serving
from tests.exports import texts
from tests.helpers import error_of

TEXTS = [*texts(5, seed=9), "héllo wörld ✓", "word " * 300]  # (the last one is truncated)
INFER = "/v2/models/st/infer"


def length_prefixed(strings: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(s)) + s for s in strings)


@pytest.fixture(scope="module")
def models(repository: Callable[..., Path]) -> Path:
    return repository("st", "tiny-encoder")  # (text in; token ids only)


@pytest.fixture
async def client(models: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(load_engine(Settings(models=models))) as client:
        yield client


async def predicted(client: httpx.AsyncClient, batch: list[str]) -> list[dict[str, Any]]:
    response = await client.post("/predict", json={"model": "st", "text": batch})
    assert response.status_code == 200, response.text
    outputs: list[dict[str, Any]] = response.json()["outputs"]
    return outputs


def text_tensor(batch: list[str], shape: list[int] | None = None) -> dict[str, Any]:
    return {"name": "text", "datatype": "BYTES", "shape": shape or [len(batch)], "data": batch}


async def binary_infer(client: httpx.AsyncClient, raw: bytes, shape: list[int]) -> httpx.Response:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "datatype": "BYTES",
                    "shape": shape,
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    )
    return await client.post(
        INFER,
        content=header + raw,
        headers={
            "content-type": "application/octet-stream",
            "inference-header-content-length": str(len(header)),
        },
    )


def assert_same(response: httpx.Response, expected: list[dict[str, Any]]) -> None:
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    states = outputs["last_hidden_state"]
    rows = np.asarray(states["data"], np.float32).reshape(states["shape"])
    longest = max(len(e["last_hidden_state"]) for e in expected)
    assert states["shape"] == [len(expected), longest, 32]  # padded to the longest text
    for row, want in zip(rows, expected, strict=True):
        steps = np.asarray(want["last_hidden_state"])
        np.testing.assert_allclose(row[: len(steps)], steps, atol=1e-6)
        assert not row[len(steps) :].any()  # zeros past each text's own tokens


async def test_json_strings_answer_as_predict_text(client: httpx.AsyncClient) -> None:
    expected = await predicted(client, TEXTS)
    assert len(expected[-1]["last_hidden_state"]) == 64  # truncated, as /predict truncates
    flat = await client.post(INFER, json={"inputs": [text_tensor(TEXTS)]})
    assert_same(flat, expected)
    nested = [[t] for t in TEXTS]  # [n, 1], as Triton's string inputs often are
    column = await client.post(INFER, json={"inputs": [text_tensor(nested, [len(TEXTS), 1])]})
    assert_same(column, expected)


async def test_binary_elements_answer_as_predict_text(client: httpx.AsyncClient) -> None:
    expected = await predicted(client, TEXTS)
    raw = length_prefixed([t.encode() for t in TEXTS])
    assert_same(await binary_infer(client, raw, [len(TEXTS)]), expected)


async def test_metadata_lists_text_for_models_with_a_tokenizer(client: httpx.AsyncClient) -> None:
    st = (await client.get("/v2/models/st")).json()["inputs"]
    assert {"name": "text", "datatype": "BYTES", "shape": [-1]} in st
    ids_only = (await client.get("/v2/models/tiny-encoder")).json()["inputs"]
    assert "text" not in [i["name"] for i in ids_only]


async def test_the_same_errors_as_predict(client: httpx.AsyncClient) -> None:
    empty = await client.post(INFER, json={"inputs": [text_tensor(["fine", ""])]})
    on_predict = await client.post("/predict", json={"model": "st", "text": ["fine", ""]})
    assert empty.status_code == on_predict.status_code == 422
    assert error_of(empty) == error_of(on_predict)  # (each in its protocol's form)
    bad = await binary_infer(client, length_prefixed([b"ok", b"\xff\xfe"]), [2])
    assert bad.status_code == 400  # as a body that is not UTF-8 is on /predict
    assert "element 1 is not valid UTF-8" in error_of(bad)[1]
    not_json = await client.post(
        "/predict", content=b'{"text": ["\xff"]}', headers={"content-type": "application/json"}
    )
    assert not_json.status_code == 400


@pytest.mark.parametrize(
    ("inputs", "says"),
    [
        ([text_tensor(["a", "b"], [2, 2])], "[n] or [n, 1]"),
        ([text_tensor(["a", "b"], [3])], "2 texts for shape [3]"),
        ([text_tensor([], [0])], "empty"),
        ([text_tensor(["a", 5])], "element 1 is not a string"),
        ([{**text_tensor(["a"]), "datatype": "INT64"}], "texts are sent as BYTES"),
        (
            [
                text_tensor(["a"]),
                {"name": "input_ids", "datatype": "INT64", "shape": [1, 1], "data": [5]},
            ],
            "send it alone",
        ),
        (
            [{"name": "input_ids", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
            "BYTES is for texts",
        ),
    ],
)
async def test_refused_text_tensors(
    client: httpx.AsyncClient, inputs: list[dict[str, Any]], says: str
) -> None:
    response = await client.post(INFER, json={"inputs": inputs})
    assert response.status_code == 422, response.text
    assert says in error_of(response)[1]


async def test_broken_framing_and_a_model_without_tokenizer(client: httpx.AsyncClient) -> None:
    short = await binary_infer(client, struct.pack("<I", 10) + b"abc", [1])
    assert short.status_code == 400
    assert "runs past the end" in error_of(short)[1]
    cut = await binary_infer(client, length_prefixed([b"ok"]) + b"\x01", [2])
    assert cut.status_code == 400
    ids_only = await client.post(
        "/v2/models/tiny-encoder/infer", json={"inputs": [text_tensor(["hello"])]}
    )
    assert ids_only.status_code == 422
    assert "has no tokenizer: send input_ids" in error_of(ids_only)[1]

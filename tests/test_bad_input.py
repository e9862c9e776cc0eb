"""Bad input of every kind: the right status and error code, never a 500, and the server is
still alive and exact afterwards."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from tests.helpers import make_engine, serving
from tests.zoo import add_to

LIMIT = 64 * 1024


def v2(inputs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"inputs": inputs, **extra}


def ids(
    shape: list[int], data: list[Any], name: str = "input_ids", dtype: str = "INT64"
) -> dict[str, Any]:
    return {"name": name, "shape": shape, "datatype": dtype, "data": data}


def binary(
    header: dict[str, Any], payload: bytes, header_length: int | None = None
) -> tuple[bytes, dict[str, str]]:
    head = orjson.dumps(header)
    return head + payload, {"Inference-Header-Content-Length": str(header_length or len(head))}


NAN_FEATURES = binary(
    v2(
        [
            {
                "name": "features",
                "shape": [1, 2, 16],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 128},
            }
        ]
    ),
    struct.pack("<32f", *([0.5] * 31 + [float("nan")])),
)
SHORT_BINARY = binary(
    v2(
        [
            {
                "name": "input_ids",
                "shape": [1, 4],
                "datatype": "INT64",
                "parameters": {"binary_data_size": 32},
            }
        ]
    ),
    b"\0" * 16,
)

# (case id, method, path, body (bytes | JSON | None), headers, status, code)
CASES: list[tuple[str, str, str, Any, dict[str, str], int, str]] = [
    ("not-json", "POST", "/predict", b"{bad", {}, 400, "malformed"),
    ("empty-body", "POST", "/predict", b"", {}, 400, "malformed"),
    ("json-array", "POST", "/predict", [1, 2], {}, 400, "malformed"),
    ("json-string", "POST", "/predict", "text", {}, 400, "malformed"),
    (
        "unknown-output",
        "POST",
        "/predict",
        {"sequences": [[1]], "outputs": ["logits"]},
        {},
        422,
        "invalid_input",
    ),
    (
        "outputs-not-list",
        "POST",
        "/predict",
        {"sequences": [[1]], "outputs": "x"},
        {},
        422,
        "invalid_input",
    ),
    (
        "outputs-empty",
        "POST",
        "/predict",
        {"sequences": [[1]], "outputs": []},
        {},
        422,
        "invalid_input",
    ),
    ("nan-literal", "POST", "/predict", b'{"sequences": [[NaN]]}', {}, 400, "malformed"),
    (
        "nested-too-deep",
        "POST",
        "/predict",
        b'{"sequences": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        {},
        400,
        "malformed",
    ),
    (
        "unknown-field",
        "POST",
        "/predict",
        {"sequences": [[1]], "temperature": 1},
        {},
        422,
        "invalid_input",
    ),
    (
        "model-not-string",
        "POST",
        "/predict",
        {"model": 5, "sequences": [[1]]},
        {},
        422,
        "invalid_input",
    ),
    (
        "unknown-model",
        "POST",
        "/predict",
        {"model": "gpt", "sequences": [[1]]},
        {},
        404,
        "model_not_found",
    ),
    (
        "both-fields",
        "POST",
        "/predict",
        {"sequences": [[1]], "text": ["a"]},
        {},
        422,
        "invalid_input",
    ),
    ("no-field", "POST", "/predict", {"model": "tiny-encoder"}, {}, 422, "invalid_input"),
    ("sequences-not-list", "POST", "/predict", {"sequences": "1 2 3"}, {}, 422, "invalid_input"),
    ("no-sequences", "POST", "/predict", {"sequences": []}, {}, 422, "invalid_input"),
    ("empty-sequence", "POST", "/predict", {"sequences": [[1], []]}, {}, 422, "invalid_input"),
    ("float-token", "POST", "/predict", {"sequences": [[1.5, 2]]}, {}, 422, "invalid_input"),
    ("string-token", "POST", "/predict", {"sequences": [["a", "b"]]}, {}, 422, "invalid_input"),
    ("bool-token", "POST", "/predict", {"sequences": [[True, False]]}, {}, 422, "invalid_input"),
    ("negative-token", "POST", "/predict", {"sequences": [[-1, 2]]}, {}, 422, "invalid_input"),
    ("token-past-vocab", "POST", "/predict", {"sequences": [[1, 2000]]}, {}, 422, "invalid_input"),
    (
        "huge-int-token",
        "POST",
        "/predict",
        b'{"sequences": [[1180591620717411303424]]}',
        {},
        422,
        "invalid_input",
    ),
    ("ragged-sequence", "POST", "/predict", {"sequences": [[1, [2, 3]]]}, {}, 422, "invalid_input"),
    ("too-long", "POST", "/predict", {"sequences": [[1] * 257]}, {}, 422, "invalid_input"),
    ("too-many-sequences", "POST", "/predict", {"sequences": [[1]] * 65}, {}, 422, "invalid_input"),
    ("text-without-tokenizer", "POST", "/predict", {"text": ["hello"]}, {}, 422, "invalid_input"),
    (
        "text-not-strings",
        "POST",
        "/predict",
        {"model": "tiny-encoder", "text": [1]},
        {},
        422,
        "invalid_input",
    ),
    (
        "features-wrong-width",
        "POST",
        "/predict",
        {"model": "tiny-lstm", "sequences": [[[0.5] * 15]]},
        {},
        422,
        "invalid_input",
    ),
    (
        "features-as-tokens",
        "POST",
        "/predict",
        {"model": "tiny-lstm", "sequences": [[1, 2, 3]]},
        {},
        422,
        "invalid_input",
    ),
    # JSON has no NaN or infinity: an overflowing number is refused by the parser itself
    (
        "infinite-feature",
        "POST",
        "/predict",
        b'{"model": "tiny-lstm", "sequences": [[' + b",".join([b"1e999"] * 16) + b"]]}",
        {},
        400,
        "malformed",
    ),
    (
        "body-too-large",
        "POST",
        "/predict",
        {"sequences": [[1] * 200] * 200},
        {},
        413,
        "payload_too_large",
    ),
    (
        "timeout-not-number",
        "POST",
        "/predict",
        {"sequences": [[1]]},
        {"X-Request-Timeout-Ms": "soon"},
        400,
        "malformed",
    ),
    (
        "timeout-negative",
        "POST",
        "/predict",
        {"sequences": [[1]]},
        {"X-Request-Timeout-Ms": "-5"},
        400,
        "malformed",
    ),
    (
        "compressed-body",
        "POST",
        "/predict",
        {"sequences": [[1]]},
        {"Content-Encoding": "gzip"},
        400,
        "malformed",
    ),
    (
        "v2-unknown-model",
        "POST",
        "/v2/models/gpt/infer",
        v2([ids([1, 1], [1])]),
        {},
        404,
        "model_not_found",
    ),
    (
        "v2-unknown-version",
        "POST",
        "/v2/models/tiny-encoder/versions/7/infer",
        v2([ids([1, 1], [1])]),
        {},
        404,
        "model_not_found",
    ),
    (
        "v2-wrong-rank",
        "POST",
        "/v2/models/tiny-encoder/infer",
        v2([ids([3], [1, 2, 3])]),
        {},
        422,
        "invalid_input",
    ),
    (
        "v2-bytes-datatype",
        "POST",
        "/v2/models/tiny-encoder/infer",
        v2([ids([1, 1], ["a"], dtype="BYTES")]),
        {},
        422,
        "invalid_input",
    ),
    (
        "v2-count-mismatch",
        "POST",
        "/v2/models/tiny-encoder/infer",
        v2([ids([2, 3], [1, 2])]),
        {},
        400,
        "malformed",
    ),
    (
        "v2-no-inputs",
        "POST",
        "/v2/models/tiny-encoder/infer",
        {"outputs": []},
        {},
        400,
        "malformed",
    ),
    (
        "v2-missing-sequence-input",
        "POST",
        "/v2/models/tiny-encoder/infer",
        v2([ids([1, 2], [1, 1], name="attention_mask")]),
        {},
        422,
        "invalid_input",
    ),
    (
        "v2-unknown-input",
        "POST",
        "/v2/models/tiny-encoder/infer",
        v2([ids([1, 2], [1, 1]), ids([1, 2], [1, 1], name="position_ids")]),
        {},
        422,
        "invalid_input",
    ),
    (
        "v2-mask-not-prefix",
        "POST",
        "/v2/models/tiny-encoder/infer",
        v2([ids([1, 3], [1, 2, 3]), ids([1, 3], [1, 0, 1], name="attention_mask")]),
        {},
        422,
        "invalid_input",
    ),
    (
        "v2-state-sent",
        "POST",
        "/v2/models/tiny-lstm/infer",
        v2(
            [
                {"name": "features", "shape": [1, 1, 16], "datatype": "FP32", "data": [0.0] * 16},
                {"name": "h0", "shape": [1, 1, 32], "datatype": "FP32", "data": [0.0] * 32},
            ]
        ),
        {},
        422,
        "invalid_input",
    ),
    (
        "v2-unknown-output",
        "POST",
        "/v2/models/tiny-encoder/infer",
        v2([ids([1, 2], [1, 1])], outputs=[{"name": "logits"}]),
        {},
        422,
        "invalid_input",
    ),
    (
        "v2-float-ids",
        "POST",
        "/v2/models/tiny-encoder/infer",
        v2([ids([1, 2], [1.5, 2.5])]),
        {},
        422,
        "invalid_input",
    ),
    (
        "v2-nan-binary-features",
        "POST",
        "/v2/models/tiny-lstm/infer",
        NAN_FEATURES[0],
        NAN_FEATURES[1],
        422,
        "invalid_input",
    ),
    (
        "v2-short-binary",
        "POST",
        "/v2/models/tiny-encoder/infer",
        SHORT_BINARY[0],
        SHORT_BINARY[1],
        400,
        "malformed",
    ),
    (
        "v2-header-length-past-body",
        "POST",
        "/v2/models/tiny-encoder/infer",
        b"{}",
        {"Inference-Header-Content-Length": "99"},
        400,
        "malformed",
    ),
    ("only-an-empty-sequence", "POST", "/predict", {"sequences": [[]]}, {}, 422, "invalid_input"),
    (
        "reserved-id-inside",
        "POST",
        "/predict",
        {"model": "keras-bilstm", "sequences": [[5, 0, 7]]},
        {},
        422,
        "invalid_input",
    ),
    (
        "v2-lengths-to-a-masked-model",
        "POST",
        "/v2/models/tiny-encoder/infer",
        v2([ids([1, 3], [5, 9, 2]), ids([1], [2], name="sequence_lengths")]),
        {},
        422,
        "invalid_input",
    ),
    (
        "v2-lengths-wrong-shape",
        "POST",
        "/v2/models/keras-bilstm/infer",
        v2([ids([1, 3], [5, 9, 2], "input_1"), ids([2], [2, 1], name="sequence_lengths")]),
        {},
        422,
        "invalid_input",
    ),
    (
        "v2-lengths-not-integers",
        "POST",
        "/v2/models/keras-bilstm/infer",
        v2([ids([1, 3], [5, 9, 2], "input_1"), ids([1], [1.5], "sequence_lengths", "FP32")]),
        {},
        422,
        "invalid_input",
    ),
    (
        "v2-lengths-zero",
        "POST",
        "/v2/models/keras-bilstm/infer",
        v2([ids([1, 3], [5, 9, 2], "input_1"), ids([1], [0], name="sequence_lengths")]),
        {},
        422,
        "invalid_input",
    ),
    (
        "v2-lengths-past-the-row",
        "POST",
        "/v2/models/keras-bilstm/infer",
        v2([ids([1, 3], [5, 9, 2], "input_1"), ids([1], [4], name="sequence_lengths")]),
        {},
        422,
        "invalid_input",
    ),
    (
        "v2-pad-id-then-more",
        "POST",
        "/v2/models/keras-bilstm/infer",
        v2([ids([1, 3], [5, 0, 2], "input_1")]),
        {},
        422,
        "invalid_input",
    ),
    (
        "v2-reserved-id-inside-given-lengths",
        "POST",
        "/v2/models/keras-bilstm/infer",
        v2([ids([1, 3], [5, 0, 2], "input_1"), ids([1], [3], name="sequence_lengths")]),
        {},
        422,
        "invalid_input",
    ),
    ("unknown-route", "GET", "/v3/everything", None, {}, 404, "not_found"),
    ("wrong-method", "GET", "/predict", None, {}, 405, "method_not_allowed"),
    ("unknown-model-metadata", "GET", "/v2/models/gpt", None, {}, 404, "model_not_found"),
]


@pytest.fixture
def engine(tmp_models: Path) -> Any:
    add_to(tmp_models, "keras-bilstm")  # no mask input: its pad id 0 is reserved
    return make_engine(
        tmp_models,
        "tiny-encoder",
        "tiny-lstm",
        default_model="tiny-encoder",
        max_body_bytes=LIMIT,
        max_sequences=64,
    )


def test_the_matrix_is_large_enough() -> None:
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


async def test_bad_input_matrix(engine: Any) -> None:
    async with serving(engine) as client:
        for name, method, path, body, headers, status, code in CASES:
            content = body if isinstance(body, bytes) or body is None else orjson.dumps(body)
            response = await client.request(method, path, content=content, headers=headers)
            assert (response.status_code, name) == (status, name), response.text
            assert response.json()["error"]["code"] == code, (name, response.text)
            assert response.json()["error"]["message"], name
            assert "x-request-id" in response.headers

        # still alive, and exact
        good = await client.post("/predict", json={"sequences": [[5, 6, 7]]})
        assert good.status_code == 200
        expected = engine.model("tiny-encoder").predict([[5, 6, 7]])[0]["sentence_embedding"]
        np.testing.assert_allclose(
            good.json()["outputs"][0]["sentence_embedding"], expected, atol=1e-6
        )
        metrics = (await client.get("/metrics")).text
        assert 'status="500"' not in metrics


async def test_chunked_body_over_the_limit_is_refused(engine: Any) -> None:
    async def chunks() -> Any:
        for _ in range(100):
            yield b" " * 1024  # no Content-Length: the limit must hold while streaming

    async with serving(engine) as client:
        response = await client.post("/predict", content=chunks())
    assert response.status_code == 413


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"sequences": [[]]}, "sequence 0: empty"),
        ({"sequences": [[3], []]}, "sequence 1: empty"),
        (
            {"model": "keras-bilstm", "sequences": [[5, 6], [5, 0, 7]]},
            "sequence 1: id 0 at position 1 is reserved",
        ),
    ],
)
async def test_messages_say_what_is_wrong(engine: Any, body: dict[str, Any], says: str) -> None:
    async with serving(engine) as client:
        response = await client.post("/predict", json=body)
    assert response.status_code == 422
    assert says in response.json()["error"]["message"]

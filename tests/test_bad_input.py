"""Bad input of every kind: the right status and error code, never a 500, and the server is
still alive and exact afterwards."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import pytest_asyncio

from tests.engines import make_engine, serving
from tests.helpers import error_of
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
Case = tuple[str, str, str, Any, dict[str, str], int, str]
CASES: list[Case] = [
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
        422,  # BYTES is for texts, in the input `text`
        "invalid_input",
    ),
    (
        "v2-count-mismatch",
        "POST",
        "/v2/models/tiny-encoder/infer",
        v2([ids([2, 3], [1, 2])]),
        {},
        422,  # a body the schema allows, but its data do not fill its shape
        "invalid_input",
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
        422,
        "invalid_input",
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

INFER = "/v2/models/tiny-encoder/infer"
LSTM_INFER = "/v2/models/tiny-lstm/infer"
ONE_ID = ids([1, 1], [1])
FEATURE = {"name": "features", "shape": [1, 1, 16], "datatype": "FP32", "data": [0.5] * 16}


def case(name: str, path: str, body: Any, status: int, code: str, **headers: Any) -> Case:
    return (
        name,
        "POST",
        path,
        body,
        {k.replace("_", "-"): v for k, v in headers.items()},
        status,
        code,
    )


# What an attacker's or a broken client's bodies found: each once answered with a 500 or a
# wrong 200, and every one of them now a 4xx in the error form.
CASES += [
    case("v2-datatype-not-string", INFER, v2([{**ONE_ID, "datatype": 5}]), 400, "malformed"),
    case(
        "v2-output-parameters-not-object",
        INFER,
        v2([ONE_ID], outputs=[{"name": "sentence_embedding", "parameters": [1]}]),
        400,
        "malformed",
    ),
    (
        "v2-binary-size-a-float",
        "POST",
        INFER,
        *binary(
            v2(
                [
                    {
                        "name": "input_ids",
                        "shape": [1, 1],
                        "datatype": "INT64",
                        "parameters": {"binary_data_size": 8.5},
                    }
                ]
            ),
            b"\0" * 8,
        ),
        400,
        "malformed",
    ),
    (
        "v2-header-length-superscript-two",  # passes str.isdigit, fails int()
        "POST",
        INFER,
        orjson.dumps(v2([ONE_ID])),
        {"Inference-Header-Content-Length": "\xb2".encode("latin-1")},
        400,
        "malformed",
    ),
    case(
        "v2-header-length-not-digits",
        INFER,
        v2([ONE_ID]),
        400,
        "malformed",
        **{"Inference-Header-Content-Length": "1a"},
    ),
    case("v2-int8-past-range", INFER, v2([ids([1, 1], [300], dtype="INT8")]), 422, "invalid_input"),
    case("v2-uint8-negative", INFER, v2([ids([1, 1], [-1], dtype="UINT8")]), 422, "invalid_input"),
    case(
        "v2-int32-wraps",
        INFER,
        v2([ids([1, 1], [4294967301], dtype="INT32")]),
        422,
        "invalid_input",
    ),
    case(
        "v2-feature-overflows-fp32",
        LSTM_INFER,
        v2([{**FEATURE, "data": [1e39] * 16}]),
        422,
        "invalid_input",
    ),
    case(
        "feature-overflows-fp32",
        "/predict",
        {"model": "tiny-lstm", "sequences": [[[1e39] * 16]]},
        422,
        "invalid_input",
    ),
    case(
        "v2-mask-value-two",
        INFER,
        v2([ids([1, 3], [1, 2, 3]), ids([1, 3], [1, 2, 0], name="attention_mask")]),
        422,
        "invalid_input",
    ),
    case(
        "v2-length-one-and-a-half",
        LSTM_INFER,
        v2([FEATURE, ids([1], [1.5], name="lengths", dtype="FP32")]),
        422,
        "invalid_input",
    ),
    (
        "v2-bytes-after-the-tensors",
        "POST",
        INFER,
        *binary(
            v2(
                [
                    {
                        "name": "input_ids",
                        "shape": [1, 2],
                        "datatype": "INT64",
                        "parameters": {"binary_data_size": 16},
                    }
                ]
            ),
            struct.pack("<2q", 5, 9) + b"\0" * 1000,
        ),
        400,
        "malformed",
    ),
    case(
        "v2-binary-output-as-a-string",
        INFER,
        v2([ONE_ID], parameters={"binary_data_output": "false"}),
        400,
        "malformed",
    ),
    case("v2-unknown-top-level-field", INFER, v2([ONE_ID], sequence_id=5), 400, "malformed"),
    case(
        "v2-unsupported-request-parameter",
        INFER,
        v2([ONE_ID], parameters={"sequence_id": 1}),
        400,
        "malformed",
    ),
    case("v2-timeout-negative", INFER, v2([ONE_ID], parameters={"timeout": -1}), 400, "malformed"),
    case(
        "v2-timeout-a-fraction", INFER, v2([ONE_ID], parameters={"timeout": 1.5}), 400, "malformed"
    ),
    case("v2-timeout-a-bool", INFER, v2([ONE_ID], parameters={"timeout": True}), 400, "malformed"),
    case(
        "v2-timeout-a-string", INFER, v2([ONE_ID], parameters={"timeout": "1s"}), 400, "malformed"
    ),
    case(
        "v2-priority-a-word", INFER, v2([ONE_ID], parameters={"priority": "high"}), 400, "malformed"
    ),
    case(
        "v2-timeout-already-passed",
        INFER,
        v2([ONE_ID], parameters={"timeout": 1}),
        504,
        "deadline_exceeded",
    ),
    case("v2-id-not-a-string", INFER, v2([ONE_ID], id=7), 400, "malformed"),
    case("v2-shape-negative", INFER, v2([{**ONE_ID, "shape": [-1, 1]}]), 400, "malformed"),
    case("v2-shape-of-booleans", INFER, v2([{**ONE_ID, "shape": [True, True]}]), 400, "malformed"),
    case(
        "v2-input-without-name",
        INFER,
        v2([{k: v for k, v in ONE_ID.items() if k != "name"}]),
        400,
        "malformed",
    ),
    case("v2-input-name-too-long", INFER, v2([{**ONE_ID, "name": "x" * 300}]), 400, "malformed"),
    case(
        "v2-input-without-shape",
        INFER,
        v2([{k: v for k, v in ONE_ID.items() if k != "shape"}]),
        400,
        "malformed",
    ),
    case(
        "v2-data-and-binary-both",
        INFER,
        v2([{**ONE_ID, "parameters": {"binary_data_size": 8}}]),
        422,
        "invalid_input",
    ),
    case(
        "v2-binary-size-negative",
        INFER,
        v2([{**ONE_ID, "data": None, "parameters": {"binary_data_size": -8}}]),
        400,
        "malformed",
    ),
    case(
        "v2-unsupported-tensor-parameter",
        INFER,
        v2([{**ONE_ID, "parameters": {"shared_memory_region": "r0"}}]),
        400,
        "malformed",
    ),
    case("v2-outputs-not-a-list", INFER, v2([ONE_ID], outputs={"name": "x"}), 400, "malformed"),
    case("v2-output-without-name", INFER, v2([ONE_ID], outputs=[{}]), 400, "malformed"),
    case(
        "v2-classification-output",
        INFER,
        v2([ONE_ID], outputs=[{"name": "sentence_embedding", "parameters": {"classification": 3}}]),
        400,
        "malformed",
    ),
    case("v2-inputs-not-a-list", INFER, {"inputs": {"name": "input_ids"}}, 400, "malformed"),
    case("v2-inputs-empty", INFER, {"inputs": []}, 400, "malformed"),
    case("v2-body-an-array", INFER, [ONE_ID], 400, "malformed"),
    case("v2-unknown-datatype", INFER, v2([ids([1, 1], [1], dtype="BF16")]), 400, "malformed"),
    case("v2-empty-datatype", INFER, v2([ids([1, 1], [1], dtype="")]), 400, "malformed"),
    case(
        "v2-zero-next-to-huge-dims",
        INFER,
        v2([ids([4294967296, 4294967296, 0], [])]),
        422,
        "invalid_input",
    ),
    case("v2-zero-rows", INFER, v2([ids([0, 4294967296], [])]), 422, "invalid_input"),
    case("v2-zero-steps", INFER, v2([ids([4294967296, 0], [])]), 422, "invalid_input"),
    case("v2-rank-past-the-model", INFER, v2([ids([1] * 8, [1])]), 422, "invalid_input"),
    case(
        "v2-long-input-name",
        INFER,
        v2([{**ONE_ID, "name": "x" * 256}]),
        422,
        "invalid_input",
    ),
    case(
        "v2-boolean-ids",
        INFER,
        v2([ids([1, 2], [True, False], dtype="BOOL")]),
        422,
        "invalid_input",
    ),
    case(
        "text-plain-body",
        "/predict",
        {"sequences": [[1]]},
        415,
        "unsupported_media_type",
        content_type="text/plain",
    ),
    case(
        "form-body",
        "/predict",
        {"sequences": [[1]]},
        415,
        "unsupported_media_type",
        content_type="application/x-www-form-urlencoded",
    ),
    case(
        "v2-multipart-body",
        INFER,
        v2([ONE_ID]),
        415,
        "unsupported_media_type",
        content_type="multipart/form-data; boundary=x",
    ),
    case(
        "octet-stream-to-predict",
        "/predict",
        {"sequences": [[1]]},
        415,
        "unsupported_media_type",
        content_type="application/octet-stream",
    ),
    case("too-many-tokens", "/predict", {"sequences": [[1] * 200] * 6}, 422, "invalid_input"),
    case(
        "v2-too-many-tokens",
        INFER,
        v2([ids([6, 200], [1] * 1200)]),
        422,
        "invalid_input",
    ),
    case(
        "unknown-model-long-name",
        "/predict",
        {"model": "m" * 10_000, "sequences": [[1]]},
        404,
        "model_not_found",
    ),
    case(
        "outputs-not-strings",
        "/predict",
        {"sequences": [[1]], "outputs": [1]},
        422,
        "invalid_input",
    ),
]


module_loop = pytest.mark.asyncio(loop_scope="module")  # the app below lives for the module


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("bad-input") / "models"
    root.mkdir()
    add_to(root, "keras-bilstm")  # no mask input: its pad id 0 is reserved
    return make_engine(
        root,
        "tiny-encoder",
        "tiny-lstm",
        default_model="tiny-encoder",
        max_body_bytes=LIMIT,
        max_sequences=64,
        max_request_tokens=1024,
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(engine: Any) -> AsyncIterator[httpx.AsyncClient]:
    """One server for the whole matrix: what one bad request does must not reach the next."""
    async with serving(engine) as client:
        yield client


def test_the_matrix_is_large_enough() -> None:
    assert len(CASES) >= 100
    assert len({c[0] for c in CASES}) == len(CASES)


@module_loop
@pytest.mark.parametrize("bad", CASES, ids=[c[0] for c in CASES])
async def test_bad_input_gets_its_error_and_the_server_stays_exact(
    client: httpx.AsyncClient, engine: Any, bad: Case
) -> None:
    _, method, path, body, headers, status, code = bad
    content = body if isinstance(body, bytes) or body is None else orjson.dumps(body)

    response = await client.request(method, path, content=content, headers=headers)

    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    if path.startswith("/v1/"):  # the hosted APIs': OpenAI's, Cohere's message, Jina's detail
        assert set(body) == {"error", "message", "detail"}
        assert set(body["error"]) == {"code", "message", "type", "param"}
    else:  # TEI's form, whose `error` KServe v2's clients read too, with our code
        assert set(body) == {"error", "error_type", "code"}
    said, message = error_of(body)
    assert said == code
    assert 0 < len(message) <= 1000  # what is wrong, never an echo of any length
    assert "Traceback" not in response.text
    assert "x-request-id" in response.headers
    # the next request is answered, and exactly
    good = await client.post("/predict", json={"sequences": [[5, 6, 7]]})
    assert good.status_code == 200
    expected = engine.model("tiny-encoder").predict([[5, 6, 7]])[0]["sentence_embedding"]
    np.testing.assert_allclose(good.json()["outputs"][0]["sentence_embedding"], expected, atol=1e-6)


@module_loop
async def test_no_request_of_the_matrix_was_counted_as_a_500(client: httpx.AsyncClient) -> None:
    metrics = (await client.get("/metrics")).text
    assert 'status="500"' not in metrics
    assert 'bucketserve_rejected_total{reason="malformed"}' in metrics  # refusals are counted


@module_loop
async def test_405_says_which_methods_the_route_allows(client: httpx.AsyncClient) -> None:
    response = await client.get("/predict")
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"


@module_loop
async def test_chunked_body_over_the_limit_is_refused(client: httpx.AsyncClient) -> None:
    async def chunks() -> Any:
        for _ in range(100):
            yield b" " * 1024  # no Content-Length: the limit must hold while streaming

    response = await client.post("/predict", content=chunks())
    assert response.status_code == 413


@module_loop
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
async def test_messages_say_what_is_wrong(
    client: httpx.AsyncClient, body: dict[str, Any], says: str
) -> None:
    response = await client.post("/predict", json=body)
    assert response.status_code == 422
    assert says in error_of(response)[1]


@module_loop
@pytest.mark.parametrize(
    "body",
    [
        v2([{**ONE_ID, "shape": [1.0, 1.0]}]),  # 1.0 is an integer in JSON Schema's eyes
        v2([ONE_ID], parameters={"timeout": 0}),  # Triton's default: no timeout of its own
        v2([ONE_ID], parameters={"timeout": 30_000_000.0, "priority": 2.0}),
    ],
    ids=["integral-float-shape", "timeout-zero", "integral-float-parameters"],
)
async def test_a_body_the_schema_allows_is_answered(
    client: httpx.AsyncClient, body: dict[str, Any]
) -> None:
    response = await client.post(INFER, json=body)
    assert response.status_code == 200, response.text
    assert response.json()["model_name"] == "tiny-encoder"

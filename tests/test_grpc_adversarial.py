"""gRPC under a hostile client: bytes that are not the message, messages that lie about their
tensors, parameters of every wrong type, calls with no message at all, a message past the size
limit, a queue that cannot take the request. Every call is answered with a code a client can
act on (never UNKNOWN, never INTERNAL), in a short message that names no path of the host, and
the next call is answered exactly.

The calls go through a raw channel (bytes in, bytes out), so that the server sees exactly what
a broken or malicious client would send.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from loadtest.process import free_port
from tests.engines import Reference, spec_of
from tests.helpers import MODELS, copy_bundled, padded, server_process

pytestmark = pytest.mark.slow  # the full tier: real server processes

grpc = pytest.importorskip("grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")

SERVICE = "/inference.GRPCInferenceService/"
CAPACITY = 8  # the model's queue: a request of more sequences is refused at once
LIMIT = 1 << 20  # --max-body-bytes: the largest message
Code = Any  # grpc.StatusCode
OK, INVALID, NOT_FOUND = "OK", "INVALID_ARGUMENT", "NOT_FOUND"
UNAVAILABLE, DEADLINE, TOO_LARGE = "UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"
HOST_PATH = re.compile(r"(?:^|[\s'\"(=:])/(?:tmp|home|root|work|usr|var|opt|etc|proc)\b")


@pytest.fixture(scope="module")
def process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path, str, Path]]:
    """The server: (a raw gRPC channel to it, its repository, its HTTP url, its log)."""
    root = tmp_path_factory.mktemp("grpc-adversarial") / "models"
    root.mkdir()
    config = (MODELS / "tiny-encoder" / "config.toml").read_text()
    copy_bundled(
        root, "tiny-encoder", config.replace("queue_capacity = 2048", "queue_capacity = 8")
    )
    port = free_port()
    flags = ("--grpc-port", str(port), "--max-body-bytes", str(LIMIT), "--max-sequences", "64")
    flags += ("--max-request-tokens", "1024")
    with server_process(root, *flags) as (_, url, log):
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        yield channel, root, url, log
        channel.close()


@pytest.fixture(scope="module")
def server(process: tuple[Any, Path, str, Path]) -> tuple[Any, Path]:
    return process[0], process[1]


# -- the requests -----------------------------------------------------------------------------


def request(sequences: list[list[int]] | None = None, *, mask: bool = True, **fields: Any) -> Any:
    """A ModelInferRequest for tiny-encoder of these token id rows, raw INT64."""
    ids, attention = padded(sequences or [[5, 9, 2], [7, 1]])
    message = service_pb2.ModelInferRequest(model_name="tiny-encoder", **fields)
    message.inputs.add(name="input_ids", datatype="INT64", shape=list(ids.shape))
    message.raw_input_contents.append(ids.tobytes())
    if mask:
        message.inputs.add(name="attention_mask", datatype="INT64", shape=list(attention.shape))
        message.raw_input_contents.append(attention.tobytes())
    return message


GOOD = request([[5, 9, 2, 44], [7, 1]])


def edited(change: Callable[[Any], None], base: Any = None) -> bytes:
    message = type(GOOD)()
    message.CopyFrom(base if base is not None else GOOD)
    change(message)
    return bytes(message.SerializeToString())


def field(number: int, wire_type: int, payload: bytes) -> bytes:
    """One protobuf field, hand-made: a key, then (for length-delimited) a length prefix."""
    key = bytes([number << 3 | wire_type])
    return key + (varint(len(payload)) + payload if wire_type == 2 else payload)


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def shaped(shape: list[int], raw: bytes = b"", name: str = "input_ids") -> bytes:
    def change(message: Any) -> None:
        del message.inputs[:]
        del message.raw_input_contents[:]
        message.inputs.add(name=name, datatype="INT64", shape=shape)
        message.raw_input_contents.append(raw)

    return edited(change)


def parameter(key: str, kind: str, value: Any, where: str = "request") -> bytes:
    def change(message: Any) -> None:
        target = {
            "request": message.parameters,
            "input": message.inputs[0].parameters,
            "output": message.outputs.add(name="sentence_embedding").parameters,
        }[where]
        if kind == "unset":
            target.get_or_create(key)  # present, with no value chosen
        else:
            setattr(target[key], kind, value)

    return edited(change)


def typed(datatype: str, contents: str, values: list[Any], shape: list[int]) -> bytes:
    def change(message: Any) -> None:
        del message.inputs[:]
        del message.raw_input_contents[:]
        tensor = message.inputs.add(name="input_ids", datatype=datatype, shape=shape)
        getattr(tensor.contents, contents).extend(values)

    return edited(change)


def with_input(name: str, array: np.ndarray) -> bytes:
    """GOOD with one more raw INT64 input."""

    def change(message: Any) -> None:
        message.inputs.add(name=name, datatype="INT64", shape=list(array.shape))
        message.raw_input_contents.append(array.astype(np.int64).tobytes())

    return edited(change)


def with_mask(mask: np.ndarray) -> bytes:
    """GOOD with another attention mask."""

    def change(message: Any) -> None:
        message.inputs[1].ClearField("shape")
        message.inputs[1].shape.extend(mask.shape)
        message.raw_input_contents[1] = mask.astype(np.int64).tobytes()

    return edited(change)


def without_ids(message: Any) -> None:
    message.inputs.pop(0)
    message.raw_input_contents.pop(0)


def bad_utf8(number: int) -> bytes:
    """GOOD with one more string field (a later value wins) holding bytes that are not UTF-8."""
    return bytes(GOOD.SerializeToString()) + field(number, 2, b"\xff\xfe\xc3(")


def bad_utf8_in_tensor(number: int) -> bytes:
    """An input tensor whose string field `number` is not UTF-8."""
    tensor = service_pb2.ModelInferRequest.InferInputTensor(
        name="input_ids", datatype="INT64", shape=[1, 1]
    ).SerializeToString()
    return bytes(GOOD.SerializeToString()) + field(5, 2, tensor + field(number, 2, b"\xc3("))


LONG = "x" * 20_000
SERIALIZED = bytes(GOOD.SerializeToString())

# (id, method, the message's bytes or None for a call with no message, the code it gets)
Case = tuple[str, str, "bytes | list[bytes] | None", str]
CASES: list[Case] = [
    # bytes that are no message of the method
    *[
        (f"garbage-{i}", "ModelInfer", bytes(np.random.default_rng(i).bytes(n)), INVALID)
        for i, n in enumerate((1, 7, 64, 512, 4096))
    ],
    ("all-ones", "ModelInfer", b"\xff" * 32, INVALID),
    ("varint-overflow", "ModelInfer", b"\x08" + b"\xff" * 11, INVALID),
    ("length-past-the-end", "ModelInfer", b"\x0a\x7fshort", INVALID),
    ("group-never-closed", "ModelInfer", b"\x0b", INVALID),
    ("wire-type-7", "ModelInfer", b"\x0f\x00", INVALID),
    ("field-number-0", "ModelInfer", b"\x02\x00", INVALID),
    ("nested-tensor-truncated", "ModelInfer", b"\x2a\x10\x0a\x09input_ids", INVALID),
    *[
        (f"truncated-at-{cut}", "ModelInfer", SERIALIZED[:cut], INVALID)
        for cut in (1, 2, 5, 10, 20, 40, len(SERIALIZED) - 20, len(SERIALIZED) - 1)
    ],
    *[
        (f"garbage-to-{method}", method, b"\xff\xff\xff", INVALID)
        for method in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata")
    ],
    # strings that are not UTF-8
    ("utf8-model-name", "ModelInfer", bad_utf8(1), INVALID),
    ("utf8-model-version", "ModelInfer", bad_utf8(2), INVALID),
    ("utf8-id", "ModelInfer", bad_utf8(3), INVALID),
    ("utf8-input-name", "ModelInfer", bad_utf8_in_tensor(1), INVALID),
    ("utf8-datatype", "ModelInfer", bad_utf8_in_tensor(2), INVALID),
    ("utf8-model-ready-name", "ModelReady", field(1, 2, b"\xc3("), INVALID),
    ("utf8-metadata-version", "ModelMetadata", field(2, 2, b"\xff"), INVALID),
    # calls with no message, or two
    *[(f"no-message-{m}", m, None, INVALID) for m in ("ModelInfer", "ServerLive", "ModelReady")],
    *[
        (f"two-messages-{m}", m, [SERIALIZED, SERIALIZED], INVALID)
        for m in ("ModelInfer", "ServerReady")
    ],
    # shapes: zero next to huge, huge alone, negative, rank past the model's
    ("zero-rows", "ModelInfer", shaped([0, 3]), INVALID),
    ("zero-steps", "ModelInfer", shaped([3, 0]), INVALID),
    ("zero-both", "ModelInfer", shaped([0, 0]), INVALID),
    ("zero-next-to-huge", "ModelInfer", shaped([4294967296, 0]), INVALID),
    ("huge-next-to-zero", "ModelInfer", shaped([0, 4294967296]), INVALID),
    ("huge-squared-and-zero", "ModelInfer", shaped([4294967296, 4294967296, 0]), INVALID),
    ("huge-rows", "ModelInfer", shaped([2**62, 1], b"\0" * 8), INVALID),
    ("huge-steps", "ModelInfer", shaped([1, 2**62], b"\0" * 8), INVALID),
    ("int64-max", "ModelInfer", shaped([2**63 - 1, 2**63 - 1], b"\0" * 8), INVALID),
    ("negative-rows", "ModelInfer", shaped([-1, 1], b"\0" * 8), INVALID),
    ("negative-steps", "ModelInfer", shaped([1, -8], b"\0" * 8), INVALID),
    ("int64-min", "ModelInfer", shaped([-(2**63), 1], b"\0" * 8), INVALID),
    ("rank-0", "ModelInfer", shaped([], b"\1" + b"\0" * 7), INVALID),
    ("rank-1", "ModelInfer", shaped([1], b"\1" + b"\0" * 7), INVALID),
    ("rank-3", "ModelInfer", shaped([1, 1, 1], b"\1" + b"\0" * 7), INVALID),
    ("rank-8", "ModelInfer", shaped([1] * 8, b"\1" + b"\0" * 7), INVALID),
    ("rank-70", "ModelInfer", shaped([1] * 70, b"\1" + b"\0" * 7), INVALID),
    ("rank-70-huge", "ModelInfer", shaped([2**40] * 70), INVALID),
    ("raw-too-short", "ModelInfer", shaped([1, 4], b"\1" * 7), INVALID),
    ("raw-too-long", "ModelInfer", shaped([1, 1], b"\1" * 9), INVALID),
    # client strings of any length are cut in what the server says
    ("long-input-name", "ModelInfer", shaped([1, 1], b"\1" + b"\0" * 7, name=LONG), INVALID),
    (
        "long-datatype",
        "ModelInfer",
        edited(lambda m: setattr(m.inputs[0], "datatype", LONG)),
        INVALID,
    ),
    ("long-model-name", "ModelInfer", edited(lambda m: setattr(m, "model_name", LONG)), NOT_FOUND),
    ("long-version", "ModelInfer", edited(lambda m: setattr(m, "model_version", LONG)), NOT_FOUND),
    ("long-output-name", "ModelInfer", edited(lambda m: m.outputs.add(name=LONG)), INVALID),
    (
        "many-long-output-names",
        "ModelInfer",
        edited(lambda m: [m.outputs.add(name=f"{i}{LONG[:2000]}") for i in range(200)]),
        INVALID,
    ),
    ("long-parameter-key", "ModelInfer", parameter(LONG, "int64_param", 1), INVALID),
    ("long-ready-name", "ModelReady", field(1, 2, LONG.encode()), NOT_FOUND),
    ("long-metadata-name", "ModelMetadata", field(1, 2, LONG.encode()), NOT_FOUND),
    (
        "long-metadata-version",
        "ModelMetadata",
        field(1, 2, b"tiny-encoder") + field(2, 2, LONG.encode()),
        NOT_FOUND,
    ),
    # Triton's `timeout`: an int64 of microseconds, 0 (its default) for none of its own
    ("timeout-string", "ModelInfer", parameter("timeout", "string_param", "1000"), INVALID),
    ("timeout-double", "ModelInfer", parameter("timeout", "double_param", 1000.0), INVALID),
    ("timeout-bool", "ModelInfer", parameter("timeout", "bool_param", True), INVALID),
    ("timeout-uint64", "ModelInfer", parameter("timeout", "uint64_param", 1000), INVALID),
    ("timeout-unset", "ModelInfer", parameter("timeout", "unset", None), INVALID),
    ("timeout-negative", "ModelInfer", parameter("timeout", "int64_param", -1), INVALID),
    ("timeout-int64-min", "ModelInfer", parameter("timeout", "int64_param", -(2**63)), INVALID),
    ("timeout-zero", "ModelInfer", parameter("timeout", "int64_param", 0), OK),
    ("timeout-int64-max", "ModelInfer", parameter("timeout", "int64_param", 2**63 - 1), OK),
    ("timeout-one-microsecond", "ModelInfer", parameter("timeout", "int64_param", 1), DEADLINE),
    # other parameters
    ("priority", "ModelInfer", parameter("priority", "int64_param", 3), OK),
    ("priority-uint64", "ModelInfer", parameter("priority", "uint64_param", 3), OK),
    ("priority-string", "ModelInfer", parameter("priority", "string_param", "high"), INVALID),
    ("priority-negative", "ModelInfer", parameter("priority", "int64_param", -3), INVALID),
    (
        "binary-data-output-int",
        "ModelInfer",
        parameter("binary_data_output", "int64_param", 1),
        INVALID,
    ),
    ("unknown-parameter", "ModelInfer", parameter("temperature", "double_param", 0.5), INVALID),
    ("sequence-id", "ModelInfer", parameter("sequence_id", "int64_param", 7), INVALID),
    (
        "shared-memory-input",
        "ModelInfer",
        parameter("shared_memory_region", "string_param", "r0", "input"),
        INVALID,
    ),
    (
        "classification-output",
        "ModelInfer",
        parameter("classification", "int64_param", 3, "output"),
        INVALID,
    ),
    # tensors whose contents do not fit what they claim
    ("typed-count-short", "ModelInfer", typed("INT64", "int64_contents", [5, 9], [1, 3]), INVALID),
    (
        "typed-count-long",
        "ModelInfer",
        typed("INT64", "int64_contents", [5, 9, 2, 4], [1, 3]),
        INVALID,
    ),
    ("typed-wrong-field", "ModelInfer", typed("INT64", "fp32_contents", [5.0], [1, 1]), INVALID),
    (
        "typed-int8-out-of-range",
        "ModelInfer",
        typed("INT8", "int_contents", [300], [1, 1]),
        INVALID,
    ),
    (
        "typed-uint64-huge",
        "ModelInfer",
        typed("UINT64", "uint64_contents", [2**64 - 1], [1, 1]),
        INVALID,
    ),
    ("typed-fp32-ids", "ModelInfer", typed("FP32", "fp32_contents", [5.5], [1, 1]), INVALID),
    ("typed-bool-ids", "ModelInfer", typed("BOOL", "bool_contents", [True], [1, 1]), INVALID),
    ("typed-fp16", "ModelInfer", typed("FP16", "fp32_contents", [1.0], [1, 1]), INVALID),
    ("typed-bytes", "ModelInfer", typed("BYTES", "bytes_contents", [b"hi"], [1, 1]), INVALID),
    ("datatype-empty", "ModelInfer", typed("", "int64_contents", [5], [1, 1]), INVALID),
    ("datatype-lower-case", "ModelInfer", typed("int64", "int64_contents", [5], [1, 1]), INVALID),
    (
        "raw-and-typed",
        "ModelInfer",
        edited(lambda m: m.inputs[0].contents.int64_contents.extend([1])),
        INVALID,
    ),
    ("raw-for-one-of-two", "ModelInfer", edited(lambda m: m.raw_input_contents.pop()), INVALID),
    (
        "raw-for-three-of-two",
        "ModelInfer",
        edited(lambda m: m.raw_input_contents.append(b"")),
        INVALID,
    ),
    # what the model takes
    ("out-of-vocabulary", "ModelInfer", request([[5, 2000]]).SerializeToString(), INVALID),
    ("negative-id", "ModelInfer", typed("INT64", "int64_contents", [-1], [1, 1]), INVALID),
    (
        "unknown-input",
        "ModelInfer",
        edited(lambda m: setattr(m.inputs[1], "name", "pixels")),
        INVALID,
    ),
    (
        "input-twice",
        "ModelInfer",
        edited(lambda m: setattr(m.inputs[1], "name", "input_ids")),
        INVALID,
    ),
    ("missing-ids", "ModelInfer", edited(without_ids), INVALID),
    ("mask-not-0-or-1", "ModelInfer", with_mask(np.full((2, 4), 2)), INVALID),
    ("mask-with-holes", "ModelInfer", with_mask(np.array([[1, 0, 1, 0]] * 2)), INVALID),
    ("mask-of-another-shape", "ModelInfer", with_mask(np.ones((2, 2))), INVALID),
    ("mask-of-rank-3", "ModelInfer", with_mask(np.ones((2, 4, 1))), INVALID),
    ("token-types-not-zero", "ModelInfer", with_input("token_type_ids", np.ones((2, 4))), INVALID),
    (
        "lengths-beside-a-mask",
        "ModelInfer",
        with_input("sequence_lengths", np.array([4, 2])),
        INVALID,
    ),
    (
        "longer-than-the-longest-bucket",
        "ModelInfer",
        request([[5] * 257], mask=False).SerializeToString(),
        INVALID,
    ),
    (
        "too-many-sequences",
        "ModelInfer",
        request([[5]] * 65, mask=False).SerializeToString(),
        INVALID,
    ),
    (
        "too-many-tokens",
        "ModelInfer",
        request([[5] * 200] * CAPACITY, mask=False).SerializeToString(),
        INVALID,
    ),
    ("unknown-model", "ModelInfer", edited(lambda m: setattr(m, "model_name", "gpt")), NOT_FOUND),
    (
        "unknown-version",
        "ModelInfer",
        edited(lambda m: setattr(m, "model_version", "7")),
        NOT_FOUND,
    ),
    ("unknown-output", "ModelInfer", edited(lambda m: m.outputs.add(name="logits")), INVALID),
    ("unknown-model-ready", "ModelReady", field(1, 2, b"gpt"), NOT_FOUND),
    ("unknown-model-metadata", "ModelMetadata", field(1, 2, b"gpt"), NOT_FOUND),
    ("unknown-model-config", "ModelConfig", field(1, 2, b"gpt"), NOT_FOUND),
    # limits
    (
        "past-the-message-limit",
        "ModelInfer",
        shaped([1, LIMIT // 8 + 1], b"\1" * (LIMIT + 8)),
        TOO_LARGE,
    ),
    (
        "more-than-the-queue-holds",
        "ModelInfer",
        request([[5]] * (CAPACITY + 1), mask=False).SerializeToString(),
        UNAVAILABLE,
    ),
    # a well-formed call of every method is answered
    ("live", "ServerLive", b"", OK),
    ("ready", "ServerReady", b"", OK),
    ("metadata", "ServerMetadata", b"", OK),
    ("model-ready", "ModelReady", field(1, 2, b"tiny-encoder"), OK),
    ("model-metadata", "ModelMetadata", field(1, 2, b"tiny-encoder"), OK),
    ("model-config", "ModelConfig", field(1, 2, b"tiny-encoder"), OK),
    ("infer", "ModelInfer", SERIALIZED, OK),
]


def call(channel: Any, method: str, payload: bytes | list[bytes] | None) -> tuple[Code, str]:
    """The code and message a raw call gets (bytes in: no serializer stands in between)."""
    try:
        if isinstance(payload, bytes):
            channel.unary_unary(SERVICE + method)(payload, timeout=30)
        else:  # no message (the client half-closes at once), or several
            channel.stream_unary(SERVICE + method)(iter(payload or []), timeout=30)
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


@pytest.fixture(scope="module")
def expected() -> np.ndarray:
    """The embeddings of GOOD's rows, each run alone by ONNX Runtime."""
    reference = Reference(spec_of(MODELS, "tiny-encoder"))
    rows = [[5, 9, 2, 44], [7, 1]]
    return np.stack([reference(np.array(r, np.int64))["sentence_embedding"] for r in rows])


def test_the_matrix_is_large_enough() -> None:
    assert len(CASES) >= 100
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    ("name", "method", "payload", "code_name"), CASES, ids=[c[0] for c in CASES]
)
def test_every_call_gets_a_code_a_client_can_act_on_and_the_next_is_exact(
    server: tuple[Any, Path],
    expected: np.ndarray,
    name: str,
    method: str,
    payload: Any,
    code_name: str,
) -> None:
    channel, root = server
    code, message = call(channel, method, payload)

    assert code.name == code_name, (code, message)
    assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
    assert len(message.encode()) < 1024, len(message)
    assert str(root) not in message
    assert not HOST_PATH.search(message), message
    if code is not grpc.StatusCode.OK:
        assert message  # a refusal says why
    # the next call is answered, and exactly
    answer = service_pb2.ModelInferResponse.FromString(
        channel.unary_unary(SERVICE + "ModelInfer")(SERIALIZED, timeout=30)
    )
    assert answer.model_name == "tiny-encoder"
    index = [o.name for o in answer.outputs].index("sentence_embedding")
    embedding = np.frombuffer(answer.raw_output_contents[index], np.float32).reshape(2, 64)
    np.testing.assert_allclose(embedding, expected, atol=1e-5)


def test_the_refusals_were_counted_and_logged_briefly(
    process: tuple[Any, Path, str, Path],
) -> None:
    """Run last: bytes that did not decode were counted as refusals, and the log said so in
    a few throttled lines, without a traceback."""
    _, _, url, log = process
    metrics = httpx.get(f"{url}/metrics").text
    assert re.search(r'bucketserve_rejected_total\{reason="malformed"\} [1-9]', metrics)
    assert 'status="500"' not in metrics
    text = log.read_text()
    assert "Traceback" not in text
    assert "ERROR" not in text
    refused = [line for line in text.splitlines() if "ModelInfer: " in line]
    malformed = [line for line in refused if "does not decode" in line]
    assert 1 <= len(malformed) <= 3, malformed  # one every 10 s, however many came
    assert len(refused) <= 3 * 5, refused  # (so for each of the 5 kinds refused)

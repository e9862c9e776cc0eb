"""`tritonclient.grpc`, unchanged, against a real server's gRPC port: metadata, raw and typed
tensors, rows of their own lengths through the mask, the same numbers as /predict, deadlines,
the status codes of bad requests, and a drain that answers what it admitted."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from loadtest.process import free_port
from tests.exports import texts
from tests.helpers import TextServer, copy_bundled, padded, server_process

pytestmark = pytest.mark.slow  # the full tier: real server processes

grpcclient = pytest.importorskip("tritonclient.grpc")
grpc_aio = pytest.importorskip("tritonclient.grpc.aio")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
service_pb2_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")
grpc = pytest.importorskip("grpc")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

SEQUENCES = [[5, 9, 2, 44], [7, 1], [3] * 30]


@contextlib.contextmanager
def start(root: Path) -> Iterator[tuple[str, str, object, Path]]:
    """The server on `root`, with gRPC on a port of its own: (url, gRPC address, process, log)."""
    port = free_port()
    flags = ("--default-model", "tiny-encoder", "--grpc-port", str(port))
    with server_process(root, *flags) as (process, url, log):
        yield url, f"127.0.0.1:{port}", process, log


@pytest.fixture
def server(text_server: TextServer) -> tuple[str, str]:
    """The session's server on `tiny-encoder` and `st` (a tokenizer: text in)."""
    return text_server.url, text_server.address


def infer_inputs(module: object, sequences: list[list[int]]) -> list[object]:
    ids, mask = padded(sequences)
    inputs = [
        module.InferInput("input_ids", list(ids.shape), "INT64"),  # type: ignore[attr-defined]
        module.InferInput("attention_mask", list(mask.shape), "INT64"),  # type: ignore[attr-defined]
    ]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(mask)
    return inputs


def predicted(url: str, sequences: list[list[int]]) -> list[dict[str, list[float]]]:
    response = httpx.post(f"{url}/predict", json={"sequences": sequences})
    assert response.status_code == 200
    outputs: list[dict[str, list[float]]] = response.json()["outputs"]
    return outputs


def assert_matches(embeddings: np.ndarray, hidden: np.ndarray, url: str) -> None:
    """Each row equals /predict's answer for that sequence; zeros past its length."""
    assert embeddings.shape == (3, 64)
    assert hidden.shape == (3, 30, 64)
    for row, (seq, want) in enumerate(zip(SEQUENCES, predicted(url, SEQUENCES), strict=True)):
        np.testing.assert_allclose(embeddings[row], want["sentence_embedding"], atol=1e-6)
        np.testing.assert_allclose(hidden[row, : len(seq)], want["last_hidden_state"], atol=1e-6)
        assert not hidden[row, len(seq) :].any()


def test_metadata_and_health(server: tuple[str, str]) -> None:
    _, address = server
    client = grpcclient.InferenceServerClient(address)
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("tiny-encoder")
    assert client.get_server_metadata().name == "bucketserve"
    metadata = client.get_model_metadata("tiny-encoder")
    assert metadata.versions == ["1"]
    assert [(i.name, i.datatype, list(i.shape)) for i in metadata.inputs][:2] == [
        ("input_ids", "INT64", [-1, -1]),
        ("attention_mask", "INT64", [-1, -1]),
    ]
    assert {o.name: list(o.shape) for o in metadata.outputs} == {
        "last_hidden_state": [-1, -1, 64],
        "sentence_embedding": [-1, 64],
    }


def test_raw_tensors_match_predict_row_by_row(server: tuple[str, str]) -> None:
    url, address = server
    client = grpcclient.InferenceServerClient(address)
    outputs = [
        grpcclient.InferRequestedOutput(n) for n in ("sentence_embedding", "last_hidden_state")
    ]
    result = client.infer(
        "tiny-encoder",
        infer_inputs(grpcclient, SEQUENCES),
        outputs=outputs,
        request_id="r-7",
        client_timeout=30,
    )
    assert result.get_response().id == "r-7"
    assert_matches(result.as_numpy("sentence_embedding"), result.as_numpy("last_hidden_state"), url)


def test_asyncio_client_gets_the_same_answers(server: tuple[str, str]) -> None:
    url, address = server

    async def ask() -> tuple[np.ndarray, np.ndarray]:
        async with grpc_aio.InferenceServerClient(address) as client:
            assert await client.is_server_ready()
            results = await asyncio.gather(
                *(client.infer("tiny-encoder", infer_inputs(grpc_aio, SEQUENCES)) for _ in range(4))
            )
        first = results[0]
        for other in results[1:]:  # batched with each other, the answers do not move
            np.testing.assert_allclose(
                other.as_numpy("sentence_embedding"),
                first.as_numpy("sentence_embedding"),
                atol=1e-6,
            )
        return first.as_numpy("sentence_embedding"), first.as_numpy("last_hidden_state")

    assert_matches(*asyncio.run(ask()), url)


def test_text_as_bytes_raw_and_typed_matches_predict_text(server: tuple[str, str]) -> None:
    url, address = server
    batch = [*texts(6, seed=12), "héllo wörld ✓"]
    predicted = httpx.post(f"{url}/predict", json={"model": "st", "text": batch}).json()["outputs"]
    client = grpcclient.InferenceServerClient(address)
    strings = grpcclient.InferInput("text", [len(batch)], "BYTES")
    strings.set_data_from_numpy(np.array([t.encode() for t in batch], object))  # raw contents
    raw = client.infer("st", [strings]).as_numpy("last_hidden_state")
    typed = service_pb2.ModelInferRequest(model_name="st")  # bytes_contents, built by hand
    tensor = typed.inputs.add(name="text", datatype="BYTES", shape=[len(batch)])
    tensor.contents.bytes_contents.extend(t.encode() for t in batch)
    answer = raw_stub(address).ModelInfer(typed)  # type: ignore[attr-defined]
    (output,) = [o for o in answer.outputs if o.name == "last_hidden_state"]
    index = [o.name for o in answer.outputs].index("last_hidden_state")
    shape = list(output.shape)
    from_typed = np.frombuffer(answer.raw_output_contents[index], "<f4").reshape(shape)
    for hidden in (raw, from_typed):
        for row, want in enumerate(predicted):
            steps = np.asarray(want["last_hidden_state"])
            np.testing.assert_allclose(hidden[row, : len(steps)], steps, atol=1e-6)


def test_text_truncation_as_triton_parameters(server: tuple[str, str]) -> None:
    """A text longer than the model takes: `truncation_direction` left keeps its end, as
    /predict's text does; `truncate` false refuses it (INVALID_ARGUMENT, naming the limit: this
    one is past the characters the model reads uncut, as well as its tokens)."""
    url, address = server
    long = " ".join(texts(40, seed=14))
    body = {"model": "st", "text": [long], "truncation_direction": "left"}
    predicted = httpx.post(f"{url}/predict", json=body).json()["outputs"][0]
    client = grpcclient.InferenceServerClient(address)
    strings = grpcclient.InferInput("text", [1], "BYTES")
    strings.set_data_from_numpy(np.array([long.encode()], object))
    left = client.infer("st", [strings], parameters={"truncation_direction": "left"})
    steps = np.asarray(predicted["last_hidden_state"])
    np.testing.assert_allclose(left.as_numpy("last_hidden_state")[0], steps, atol=1e-6)
    with pytest.raises(InferenceServerException, match="more than the 2048 this model reads"):
        client.infer("st", [strings], parameters={"truncate": False})


def raw_stub(address: str) -> object:
    return service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(address))


def typed_request(sequences: list[list[int]], datatype: str = "INT64") -> object:
    ids, mask = padded(sequences)
    request = service_pb2.ModelInferRequest(model_name="tiny-encoder")
    for name, array in (("input_ids", ids), ("attention_mask", mask)):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        field = (
            tensor.contents.int64_contents if datatype == "INT64" else tensor.contents.int_contents
        )
        field.extend(array.ravel().tolist())
    return request


@pytest.mark.parametrize("datatype", ["INT64", "INT32"])
def test_typed_contents_give_the_raw_answers(server: tuple[str, str], datatype: str) -> None:
    url, address = server
    response = raw_stub(address).ModelInfer(typed_request(SEQUENCES, datatype), timeout=30)  # type: ignore[attr-defined]
    arrays = {
        out.name: np.frombuffer(raw, np.float32).reshape(list(out.shape))
        for out, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    }
    assert response.model_version == "1"
    assert_matches(arrays["sentence_embedding"], arrays["last_hidden_state"], url)


def status_of(call: object) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call()  # type: ignore[operator]
    return str(caught.value.status())


def test_bad_requests_get_triton_status_codes_and_spare_their_neighbours(
    server: tuple[str, str],
) -> None:
    url, address = server
    client = grpcclient.InferenceServerClient(address)
    good = infer_inputs(grpcclient, SEQUENCES)
    assert status_of(lambda: client.infer("no-such-model", good)) == "StatusCode.NOT_FOUND"
    assert status_of(lambda: client.get_model_metadata("no-such-model")) == "StatusCode.NOT_FOUND"
    assert status_of(lambda: client.infer("tiny-encoder", good, model_version="7")) == (
        "StatusCode.NOT_FOUND"
    )
    out_of_vocab = infer_inputs(grpcclient, [[5, 10**6]])
    assert status_of(lambda: client.infer("tiny-encoder", out_of_vocab)) == (
        "StatusCode.INVALID_ARGUMENT"
    )
    halves = grpcclient.InferInput("input_ids", [1, 2], "FP16")
    halves.set_data_from_numpy(np.ones((1, 2), np.float16))
    assert status_of(lambda: client.infer("tiny-encoder", [halves])) == (
        "StatusCode.INVALID_ARGUMENT"
    )
    unknown_output = [grpcclient.InferRequestedOutput("logits")]
    assert status_of(lambda: client.infer("tiny-encoder", good, outputs=unknown_output)) == (
        "StatusCode.INVALID_ARGUMENT"
    )
    # raw bytes that do not fit the shape they claim
    request = service_pb2.ModelInferRequest(model_name="tiny-encoder")
    request.inputs.add(name="input_ids", datatype="INT64", shape=[1, 4])
    request.raw_input_contents.append(b"\x01" * 7)
    with pytest.raises(grpc.RpcError) as caught:
        raw_stub(address).ModelInfer(request, timeout=30)  # type: ignore[attr-defined]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "raw bytes" in caught.value.details()
    # typed values that do not fit their datatype
    wide = typed_request([[5, 2**40]])
    wide.inputs[0].datatype = "INT32"  # type: ignore[attr-defined]
    with pytest.raises(grpc.RpcError) as caught:
        raw_stub(address).ModelInfer(wide, timeout=30)  # type: ignore[attr-defined]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # and the server answers the next good request as before
    result = client.infer("tiny-encoder", good)
    assert_matches(result.as_numpy("sentence_embedding"), result.as_numpy("last_hidden_state"), url)
    metrics = httpx.get(f"{url}/metrics").text
    route = "/inference.GRPCInferenceService/ModelInfer"
    assert re.search(rf'bucketserve_requests_total{{route="{route}",status="422"}} [1-9]', metrics)
    assert re.search(rf'bucketserve_requests_total{{route="{route}",status="200"}} [1-9]', metrics)


def test_a_deadline_that_passes_is_deadline_exceeded(server: tuple[str, str]) -> None:
    url, address = server
    client = grpcclient.InferenceServerClient(address)
    inputs = infer_inputs(grpcclient, SEQUENCES)
    # Triton's request timeout (microseconds), which the server enforces itself
    assert status_of(lambda: client.infer("tiny-encoder", inputs, timeout=1)) == (
        "StatusCode.DEADLINE_EXCEEDED"
    )
    # a timeout that leaves time: answered, and rightly
    result = client.infer("tiny-encoder", inputs, timeout=30_000_000)
    assert_matches(result.as_numpy("sentence_embedding"), result.as_numpy("last_hidden_state"), url)


def test_sigterm_drains_grpc_like_http(tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    copy_bundled(root, "tiny-encoder")
    statuses: list[str] = []
    with start(root) as (_, address, process, log):
        client = grpcclient.InferenceServerClient(address)
        inputs = infer_inputs(grpcclient, SEQUENCES)
        client.infer("tiny-encoder", inputs)
        stop = threading.Event()

        def keep_asking() -> None:
            own = grpcclient.InferenceServerClient(address)
            while not stop.is_set():
                try:
                    own.infer("tiny-encoder", inputs, client_timeout=30)
                    statuses.append("ok")
                except InferenceServerException as exc:
                    statuses.append(str(exc.status()))
                    return

        askers = [threading.Thread(target=keep_asking) for _ in range(4)]
        for asker in askers:
            asker.start()
        while statuses.count("ok") < 8 and any(a.is_alive() for a in askers):
            threading.Event().wait(0.01)
        process.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
        assert process.wait(timeout=60) == 0  # type: ignore[attr-defined]
        stop.set()
        for asker in askers:
            asker.join(timeout=30)
        text = log.read_text()
    # every call was answered, or refused as unavailable once the drain began: none failed
    assert set(statuses) <= {"ok", "StatusCode.UNAVAILABLE"}, set(statuses)
    admitted, answered = map(
        int,
        re.search(r"drained: (\d+) requests admitted since start, (\d+) answered", text).groups(),
    )  # type: ignore[union-attr]
    assert admitted == answered >= 9

"""NVIDIA's `perf_analyzer` against a real server, its calls replayed: its binary does not
install from PyPI (the package there is a placeholder), so the test makes the calls it makes
(its `model_parser.cc` and `data_loader.cc`), over HTTP and gRPC alike, with tritonclient, whose
wire form its C++ client shares. Server metadata (statistics are asked for only where the
server lists that extension), the model's metadata and Triton's model configuration (every
input the configuration names must be in the metadata; `optional` read from it), then each
input's data from an `--input-data` file: an input without data is skipped only where the
configuration marks it optional, else perf_analyzer stops there. The requests then go as its
client sends them (binary tensors; no outputs named, so every output comes back binary), and
the answers equal /predict's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest

from tests.exports import texts
from tests.helpers import TextServer

pytestmark = pytest.mark.slow  # the full tier: a real server process

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")


@dataclass(frozen=True)
class Server:
    url: str  # HTTP, with its scheme
    grpc: str  # host:port


@pytest.fixture
def server(text_server: TextServer) -> Server:
    """The session's server on `tiny-encoder` and `st` (a tokenizer: text in)."""
    return Server(text_server.url, text_server.address)


class Unrunnable(Exception):
    """Where perf_analyzer itself would stop, with its words."""


@dataclass
class Input:
    name: str
    datatype: str
    optional: bool = False


def client(server: Server, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    return grpcclient.InferenceServerClient(server.grpc)


def as_json(call: Any, protocol: str, model: str | None = None) -> dict[str, Any]:
    args = () if model is None else (model,)
    return call(*args) if protocol == "http" else call(*args, as_json=True)  # type: ignore[no-any-return]


def parsed_inputs(triton: Any, protocol: str, model: str) -> dict[str, Input]:
    """`ModelParser::InitTriton`, for the inputs: names and datatypes from the metadata;
    every input the configuration names must be among them, `optional` from there."""
    server_metadata = as_json(triton.get_server_metadata, protocol)
    assert "statistics" not in server_metadata.get("extensions", [])  # (not served here)
    metadata = as_json(triton.get_model_metadata, protocol, model)
    config = as_json(triton.get_model_config, protocol, model)
    config = config if protocol == "http" else config["config"]
    assert isinstance(config.get("platform", ""), str)  # (an ensemble is told by it)
    inputs = {t["name"]: Input(t["name"], t["datatype"]) for t in metadata["inputs"]}
    for described in config.get("input", []):
        if described["name"] not in inputs:
            raise Unrunnable(f"no metadata found for input tensor {described['name']}")
        inputs[described["name"]].optional = bool(described.get("optional", False))
    return inputs


def request_inputs(
    inputs: dict[str, Input], data: dict[str, np.ndarray], protocol: str
) -> list[Any]:
    """`DataLoader::GetInputData` for each input: the data file's, or, for an optional
    input, none sent; for any other, perf_analyzer's own error. Binary, as it sends them."""
    module = httpclient if protocol == "http" else grpcclient
    sent = []
    for inp in inputs.values():
        if inp.name not in data:
            if not inp.optional:
                raise Unrunnable(f"unable to find data for input '{inp.name}'.")
            continue
        array = data[inp.name]
        tensor = module.InferInput(inp.name, list(array.shape), inp.datatype)
        if protocol == "http":
            tensor.set_data_from_numpy(array, binary_data=True)
        else:
            tensor.set_data_from_numpy(array)
        sent.append(tensor)
    return sent


def perf_analyzer_infer(
    server: Server, protocol: str, model: str, data: dict[str, np.ndarray]
) -> Any:
    triton = client(server, protocol)
    inputs = request_inputs(parsed_inputs(triton, protocol, model), data, protocol)
    return triton.infer(model, inputs)  # (no outputs named)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_text_model_runs_on_its_texts_alone(server: Server, protocol: str) -> None:
    batch = texts(3, seed=5)
    result = perf_analyzer_infer(
        server, protocol, "st", {"text": np.array([t.encode() for t in batch], object)}
    )
    predicted = httpx.post(f"{server.url}/predict", json={"model": "st", "text": batch})
    for row, want in enumerate(predicted.json()["outputs"]):
        steps = np.asarray(want["last_hidden_state"])
        np.testing.assert_allclose(
            result.as_numpy("last_hidden_state")[row, : len(steps)], steps, atol=1e-6
        )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_token_model_runs_on_its_token_ids_alone(server: Server, protocol: str) -> None:
    ids = np.array([[5, 9, 2, 44, 17, 3]], np.int64)  # the mask and token types: optional
    result = perf_analyzer_infer(server, protocol, "tiny-encoder", {"input_ids": ids})
    predicted = httpx.post(
        f"{server.url}/predict", json={"model": "tiny-encoder", "sequences": ids.tolist()}
    )
    want = predicted.json()["outputs"][0]["sentence_embedding"]
    np.testing.assert_allclose(result.as_numpy("sentence_embedding")[0], want, atol=1e-6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_one_input_a_token_model_needs_is_required(server: Server, protocol: str) -> None:
    mask = np.ones((1, 6), np.int64)
    with pytest.raises(Unrunnable, match="unable to find data for input 'input_ids'"):
        perf_analyzer_infer(server, protocol, "tiny-encoder", {"attention_mask": mask})


def test_both_protocols_describe_the_model_as_tritons_own_classes_read_it(
    server: Server,
) -> None:
    """The configuration over HTTP (JSON) and over gRPC (`ModelConfig`), read into Triton's
    own `ModelConfig` message: the same, field by field."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2

    for model in ("st", "tiny-encoder"):
        over_http = httpx.get(f"{server.url}/v2/models/{model}/config").json()
        read = json_format.ParseDict(
            over_http, model_config_pb2.ModelConfig(), ignore_unknown_fields=True
        )
        over_grpc = client(server, "grpc").get_model_config(model).config
        assert read == over_grpc
        assert read.platform == "onnxruntime_onnx"
        assert read.max_batch_size == 0  # the dims are whole shapes
        assert read.HasField("dynamic_batching")
        types = {t.name: model_config_pb2.DataType.Name(t.data_type) for t in read.input}
        optional = {t.name for t in read.input if t.optional}
        if model == "st":
            assert types["text"] == "TYPE_STRING"
            assert optional == set(types)  # texts, or token ids: either alone
        else:
            assert types["input_ids"] == "TYPE_INT64"
            assert optional == set(types) - {"input_ids"}
        assert over_http["batching"]["buckets"]  # bucketserve's own config, beside Triton's

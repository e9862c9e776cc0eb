"""`tritonclient.http`, unchanged, against a real server: binary and JSON tensors, the same
numbers as /predict, and rows of their own lengths to models without a mask."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from bucketserve.loading.check import random_sequences
from bucketserve.loading.layouts import sequence_rules
from tests.engines import Reference, spec_of
from tests.exports import texts
from tests.helpers import padded, server_process

pytestmark = pytest.mark.slow  # the full tier: real server processes

httpclient = pytest.importorskip("tritonclient.http")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException


@pytest.fixture(scope="module")
def server(repository: Callable[..., Path]) -> object:
    # keras-bilstm: tf2onnx-shaped, int32 ids, no mask: its pad id is the mask; int8-bilstm:
    # no mask, and batch-variant: served one sequence per run; st: a tokenizer, text in
    models = ("tiny-encoder", "tiny-lstm", "keras-bilstm", "int8-bilstm", "st")
    root = repository(*models)
    with server_process(root, "--default-model", "tiny-encoder") as (_, url, _log):
        yield url, root


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_encoder_through_tritonclient_matches_predict(
    server: tuple[str, Path], binary: bool
) -> None:
    url, _ = server
    sequences = [[5, 9, 2, 44], [7, 1], [3] * 30]
    client = httpclient.InferenceServerClient(url=url.removeprefix("http://"))
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("tiny-encoder")
    metadata = client.get_model_metadata("tiny-encoder")
    assert {i["name"] for i in metadata["inputs"]} >= {"input_ids", "attention_mask"}

    ids, mask = padded(sequences)
    inputs = [
        httpclient.InferInput("input_ids", list(ids.shape), "INT64"),
        httpclient.InferInput("attention_mask", list(mask.shape), "INT64"),
    ]
    inputs[0].set_data_from_numpy(ids, binary_data=binary)
    inputs[1].set_data_from_numpy(mask, binary_data=binary)
    outputs = [
        httpclient.InferRequestedOutput(name, binary_data=binary)
        for name in ("sentence_embedding", "last_hidden_state")
    ]
    result = client.infer("tiny-encoder", inputs, outputs=outputs, request_id="r-1")

    predicted = httpx.post(f"{url}/predict", json={"sequences": sequences}).json()["outputs"]
    embeddings = result.as_numpy("sentence_embedding")
    hidden = result.as_numpy("last_hidden_state")
    assert embeddings.shape == (3, 64)
    assert hidden.shape == (3, 30, 64)
    assert result.get_response()["id"] == "r-1"
    for row, (seq, want) in enumerate(zip(sequences, predicted, strict=True)):
        np.testing.assert_allclose(embeddings[row], want["sentence_embedding"], atol=1e-6)
        np.testing.assert_allclose(hidden[row, : len(seq)], want["last_hidden_state"], atol=1e-6)
        assert not hidden[row, len(seq) :].any()  # zeros past each row's length


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_text_as_bytes_through_tritonclient_matches_predict_text(
    server: tuple[str, Path], binary: bool
) -> None:
    url, _ = server
    batch = [*texts(6, seed=11), "héllo wörld ✓"]
    client = httpclient.InferenceServerClient(url=url.removeprefix("http://"))
    strings = httpclient.InferInput("text", [len(batch), 1], "BYTES")
    strings.set_data_from_numpy(np.array([[t.encode()] for t in batch], object), binary_data=binary)
    result = client.infer("st", [strings])
    predicted = httpx.post(f"{url}/predict", json={"model": "st", "text": batch}).json()["outputs"]
    hidden = result.as_numpy("last_hidden_state")
    for row, want in enumerate(predicted):
        steps = np.asarray(want["last_hidden_state"])
        np.testing.assert_allclose(hidden[row, : len(steps)], steps, atol=1e-6)
        assert not hidden[row, len(steps) :].any()


def test_features_model_with_lengths_and_default_binary_outputs(server: tuple[str, Path]) -> None:
    url, root = server
    sequences = random_sequences(sequence_rules(spec_of(root, "tiny-lstm")), [6, 11], seed=2)
    features = np.zeros((2, 11, 16), np.float32)
    for row, seq in enumerate(sequences):
        features[row, : len(seq)] = seq
    lengths = np.array([6, 11], np.int32)
    client = httpclient.InferenceServerClient(url=url.removeprefix("http://"))
    inputs = [
        httpclient.InferInput("features", [2, 11, 16], "FP32"),
        httpclient.InferInput("lengths", [2], "INT32"),
    ]
    inputs[0].set_data_from_numpy(features)
    inputs[1].set_data_from_numpy(lengths)
    result = client.infer("tiny-lstm", inputs)  # no outputs named: all of them, binary

    predicted = httpx.post(
        f"{url}/predict", json={"model": "tiny-lstm", "sequences": [s.tolist() for s in sequences]}
    ).json()["outputs"]
    for row, want in enumerate(predicted):
        np.testing.assert_allclose(
            result.as_numpy("tags")[row, : lengths[row]], want["tags"], atol=1e-6
        )
        np.testing.assert_allclose(
            result.as_numpy("final_state")[row], want["final_state"], atol=1e-6
        )


@pytest.mark.parametrize("model", ["keras-bilstm", "int8-bilstm"])
@pytest.mark.parametrize("lengths_by", ["sequence_lengths", "pad-id"])
def test_maskless_model_takes_different_lengths_in_one_request(
    server: tuple[str, Path], model: str, lengths_by: str
) -> None:
    """Rows of one [n, T] tensor are n sequences of their own lengths, told by a
    `sequence_lengths` input or, since such a model reserves its pad id, by where it starts."""
    url, root = server
    spec = spec_of(root, model)
    name = spec.config.sequence_input
    dtype = spec.signature.inputs[name].dtype
    sequences = [[5, 9, 2, 44], [7, 1], [3] * 30, [11] * 9, [8]]
    lengths = np.array([len(s) for s in sequences], np.int32)
    filler = 17 if lengths_by == "sequence_lengths" else 0  # past each row: ignored either way
    ids = np.full((len(sequences), 30), filler, dtype)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = seq
    datatype = "INT32" if dtype == np.int32 else "INT64"
    inputs = [httpclient.InferInput(name, list(ids.shape), datatype)]
    inputs[0].set_data_from_numpy(ids)
    if lengths_by == "sequence_lengths":
        inputs.append(httpclient.InferInput("sequence_lengths", [len(sequences)], "INT32"))
        inputs[1].set_data_from_numpy(lengths)
    client = httpclient.InferenceServerClient(url=url.removeprefix("http://"))

    result = client.infer(model, inputs)

    (output,) = spec.config.outputs
    steps = result.as_numpy(output)
    predicted = httpx.post(f"{url}/predict", json={"model": model, "sequences": sequences})
    reference = Reference(spec)
    for row, (seq, want) in enumerate(zip(sequences, predicted.json()["outputs"], strict=True)):
        alone = reference(np.array(seq, dtype))[output]
        np.testing.assert_allclose(steps[row, : len(seq)], alone, atol=1e-5)
        np.testing.assert_allclose(steps[row, : len(seq)], want[output], atol=1e-6)
        assert not steps[row, len(seq) :].any()


def test_tritonclient_reads_every_error_message(server: tuple[str, Path]) -> None:
    """KServe v2's error form is `{"error": "<message>"}`: tritonclient raises it as an
    exception whose message (and `str`) says what was wrong, for a bad tensor, an unknown
    model and a refused load alike."""
    url, _ = server
    client = httpclient.InferenceServerClient(url=url.removeprefix("http://"))
    ids = httpclient.InferInput("input_ids", [1, 3], "INT64")
    ids.set_data_from_numpy(np.array([[5, 9, 99999]], np.int64))
    cases = [
        (lambda: client.infer("tiny-encoder", [ids]), "token ids must lie in [0, 2000)"),
        (lambda: client.get_model_metadata("no-such-model"), "unknown model 'no-such-model'"),
        (lambda: client.load_model("tiny-encoder"), "model control is off"),
    ]
    for call, says in cases:
        with pytest.raises(InferenceServerException) as raised:
            call()
        assert says in raised.value.message()
        assert says in str(raised.value)
    client.close()

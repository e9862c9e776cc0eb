"""Hostile clients and operators' hands, against a real server process with both protocols: a
name is one folder of the repository on every protocol (a path reaches nothing outside it, and
serves nothing under a forged name); names a client made up never enter the index; a name
with a line break cannot forge a log line; a served model's files changed under it, truncated
or rewritten in place, change neither its answers nor the process; and bodies built to be
costly to parse are refused at a cost bounded by their size, a health check answered
meanwhile."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np
import psutil
import pytest

from loadtest.process import free_port
from loadtest.pss import pss
from tests.helpers import copy_bundled, error_of, server_process

pytestmark = pytest.mark.slow  # the full tier: real server processes

grpcclient = pytest.importorskip("tritonclient.grpc")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

MODEL = "tiny-encoder"
TRAVERSALS = ["../outside/m", "/abs/m", "./m", "m/", "m//", "..", ".", "a" * 200, "x\r\ny"]
SEQUENCE = [5, 9, 2, 44, 7]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, Path, Path]]:
    """(HTTP url, gRPC client, repository, log) of a server with model control, a valid model
    lying beside its repository and at the root of the file system's view of `..`."""
    base = tmp_path_factory.mktemp("hostile")
    root = base / "models"
    root.mkdir()
    copy_bundled(root, MODEL)
    outside = base / "outside"
    outside.mkdir()
    shutil.copytree(root / MODEL, outside / "m")  # (a real model ../outside/m would find)
    port = free_port()
    flags = ("--model-control", "explicit", "--grpc-port", str(port))
    with server_process(root, *flags) as (_, url, log):
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        yield url, client, root, log
        client.close()


def index(url: str) -> list[dict[str, str]]:
    answer: list[dict[str, str]] = httpx.post(f"{url}/v2/repository/index").json()
    return answer


def predict(url: str, model: str = MODEL) -> np.ndarray:
    body = {"model": model, "sequences": [SEQUENCE], "outputs": ["sentence_embedding"]}
    answer = httpx.post(f"{url}/predict", json=body)
    assert answer.status_code == 200, answer.text
    return np.asarray(answer.json()["outputs"][0]["sentence_embedding"], np.float32)


@pytest.mark.parametrize("name", TRAVERSALS)
def test_a_path_is_no_model_name_on_either_protocol(
    served: tuple[str, Any, Path, Path], name: str
) -> None:
    url, client, _, log = served
    before = index(url)
    for call in (client.load_model, client.unload_model):
        with pytest.raises(InferenceServerException) as refused:
            call(name)
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "model name" in refused.value.message()
        assert "/tmp/" not in refused.value.message()  # no host path, whatever was asked
    for action in ("load", "unload"):
        answer = httpx.post(f"{url}/v2/repository/models/{quote(name, safe='')}/{action}")
        assert answer.status_code in (400, 404), answer.text  # (404: the router's, for a "/")
    assert index(url) == before
    assert httpx.post(f"{url}/predict", json={"model": name, "sequences": [[5]]}).status_code == 404
    lines = log.read_text().splitlines()
    assert not any(line.startswith("y") for line in lines)  # "x\r\ny" forged no line


def test_names_made_up_never_enter_the_index(served: tuple[str, Any, Path, Path]) -> None:
    url, client, _, _ = served
    before = index(url)
    for i in range(200):
        with pytest.raises(InferenceServerException) as refused:
            client.unload_model(f"made-up-{i}")
        assert refused.value.status() == "StatusCode.NOT_FOUND"
    assert httpx.post(f"{url}/v2/repository/models/made-up/unload").status_code == 404
    with pytest.raises(
        InferenceServerException, match="no model 'made-up' in the repository"
    ) as lacks:
        client.load_model("made-up")
    assert lacks.value.status() == "StatusCode.NOT_FOUND"
    assert index(url) == before


def test_files_changed_under_a_served_model_change_nothing(
    served: tuple[str, Any, Path, Path],
) -> None:
    """The operator's `cp` of another model's weights onto the served file, a truncation, and
    an in-place rewrite of the same size: the server answers as before, from its own copy,
    until the model is loaded again (and then from the new files)."""
    url, client, root, _ = served
    before = predict(url)
    weights = root / MODEL / "1" / "model.onnx.data"
    original = weights.read_bytes()
    weights.write_bytes(original[: len(original) // 3])  # truncated: a mapped file would SIGBUS
    np.testing.assert_array_equal(predict(url), before)
    flipped = np.frombuffer(original, np.uint8).copy()
    flipped[len(flipped) // 2 :] ^= 0x55  # the same size, other bytes (in place)
    with open(weights, "r+b") as file:
        file.write(flipped.tobytes())
    np.testing.assert_array_equal(predict(url), before)
    weights.write_bytes(original)
    client.load_model(MODEL)  # a load reads the files as they are now
    np.testing.assert_array_equal(predict(url), before)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"model": MODEL, "input": [None] * 200_000}),
        ("/v1/embeddings", {"model": MODEL, "input": [[[1]] * 100] * 2000}),
        ("/predict", {"model": MODEL, "sequences": [[[[1]]] * 100_000]}),
        (
            f"/v2/models/{MODEL}/infer",
            {
                "inputs": [
                    {
                        "name": "input_ids",
                        "datatype": "INT64",
                        "shape": [1, 99_000],
                        "data": [[[1]]] * 99_000,
                    }
                ]
            },
        ),
    ],
    ids=["v1-nulls", "v1-nested", "predict-nested", "v2-nested"],
)
def test_a_costly_body_is_refused_within_bounds(
    served: tuple[str, Any, Path, Path], path: str, body: dict[str, Any]
) -> None:
    """About 1 MB built to be expensive (200,000 nulls where texts go: 3.2 s of the event loop
    and 612 MiB before; nested lists where numbers go): refused with what is wrong, a health
    check sent meanwhile answered, and the process no larger for it than a few times the
    body."""
    url, _, _, _ = served
    process = next(p for p in psutil.Process().children(recursive=True) if "serve" in p.cmdline())
    before = pss(process.pid)
    with httpx.Client(base_url=url, timeout=60) as client, ThreadPoolExecutor(2) as pool:
        refused = pool.submit(client.post, path, json=body)
        health = pool.submit(client.get, "/v2/health/live")
        assert health.result().status_code == 200
        assert refused.result().status_code in (400, 422), refused.result().text
    code, message = error_of(refused.result())
    assert code in ("malformed", "invalid_input")
    counted = ("lists, more than", "values, more than")  # refused by a count, before parsing
    assert any(says in message for says in (*counted, "nest", "input[0]"))
    grown = pss(process.pid) - before
    assert grown < 64 * 2**20, f"Pss grew {grown / 2**20:.0f} MiB"

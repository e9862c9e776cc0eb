"""deploy/kserve: every manifest parsed strictly into the KServe SDK's own model classes (the
`kserve` package, with the Kubernetes client's for the pod's parts), agreeing with the server,
and the serving runtime's container command run for real on folders laid out as KServe's
storage initializer lays out /mnt/models."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from bucketserve.process.cli import PROBE_PATHS
from loadtest.process import free_port, running_process
from tests.helpers import MODELS, ROOT
from tests.test_deploy import SETTINGS_ENV, _routes, read_dockerfile

KSERVE = ROOT / "deploy" / "kserve"
PARSED = ("ClusterServingRuntime", "InferenceService")  # the kinds the KServe SDK has classes for


def docs() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(KSERVE.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
    ]


def manifest(kind: str, name: str | None = None) -> dict[str, Any]:
    return next(d for d in docs() if d["kind"] == kind and name in (None, d["metadata"]["name"]))


def parsed(documents: list[dict[str, Any]]) -> list[str | None]:
    """What the KServe SDK's classes make of each document (tests/kserve_parse.py)."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.kserve_parse"],
        input=json.dumps(documents),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    verdicts: list[str | None] = json.loads(result.stdout)
    return verdicts


def test_manifests_parse_into_the_kserve_sdk_classes() -> None:
    documents = [d for d in docs() if d["kind"] in PARSED]
    assert sorted(d["metadata"]["name"] for d in documents) == [
        "bucketserve",
        "minilm",
        "minilm-raw",
    ]
    assert parsed(documents) == [None] * len(documents)


def test_the_strict_parse_can_fail() -> None:
    typo = manifest("ClusterServingRuntime")
    typo["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {"path": "/", "port": 1}
    wrong_type = manifest("ClusterServingRuntime")
    wrong_type["spec"]["supportedModelFormats"][0]["autoSelect"] = "yes"
    nameless = manifest("ClusterServingRuntime")
    del nameless["spec"]["containers"][0]["name"]  # (a required field)
    typo_said, type_said, name_said = parsed([typo, wrong_type, nameless])
    assert typo_said is not None
    assert "httpGett" in typo_said
    assert type_said is not None
    assert "autoSelect: 'yes' is not a bool" in type_said
    assert name_said is not None
    assert "V1Container\nname\n  Field required" in name_said


def container() -> dict[str, Any]:
    (server,) = manifest("ClusterServingRuntime")["spec"]["containers"]
    return server  # type: ignore[no-any-return]


def flag(name: str) -> str:
    return next(a.split("=", 1)[1] for a in container()["args"] if a.startswith(f"--{name}="))


def test_the_runtime_agrees_with_the_server_and_the_image() -> None:
    runtime, server = manifest("ClusterServingRuntime"), container()
    routes = _routes()
    assert server["args"][:2] == ["bucketserve", "serve"]
    annotations = runtime["spec"]["annotations"]
    assert annotations["prometheus.kserve.io/port"] == flag("port") == "8080"  # KServe's port
    assert annotations["prometheus.kserve.io/path"] in routes
    assert server["readinessProbe"]["httpGet"] == {"path": PROBE_PATHS["ready"], "port": 8080}
    assert server["livenessProbe"]["httpGet"] == {"path": PROBE_PATHS["live"], "port": 8080}
    env = {e["name"]: e["value"] for e in server["env"]}
    assert set(env) <= SETTINGS_ENV
    cpus = float(server["resources"]["limits"]["cpu"])
    assert int(env["BUCKETSERVE_INSTANCES"]) * int(env["BUCKETSERVE_INTRA_OP_THREADS"]) == cpus
    # A read-only root: the one place the server writes is a volume of its own.
    assert server["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
    assert mounts[env["BUCKETSERVE_CACHE_DIR"]] in [v["name"] for v in runtime["spec"]["volumes"]]
    user = read_dockerfile()["server"].last("USER")
    assert server["securityContext"]["runAsUser"] == int(user or 0)
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    for isvc in (d for d in docs() if d["kind"] == "InferenceService"):
        model = isvc["spec"]["predictor"]["model"]
        assert model["runtime"] == runtime["metadata"]["name"]
        assert model["modelFormat"]["name"] in formats
    serverless = manifest("InferenceService", "minilm")["spec"]["predictor"]
    assert serverless["containerConcurrency"] == 0  # no cap that keeps batches at one
    raw = manifest("InferenceService", "minilm-raw")
    assert raw["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "external"
    (grpc,) = raw["spec"]["predictor"]["model"]["ports"]
    assert (grpc["name"], str(grpc["containerPort"])) == ("h2c", flag("grpc-port"))
    scaled = manifest("ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == raw["metadata"]["name"] + "-predictor"
    assert "bucketserve_queue_depth" in scaled["spec"]["triggers"][0]["metadata"]["query"]


def read_only(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["one model", "repository"])
def test_the_runtime_command_serves_what_the_initializer_leaves(
    tmp_path: Path, layout: str
) -> None:
    """The container's args as KServe runs them ({{.Name}} the InferenceService's name),
    on /mnt/models as the storage initializer leaves it (read-only), listening on 127.0.0.1."""
    mnt = tmp_path / "mnt" / "models"
    if layout == "one model":
        shutil.copytree(MODELS / "tiny-encoder", mnt)
        served = "encoder-isvc"
    else:
        shutil.copytree(MODELS / "tiny-encoder", mnt / "tiny-encoder")
        shutil.copytree(MODELS / "tiny-lstm", mnt / "tiny-lstm")
        served = "tiny-encoder"
    read_only(mnt)
    grpc_port = free_port()
    args = [
        re.sub(r"\{\{\.Name\}\}", "encoder-isvc", a)
        .replace("/mnt/models", str(mnt))
        .replace("--host=0.0.0.0", "--host=127.0.0.1")
        .replace("--grpc-port=9000", f"--grpc-port={grpc_port}")
        for a in container()["args"]
        if not a.startswith("--port=")  # (the test's own free port instead)
    ]
    command = [str(Path(sys.executable).parent / args[0]), *args[1:]]
    env = {e["name"]: e["value"] for e in container()["env"]}
    env["BUCKETSERVE_CACHE_DIR"] = str(tmp_path / "cache")
    with running_process(command, log_path=tmp_path / "server.log", env={**os.environ, **env}) as (
        _,
        url,
    ):
        assert httpx.get(url + container()["readinessProbe"]["httpGet"]["path"]).status_code == 200
        body = {
            "inputs": [
                {"name": "input_ids", "datatype": "INT64", "shape": [1, 3], "data": [5, 9, 2]}
            ]
        }
        answer = httpx.post(f"{url}/v2/models/{served}/infer", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model_name"] == served
        # KServe's own client, as a transformer or a graph in front of the runtime calls it
        # (its body repeats model_name), JSON and binary: the same numbers
        client = subprocess.run(
            [sys.executable, "-m", "tests.kserve_client", url, served],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert client.returncode == 0, client.stderr[-3000:]
        expected = {o["name"]: o["data"] for o in answer.json()["outputs"]}
        for outputs in json.loads(client.stdout):
            for name, data in expected.items():
                np.testing.assert_allclose(np.ravel(outputs[name]), data, rtol=1e-6)
        index = httpx.post(f"{url}/v2/repository/index").json()
        expected = ["encoder-isvc"] if layout == "one model" else ["tiny-encoder", "tiny-lstm"]
        assert [m["name"] for m in index] == expected

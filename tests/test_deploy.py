"""Deployment without a Docker engine: the Dockerfile agrees with the project and lints clean,
its build and start steps serve minilm from fresh virtual environments, the Kubernetes
manifests validate offline against the Kubernetes schemas and agree with the server, and the
compose file wires the same health check, port and metrics path."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bucketserve.core.engine import Engine
from bucketserve.core.registry import Registry
from bucketserve.edges.http.app import create_app
from bucketserve.process.cli import PROBE_PATHS, parser
from bucketserve.settings import Settings, env_name
from deploy.image.smoke import (
    dockerignore_rules,
    env_of,
    exec_form,
    healthcheck_command,
    in_context,
    read_dockerfile,
)
from loadtest.process import running_server
from modelgen.build import RECIPES
from tests.fakes import fake_model
from tests.helpers import ROOT, copy_bundled

K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.33"
SETTINGS_ENV = {env_name(f.name) for f in fields(Settings)}


def _routes() -> set[str]:
    """Every path the app serves: its API routes and what it mounts (/metrics)."""
    app = create_app(Engine(Registry({"fake": fake_model()[0]})))
    return set(app.openapi()["paths"]) | {getattr(route, "path", "") for route in app.routes}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _manifest(kind: str) -> dict[str, Any]:
    return next(
        doc for path in sorted(K8S.glob("*.yaml")) for doc in _docs(path) if doc["kind"] == kind
    )


def test_dockerfile_agrees_with_the_project() -> None:
    stages = read_dockerfile()
    assert list(stages)[-1] == "server"  # the default target is the server
    assert {"build", "runtime", "loadtest"} <= set(stages)
    server, env = stages["server"], env_of(stages, "server")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())

    # Entry point: the project's console script and a real subcommand.
    command = exec_form(server.last("CMD") or "")
    assert command[0] in pyproject["project"]["scripts"]
    assert parser().parse_args(command[1:]).run.__name__ == "_serve"
    # Health: the CLI probe of the readiness route, which the app serves.
    health = healthcheck_command(server.last("HEALTHCHECK") or "")
    assert health[0] == command[0]
    assert parser().parse_args(health[1:]).what == "ready"
    assert PROBE_PATHS["ready"] in _routes()
    # Ports: EXPOSE is where the server listens (HTTP, then gRPC), on every interface.
    assert server.last("EXPOSE") == f"{env['BUCKETSERVE_PORT']} {env['BUCKETSERVE_GRPC_PORT']}"
    assert env["BUCKETSERVE_HOST"] == "0.0.0.0"
    # Every BUCKETSERVE_* variable is a real setting, and their values parse.
    bucketserve_env = {k: v for k, v in env.items() if k.startswith("BUCKETSERVE_")}
    assert set(bucketserve_env) <= SETTINGS_ENV
    settings = Settings.from_env(bucketserve_env)
    assert (ROOT / "models" / str(settings.default_model) / "config.toml").is_file()
    assert str(settings.models) == "/app/models"
    # Non-root, and a graceful stop.
    assert server.last("USER") not in (None, "root", "0")
    assert server.last("STOPSIGNAL") == "SIGTERM"

    # Install: the build stage installs the export extra and builds minilm; the runtime stage
    # installs the wheel only.
    build_script = (ROOT / "deploy/image/build.sh").read_text()
    assert "'.[export]'" in build_script
    assert "export" in pyproject["project"]["optional-dependencies"]
    assert "models build minilm" in build_script
    assert "minilm" in RECIPES
    runs = [v for stage in stages.values() for i, v in stage.instructions if i == "RUN"]
    assert any(r.startswith("sh deploy/image/build.sh") for r in runs)
    assert any(r.startswith("sh deploy/image/install.sh") for r in runs)
    assert "[export]" not in (ROOT / "deploy/image/install.sh").read_text()
    # Everything COPY'd from the context exists and gets through .dockerignore.
    rules = dockerignore_rules()
    for stage in stages.values():
        for instruction, value in stage.instructions:
            if instruction == "COPY" and not value.startswith("--from"):
                for source in value.split()[:-1]:
                    assert (ROOT / source).exists(), source
                    assert in_context(source.rstrip("/"), rules), source
    assert not in_context(".venv", rules)
    assert not in_context(".git", rules)
    assert not in_context("models/minilm/1/model.onnx", rules)


def test_dockerfile_lints_clean() -> None:
    lint = subprocess.run(
        [str(Path(sys.executable).parent / "hadolint"), str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.slow
@pytest.mark.timeout(1800)  # (above its own 1500 s: fresh environments on a busy machine)
def test_image_steps_serve_minilm_from_fresh_environments(tmp_path: Path) -> None:
    """deploy/image/smoke.py: build stage, runtime install, CMD, HEALTHCHECK, requests, stop."""
    smoke = subprocess.run(
        [sys.executable, "-m", "deploy.image.smoke", "--workdir", str(tmp_path / "image")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-5000:]
    assert "CPU-only onnxruntime" in smoke.stderr  # the CPU image does not carry CUDA kernels
    assert "served minilm from the image's steps (HTTP, gRPC)" in smoke.stderr


@pytest.mark.slow
def test_probe_command_reports_health(tmp_models: Path) -> None:
    def probe(what: str, port: int) -> int:
        return subprocess.run(
            [sys.executable, "-m", "bucketserve", "probe", what, "--port", str(port)],
            cwd=ROOT,
            capture_output=True,
            check=False,
        ).returncode

    copy_bundled(tmp_models, "tiny-encoder")
    with running_server(tmp_models, log_path=tmp_models.parent / "server.log") as (_, url):
        port = int(url.rsplit(":", 1)[1])
        assert probe("ready", port) == 0
        assert probe("live", port) == 0
    assert probe("ready", port) == 1  # nothing listens any more


@pytest.mark.parametrize("path", sorted(K8S.glob("*.yaml")), ids=lambda p: p.name)
def test_kubernetes_manifests_validate_offline(path: Path) -> None:
    for doc in _docs(path):
        if doc["kind"] == "Kustomization":  # kustomize's own file, not an API object
            assert all((K8S / name).is_file() for name in doc["resources"])
            continue
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_validator_can_fail() -> None:
    broken = _manifest("Deployment")
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_kubernetes_manifests_agree_with_the_server() -> None:
    deployment, service = _manifest("Deployment"), _manifest("Service")
    config = _manifest("ConfigMap")["data"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    routes = _routes()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = env_of(read_dockerfile(), "server")
    assert ports["http"] == int(env["BUCKETSERVE_PORT"])
    assert ports["grpc"] == int(env["BUCKETSERVE_GRPC_PORT"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in routes, probe
        assert get["path"] in PROBE_PATHS.values(), probe
        assert get["port"] in ports
    assert container["readinessProbe"]["httpGet"]["path"] == PROBE_PATHS["ready"]
    assert container["livenessProbe"]["httpGet"]["path"] == PROBE_PATHS["live"]
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        "http": "http",
        "grpc": "grpc",
    }
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    # The ConfigMap holds real settings; the grace period covers preStop plus the drain.
    assert set(config) <= SETTINGS_ENV
    settings = Settings.from_env(config)
    # Every thread the server runs ONNX Runtime on has a core of the pod's CPU limit.
    assert settings.instances
    assert settings.intra_op_threads
    cpus = float(container["resources"]["limits"]["cpu"])
    assert settings.instances * settings.intra_op_threads == cpus
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pre_stop + settings.drain_timeout_s
    assert pod["securityContext"]["runAsUser"] == int(read_dockerfile()["server"].last("USER") or 0)
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] in routes
    hpa = _manifest("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]


def _seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+)s", text)
    assert match, text
    return float(match.group(1))


def test_compose_wires_server_prometheus_and_locust() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    stages = read_dockerfile()
    health = healthcheck_command(stages["server"].last("HEALTHCHECK") or "")
    assert compose["server"]["healthcheck"]["test"] == ["CMD", *health]
    assert _seconds(compose["server"]["stop_grace_period"]) > Settings().drain_timeout_s
    assert compose["locust"]["build"]["target"] in stages
    assert "--host=http://server:8000" in compose["locust"]["command"]
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["metrics_path"] in _routes()
    assert job["static_configs"][0]["targets"] == [f"server:{Settings().port}"]
    mounted = compose["prometheus"]["volumes"][0].split(":")[0]
    assert (ROOT / mounted).resolve() == (ROOT / "deploy/prometheus/prometheus.yml").resolve()
    # The locust options exist: the locustfile's own, and locust's.
    locustfile = (ROOT / "loadtest/locustfile.py").read_text()
    for option in compose["locust"]["command"]:
        name = option.split("=")[0]
        assert f'"{name}"' in locustfile or name in (
            "--host",
            "--users",
            "--spawn-rate",
            "--autostart",
        )

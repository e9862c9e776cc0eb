"""The Grafana dashboard and the KEDA autoscaler read the server's metrics by name: every query
must name metrics the server really exports, so renaming one breaks this test, not a dashboard
in production. Also: compose provisions Grafana on its Prometheus, and the KEDA overlay
replaces the CPU autoscaler on the same Deployment."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from bucketserve.metrics import Metrics
from tests.helpers import ROOT

GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "bucketserve.json"
KEDA = ROOT / "deploy" / "k8s" / "keda"
METRIC = re.compile(r"\bbucketserve_[a-z_]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported_names() -> set[str]:
    """Every series name the server's /metrics can hold."""
    names = set()
    for family in Metrics().registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def unknown_metrics(queries: list[str]) -> list[str]:
    """Names in `queries` that the server does not export, and queries that name none."""
    exported = exported_names()
    problems = []
    for query in queries:
        named = METRIC.findall(query)
        if not named:
            problems.append(f"names no bucketserve metric: {query}")
        problems += [f"{name} (in {query})" for name in named if name not in exported]
    return problems


def dashboard_queries() -> dict[str, list[str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {p["title"]: [t["expr"] for t in p["targets"]] for p in panels}


def test_every_dashboard_query_names_exported_metrics() -> None:
    queries = dashboard_queries()
    assert unknown_metrics([q for qs in queries.values() for q in qs]) == []
    # what an operator looks for, each on a panel of its own
    titles = " | ".join(queries).lower()
    for topic in (
        "throughput",
        "latency",
        "queue depth",
        "batch size",
        "compute time",
        "padding",
        "bound keys",
        "rejections",
        "cache hit rate",
        "cache bytes",
        "priority",
        "tenant",
    ):
        assert topic in titles, topic


def test_the_name_check_catches_a_renamed_metric() -> None:
    renamed = "sum(rate(bucketserve_request_total[1m]))"  # (it is bucketserve_requests_total)
    assert unknown_metrics([renamed]) == [f"bucketserve_request_total (in {renamed})"]
    assert unknown_metrics(["sum(rate(http_requests_total[1m]))"]) != []


def test_compose_provisions_grafana_on_its_prometheus() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    grafana = compose["grafana"]
    mounts = dict(v.removesuffix(":ro").split(":") for v in grafana["volumes"])
    assert all((ROOT / source).is_dir() for source in mounts)
    provisioning = ROOT / next(s for s, t in mounts.items() if t == "/etc/grafana/provisioning")
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    prometheus_port = compose["prometheus"]["ports"][0].split(":")[1]
    assert source["url"] == f"http://prometheus:{prometheus_port}"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "bucketserve.yml").read_text())[
        "providers"
    ]
    dashboards = next(s for s, t in mounts.items() if t == provider["options"]["path"])
    assert (ROOT / dashboards / DASHBOARD.name).is_file()
    uids = {
        t["datasource"]["uid"]
        for p in json.loads(DASHBOARD.read_text())["panels"]
        for t in p["targets"]
    }
    assert uids == {source["uid"]}


def _yaml(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def test_keda_overlay_scales_the_deployment_on_the_queue() -> None:
    kustomization = _yaml(KEDA / "kustomization.yaml")
    assert all((KEDA / r).exists() for r in kustomization["resources"])
    (patch,) = kustomization["patches"]
    deleted = yaml.safe_load(patch["patch"])
    hpa = _yaml(ROOT / "deploy" / "k8s" / "hpa.yaml")
    assert deleted["$patch"] == "delete"
    assert (deleted["kind"], deleted["metadata"]["name"]) == (hpa["kind"], hpa["metadata"]["name"])

    scaled = _yaml(KEDA / "scaledobject.yaml")
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    deployment = _yaml(ROOT / "deploy" / "k8s" / "deployment.yaml")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaled["spec"]["minReplicaCount"] == hpa["spec"]["minReplicas"]
    assert scaled["spec"]["maxReplicaCount"] == hpa["spec"]["maxReplicas"]
    triggers = scaled["spec"]["triggers"]
    queries = [t["metadata"]["query"] for t in triggers if t["type"] == "prometheus"]
    assert unknown_metrics(queries) == []
    assert any("bucketserve_queue_depth" in q for q in queries)
    for trigger in triggers:
        if trigger["type"] == "prometheus":
            float(trigger["metadata"]["threshold"])  # KEDA wants a number, as a string
            assert trigger["metricType"] in ("AverageValue", "Value")
    # the queries select the job that deploy/prometheus scrapes the server under
    (job,) = _yaml(ROOT / "deploy" / "prometheus" / "prometheus.yml")["scrape_configs"]
    assert all(f'job="{job["job_name"]}"' in q for q in queries)
    assert {"cpu"} <= {t["type"] for t in triggers}


@pytest.mark.parametrize("path", sorted(GRAFANA.rglob("*.yml")), ids=lambda p: p.name)
def test_provisioning_files_are_grafana_version_1(path: Path) -> None:
    assert _yaml(path)["apiVersion"] == 1

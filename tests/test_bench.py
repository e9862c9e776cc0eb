"""The benchmark runs end to end on the tiny model in smoke mode and writes its files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from bucketserve.loading import ModelSpec
from bucketserve.loading.importer import import_model
from loadtest.bench import OVER_OPENAI, thread_layouts, token_ids_over_grpc, workload
from loadtest.lengths import LengthDistribution
from tests.exports import write_export
from tests.helpers import ROOT

pytestmark = pytest.mark.slow  # the full tier: real server processes

pytest.importorskip("matplotlib")


@pytest.mark.slow
def test_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtest.bench",
            "--smoke",
            "--model",
            "tiny-encoder",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=240,
    )
    report = json.loads((out / "bench.json").read_text())
    names = [row["name"] for row in report["servers"]]
    assert names == [
        "bucketing",
        "bucketing, power-of-two edges",
        "mutable",
        "batching off",
        "one bucket",
        "bucketing, one instance",
        "bucketing, no lone-batch threads",
        "bucketing over gRPC (token ids)",
        "bucketing over HTTP (token ids, same process)",
        "naive (one run per request)",
    ]
    assert report["payload"] == "tokens"  # tiny-encoder has no tokenizer
    ceiling = report["ceiling"]
    bests = ceiling["seq_per_s_spread"]["rounds"]
    assert min(bests) <= ceiling["seq_per_s"] <= max(bests)
    # Each round's ceiling is its best layout, so no layout's median beats the ceiling's.
    # every thread layout worth trying on this machine, at batches of 4 and of 32 (the max)
    assert len(ceiling["layouts"]) == 2 * len(thread_layouts(report["machine"]["cores"]))
    assert max(ceiling["layouts"].values()) <= ceiling["seq_per_s"]
    for row in report["servers"]:
        assert row["seq_per_s"] > 0
        turns = row["seq_per_s_spread"]["rounds"]
        assert len(turns) == report["rounds"] == 2  # every server took a turn in every round
        assert min(turns) <= row["seq_per_s"] <= max(turns)
        assert row["peak_pss_mib"] > 0
        assert len(row["loads"]) == 4
        assert row["lone"]["requests"] > 0
        assert row["lone"]["p50_ms"] > 0
    rows = {row["name"]: row for row in report["servers"]}
    assert rows["naive (one run per request)"]["padding_waste"] is None  # it has no metrics
    assert all(0 <= rows[name]["padding_waste"] < 1 for name in names[:-1])
    assert rows["batching off"]["padding_waste"] == 0  # one sequence per batch, at its length
    assert len(report["targets"]) == 5
    # the gRPC row: every call answered, from the same process as its HTTP twin. (In smoke
    # mode saturation is a few seconds' estimate on cores the suite shares: an open loop at
    # 75% of it can outrun the server and use up the client's connections, which is the load
    # generator's limit, not an answer the server gave.)
    over_grpc, over_http = rows[names[7]], rows[names[8]]
    assert over_grpc["saturation_errors"] == {}
    for load in over_grpc["loads"]:
        assert set(load["errors"]) <= {"client: out of connections"}, load["errors"]
    assert over_grpc["flags"] == over_http["flags"]
    assert over_grpc["peak_pss_mib"] == over_http["peak_pss_mib"]
    protocols = report["grpc_against_http"]
    assert protocols["seq_per_s_ratio"] == over_grpc["seq_per_s"] / over_http["seq_per_s"]
    table = (out / "bench.md").read_text()
    assert "| engine ceiling" in table
    assert "- gRPC against HTTP" in table
    assert (out / "bench.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_bench_smoke_on_text_has_the_openai_row(tmp_path: Path) -> None:
    """On a model with a tokenizer and an embedding, the bucketing server is also sent the
    same texts at /v1/embeddings: a row, and the route's cost as a ratio to /predict's."""
    models = tmp_path / "models"
    import_model(write_export(tmp_path / "export"), models, "st")
    out = tmp_path / "bench"
    command = [sys.executable, "-m", "loadtest.bench", "--smoke", "--models", str(models)]
    command += ["--model", "st", "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=240)
    report = json.loads((out / "bench.json").read_text())
    assert report["payload"] == "text"
    rows = {row["name"]: row for row in report["servers"]}
    openai, predict = rows[OVER_OPENAI], rows["bucketing"]
    assert openai["saturation_errors"] == {}
    assert openai["lone"]["requests"] > 0
    assert openai["flags"] == predict["flags"]  # the same server process
    route = report["openai_against_predict"]
    assert route["seq_per_s_ratio"] == openai["seq_per_s"] / predict["seq_per_s"]
    assert "- /v1/embeddings against /predict" in (out / "bench.md").read_text()


def test_grpc_requests_are_what_tritons_client_sends(minilm_spec: ModelSpec) -> None:
    """The gRPC rows' requests parse as Triton's own `ModelInferRequest`: the model, one raw
    INT64 row per sequence holding its token ids, and the pooled output asked for."""
    service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
    work = workload(minilm_spec, 20, "text", seed=5)
    for raw, ids in zip(
        token_ids_over_grpc(minilm_spec, work.sequences), work.sequences, strict=True
    ):
        request = service_pb2.ModelInferRequest.FromString(raw)
        assert request.model_name == "minilm"
        [tensor] = request.inputs
        assert (tensor.name, tensor.datatype, list(tensor.shape)) == (
            "input_ids",
            "INT64",
            [1, len(ids)],
        )
        np.testing.assert_array_equal(np.frombuffer(request.raw_input_contents[0], np.int64), ids)
        assert [o.name for o in request.outputs] == ["sentence_embedding"]


def test_text_workload_tokenises_to_the_drawn_lengths(minilm_spec: ModelSpec) -> None:
    """The bench's text payloads: each text tokenises (with the model's tokenizer, as the server
    does) to about the length drawn for it, and the bodies carry the texts, not token ids."""
    work = workload(minilm_spec, 300, "text", seed=3)
    drawn = LengthDistribution.parse("natural", minilm_spec.config.batching.longest).sample(
        np.random.default_rng(3), 300
    )
    tokens = np.array([len(s) for s in work.sequences])
    assert np.abs(tokens - drawn).max() <= 3  # decoding can merge or split a piece or two
    assert np.corrcoef(tokens, drawn)[0, 1] > 0.99
    assert len(set(work.bodies)) == 300
    body = orjson.loads(work.bodies[0].split(b"\r\n\r\n", 1)[1])
    assert isinstance(body["text"][0], str)
    assert body["outputs"] == ["sentence_embedding"]
    # the same texts, to /v1/embeddings, as the openai SDK sends them
    assert len(work.embeddings) == 300
    head, raw = work.embeddings[0].split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v1/embeddings ")
    assert orjson.loads(raw) == {
        "model": "minilm",
        "input": body["text"][0],
        "encoding_format": "base64",
    }


@pytest.mark.slow
def test_pad_safe_bench_serves_the_three_ways() -> None:
    """The benchmark's three names of one BiGRU are served as it says, and answered."""
    result = subprocess.run(
        [sys.executable, "-m", "loadtest.pad_safe_bench", "--clients", "2", "--seconds", "0.5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    rows = [line.split("|")[1:-1] for line in result.stdout.splitlines()[2:]]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        ("bigru", "buckets"),
        ("bigru-exact", "exact-length"),
        ("bigru-single", "single"),
    ]
    assert all(float(r[2]) > 0 for r in rows)
    assert "errors" not in result.stdout


@pytest.mark.slow
def test_revisions_measures_a_revision_against_the_tree() -> None:
    """`loadtest.revisions` in seconds: HEAD against the working tree, a ratio printed, and
    its git worktree gone afterwards (those a developer keeps are left as they were)."""

    def worktrees() -> list[str]:
        listed = subprocess.run(
            ["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        return listed.stdout.strip().splitlines()

    before = worktrees()
    result = subprocess.run(
        [sys.executable, "-m", "loadtest.revisions", "HEAD", "--rounds", "2", "--seconds", "0.5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=240,
    )
    assert "working tree" in result.stdout
    assert re.search(r": \d+\.\d{3}x \(rounds \d+\.\d{3}, \d+\.\d{3}\)", result.stdout)
    assert worktrees() == before


def test_the_scheduling_bench_reads_the_server_metrics_as_prometheus_would() -> None:
    """Its figures come from two scrapes: a counter's growth, summed over the series whose
    labels match, and a histogram's quantile, interpolated in its buckets."""
    from loadtest.scheduling_bench import metric, quantile

    before = (
        'x_bucket{bucket="16",le="0.1",model="m"} 10\n'
        'x_bucket{bucket="16",le="0.5",model="m"} 10\n'
        'x_bucket{bucket="16",le="+Inf",model="m"} 10\n'
        'x_count{bucket="16",model="m"} 10\n'
        'y_total{tenant="a"} 5\ny_total{tenant="b"} 7\n'
    )
    after = (
        'x_bucket{bucket="16",le="0.1",model="m"} 60\n'
        'x_bucket{bucket="16",le="0.5",model="m"} 110\n'
        'x_bucket{bucket="16",le="+Inf",model="m"} 110\n'
        'x_count{bucket="16",model="m"} 110\n'
        'y_total{tenant="a"} 9\ny_total{tenant="b"} 8\n'
    )
    assert metric(after, "y_total", tenant="a") - metric(before, "y_total", tenant="a") == 4
    assert metric(after, "y_total") == 17
    assert quantile(before, after, "x", 0.5) == pytest.approx(0.1)  # 50 of 100 by 0.1 s
    assert quantile(before, after, "x", 0.75) == pytest.approx(0.3)  # halfway to 0.5 s


def test_the_bulk_bench_runs_a_job_online_and_under_live_traffic(
    minilm_spec: ModelSpec, tmp_path: Path
) -> None:
    """`loadtest.bulk` on few texts: every part measured, each job complete (it raises if
    not), the ratios and the live bound reported."""
    report_path = tmp_path / "bulk.json"
    small = ["--texts", "100", "--rounds", "1", "--seconds", "1", "--ceiling-seconds", "0.3"]
    command = [sys.executable, "-m", "loadtest.bulk", *small, "--json", str(report_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["texts"] == 100
    assert report["job_over_ceiling"] > 0
    assert report["live_with_job"]["answered"] > 0
    assert report["live_with_job"]["errors"] == {}
    assert "of the ceiling" in done.stdout


def test_the_ray_bench_measures_serving_and_a_corpus(
    minilm_spec: ModelSpec, tmp_path: Path
) -> None:
    """`loadtest.ray_bench` on a few clients and texts: alone, through Ray's proxy and with
    direct ingress, each with its batches and rate; the corpus answered whole both ways (it
    raises if not)."""
    pytest.importorskip("ray.serve")
    report_path = tmp_path / "ray.json"
    small = ["--clients", "4", "--requests", "2", "--texts", "100"]
    command = [sys.executable, "-m", "loadtest.ray_bench", *small, "--json", str(report_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert set(report["serving"]) == {"alone", "proxy", "direct_ingress"}
    for row in report["serving"].values():
        assert row["mean_batch"] >= 1
        assert row["requests_per_s"] > 0
    assert report["corpus"]["ray_data_per_s"] > 0
    assert "Ray Data on two nodes" in done.stdout

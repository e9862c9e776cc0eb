"""bucketserve on a Ray cluster simulated on loopback (`ray.cluster_utils.Cluster`, as Ray tests
itself): a head that holds Serve's controller and its one HTTP proxy, and three worker nodes of
one CPU each, so that two replicas of one CPU land on distinct nodes and a third node is spare.

Every route family through the proxy answers as a server alone; a node SIGKILLed under load
loses no request that its client sends once more, and both replicas serve again; a scale-down
and a rolling update under load lose nothing at all; the mean batch through Ray holds to that
of the server alone under the same load; Ray's health checks and metrics read the engine; a
corpus embeds over two nodes with Ray Data, every vector the server's.
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from loadtest.ray_bench import Loopback, mean_batch
from loadtest.ray_bench import cluster as loopback
from tests.helpers import copy_bundled, server_process, until

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

APP = "bucketserve"
TEXTS = [f"text number {i} about {'buckets and batches ' * (i % 7)}".strip() for i in range(64)]
# Passages (~80 tokens), none alike: the model's work, not the proxy's, is what a request costs
PASSAGES = [" ".join(TEXTS[(i + k) % len(TEXTS)] for k in range(6)) + f" ({i})" for i in range(448)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Loopback]:
    with loopback(3) as made:
        yield made


@pytest.fixture(scope="module")
def models(task_repository: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The task models (a reranker, a classifier, an embedder, SPLADE, a tagger, ColBERT)
    and tiny-encoder (token ids); the embedder is the default."""
    root = tmp_path_factory.mktemp("ray") / "models"
    shutil.copytree(task_repository.models, root)
    copy_bundled(root, "tiny-encoder")
    (root / "repository.toml").write_text('default_model = "embedder"\n')
    return root


def deploy(cluster: Loopback, **args: Any) -> None:
    """The application, as `serve run bucketserve.ray:app k=v ...` deploys it (every value a
    string, as the command line gives it), once every replica is running."""
    from bucketserve.ray import app

    serve.run(app({k: str(v) for k, v in args.items()}), name=APP, route_prefix="/")
    wanted = args.get("num_replicas", 1)
    wanted = args.get("min_replicas", 1) if wanted == "auto" else wanted
    until(lambda: running(cluster) >= int(wanted), "replicas running")


def running(cluster: Loopback) -> int:
    application = serve.status().applications.get(APP)
    if application is None:
        return 0
    states = application.deployments["bucketserve"].replica_states
    return int(states.get("RUNNING", 0))


def same(a: Any, b: Any, where: str = "") -> None:
    """Equal answers: numbers within 1e-5, the ids and times a server makes for each answer
    left out."""
    if isinstance(a, dict):
        assert isinstance(b, dict), where
        keys = set(a) - {"id", "created", "request_id"}
        assert keys == set(b) - {"id", "created", "request_id"}, where
        for key in keys:
            same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list), where
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}.{i}")
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5), (where, a, b)
    else:
        assert a == b, (where, a, b)


# One request of each route family: bucketserve's, KServe v2's, OpenAI's, TEI's, Cohere's,
# vLLM's, the task routes, and the reads (models, health).
FAMILIES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/predict", {"model": "tiny-encoder", "sequences": [[5, 9, 2], [7, 1]]}),
    (
        "POST",
        "/v2/models/tiny-encoder/infer",
        {
            "inputs": [
                {
                    "name": "input_ids",
                    "shape": [2, 3],
                    "datatype": "INT64",
                    "data": [5, 9, 2, 7, 1, 0],
                },
                {
                    "name": "attention_mask",
                    "shape": [2, 3],
                    "datatype": "INT64",
                    "data": [1, 1, 1, 1, 1, 0],
                },
            ],
            "outputs": [{"name": "sentence_embedding"}],
        },
    ),
    ("POST", "/v1/embeddings", {"model": "embedder", "input": ["a sentence", "another one"]}),
    ("POST", "/embed", {"inputs": ["a sentence", "another"]}),
    ("POST", "/v1/embed", {"model": "embedder", "texts": ["a"], "input_type": "search_query"}),
    ("POST", "/rerank", {"model": "reranker", "query": "a bucket", "documents": ["b", "c d"]}),
    ("POST", "/v1/score", {"model": "reranker", "text_1": "a bucket", "text_2": ["b", "c"]}),
    ("POST", "/classify", {"model": "sentiment", "inputs": "the model is fast"}),
    ("POST", "/classify_tokens", {"model": "tagger", "inputs": "the model is fast"}),
    ("POST", "/embed_sparse", {"model": "splade", "inputs": "a sparse sentence"}),
    ("POST", "/embed_all", {"model": "colbert", "inputs": "many vectors"}),
    ("POST", "/tokenize", {"model": "embedder", "inputs": "a sentence"}),
    ("GET", "/v1/models", None),
    ("GET", "/v2/models/tiny-encoder", None),
    ("GET", "/v2/health/ready", None),
]


def test_every_route_family_through_ray_answers_as_the_server_alone(
    cluster: Loopback, models: Path
) -> None:
    deploy(cluster, models=models, num_replicas=2, max_replicas_per_node=1)
    with server_process(models) as (_, alone, _log), httpx.Client(timeout=60) as client:
        for method, path, body in FAMILIES:
            here = client.request(method, alone + path, json=body)
            assert here.status_code == 200, (path, here.text)
            for _ in range(4):  # (both replicas, whichever the proxy picks)
                there = client.request(method, cluster.url + path, json=body)
                assert there.status_code == 200, (path, there.text)
                same(there.json(), here.json(), path)
        refused = client.post(cluster.url + "/v1/embeddings", json={"model": "embedder"})
        assert refused.status_code == 400  # (the server's own refusal, not the proxy's)
        assert (
            refused.json()
            == client.post(alone + "/v1/embeddings", json={"model": "embedder"}).json()
        )


@dataclass
class Load:
    """Clients sending `/v1/embeddings` while the block runs, each answer checked against the
    reference; a failed request sent again at most `retries` times, then counted lost."""

    url: str
    reference: dict[str, list[float]]
    retries: int
    clients: int = 8
    model: str = "embedder"
    answered: int = 0
    retried: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sending: list[Future[None]] = field(default_factory=list)

    def __enter__(self) -> Load:
        pool = ThreadPoolExecutor(self.clients)
        self.sending = [pool.submit(self._client, n) for n in range(self.clients)]
        pool.shutdown(wait=False)
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for client in self.sending:
            client.result()  # (a client that broke fails the test here)

    def _client(self, n: int) -> None:
        with httpx.Client(timeout=60) as client:
            i = n
            while not self.stop.is_set():
                text = TEXTS[i % len(TEXTS)]
                i += self.clients
                for attempt in range(self.retries + 1):
                    try:
                        body = {"model": self.model, "input": text}
                        answer = client.post(self.url + "/v1/embeddings", json=body)
                        ok = answer.status_code == 200
                        why = f"{answer.status_code} {answer.text[:200]}"
                    except httpx.HTTPError as exc:
                        ok, why = False, repr(exc)
                    if ok:
                        vector = np.asarray(answer.json()["data"][0]["embedding"])
                        with self.lock:
                            self.answered += 1
                            if not np.allclose(vector, self.reference[text], atol=1e-5):
                                self.wrong.append(text)
                        break
                    with self.lock:
                        (self.retried if attempt < self.retries else self.lost).append(why)

    def wait(self, answers: int) -> None:
        start = self.answered
        until(lambda: self.answered >= start + answers, f"{answers} more answers")


def reference(url: str, model: str = "embedder") -> dict[str, list[float]]:
    with httpx.Client(timeout=60) as client:
        return {
            text: client.post(url + "/v1/embeddings", json={"model": model, "input": text}).json()[
                "data"
            ][0]["embedding"]
            for text in TEXTS
        }


def replica_nodes(cluster: Loopback) -> list[Any]:
    """The worker nodes that hold a replica (their one CPU taken)."""
    free = ray._private.state.available_resources_per_node()
    return [node for node in cluster.workers if free.get(node.node_id, {}).get("CPU", 0) < 1]


def test_a_node_killed_under_load_loses_nothing_sent_once_more(
    cluster: Loopback, models: Path
) -> None:
    deploy(cluster, models=models, num_replicas=2, max_replicas_per_node=1)
    with Load(cluster.url, reference(cluster.url), retries=1) as load:
        load.wait(100)
        victim = replica_nodes(cluster)[0]
        cluster.cluster.remove_node(victim, allow_graceful=False)  # (SIGKILL, every process)
        cluster.workers.remove(victim)
        killed = time.monotonic()
        until(lambda: running(cluster) == 2 and len(replica_nodes(cluster)) == 2, "replaced", 60)
        back_in_s = time.monotonic() - killed
        load.wait(100)
    print(f"both replicas running {back_in_s:.1f} s after the kill; {len(load.retried)} retried")
    assert load.lost == []
    assert load.wrong == []
    assert back_in_s < 30
    cluster.workers.append(cluster.cluster.add_node(num_cpus=1))  # (a spare again)
    cluster.cluster.wait_for_nodes()


def test_scale_down_and_a_rolling_update_under_load_lose_nothing(
    cluster: Loopback, models: Path
) -> None:
    deploy(cluster, models=models, num_replicas=2, max_replicas_per_node=1)
    fresh = {"model": "fresh", "input": "a sentence"}
    assert httpx.post(cluster.url + "/v1/embeddings", json=fresh).status_code == 404
    with Load(cluster.url, reference(cluster.url), retries=0) as load:
        load.wait(50)
        deploy(cluster, models=models, num_replicas=1, max_replicas_per_node=1)
        until(lambda: len(replica_nodes(cluster)) == 1, "scaled down to one replica")
        load.wait(50)
        # another setting is another version: Ray starts a new replica, then stops the old
        deploy(
            cluster, models=models, num_replicas=1, max_replicas_per_node=1,
            served_model_name="fresh=embedder",
        )  # fmt: skip
        load.wait(50)
    assert load.lost == []
    assert load.retried == []
    assert load.wrong == []
    assert httpx.post(cluster.url + "/v1/embeddings", json=fresh).status_code == 200


@pytest.fixture(scope="module")
def minilm_models(minilm_spec: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    models = tmp_path_factory.mktemp("ray-minilm") / "models"
    copy_bundled(models, "minilm")
    return models


def test_batches_through_ray_hold_to_the_server_alone(
    cluster: Loopback, minilm_models: Path
) -> None:
    """Under the same 32 clients sending passages, a replica (one CPU: one thread) forms
    batches at least 0.8 as large as the server alone on one thread; Ray's metrics carry the
    queue gauges. (With sentences, a request costs Ray's proxy more CPU than the model, and on
    two cores the proxy's share is the model's loss: docs/ray.md has both.)"""
    models = minilm_models
    with server_process(models, "--intra-op-threads", "1", "--result-cache-mb", "0") as (
        _,
        alone,
        _log,
    ):
        mean_batch(alone, PASSAGES, 32, 2)  # (warm)
        alone_batch, alone_rate = mean_batch(alone, PASSAGES, 32, 16)
    deploy(cluster, models=models, num_replicas=1, result_cache_mb=0)
    mean_batch(cluster.url, PASSAGES, 32, 2)
    ray_batch, ray_rate = mean_batch(cluster.url, PASSAGES, 32, 16)
    print(
        f"mean batch: alone {alone_batch:.1f}, through Ray {ray_batch:.1f} "
        f"({ray_batch / alone_batch:.2f}); requests/s alone {alone_rate:.0f}, through Ray "
        f"{ray_rate:.0f} ({ray_rate / alone_rate:.2f})"
    )
    assert ray_batch >= 0.8 * alone_batch

    nodes = [cluster.cluster.head_node, *cluster.workers]

    def exported() -> bool:
        for node in nodes:
            try:
                text = httpx.get(f"http://127.0.0.1:{node.metrics_export_port}/metrics").text
            except httpx.HTTPError:
                continue
            for line in text.splitlines():
                gauge = line.startswith("ray_bucketserve_requests_waiting{")
                if gauge and 'replica="' in line and 'model="minilm"' in line:
                    return True
        return False

    until(exported, "the queue gauges in Ray's metrics, with the replica", 60)


# (Ray Data's context warns of its own defaults: not ours to fix)
@pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")
def test_a_corpus_embeds_over_two_nodes_with_ray_data(cluster: Loopback, models: Path) -> None:
    """Two `Embed` actors of one CPU each: the head has none, so they run on two workers.
    Every vector equals the server's answer for its text; a text the route refuses gets its
    error, and its neighbours their vectors."""
    from bucketserve.ray import Embed

    serve.delete(APP)  # (the replicas' CPUs back to the actors)
    texts = [*TEXTS, "", *(f"{t} again" for t in TEXTS)]
    rows = (
        ray.data.from_items([{"text": t, "n": i} for i, t in enumerate(texts)])
        .map_batches(
            Embed,
            fn_constructor_kwargs={"models": str(models), "model": "embedder"},
            concurrency=2,
            num_cpus=1,
            batch_size=32,
        )
        .take_all()
    )
    assert sorted(row["n"] for row in rows) == list(range(len(texts)))
    with server_process(models) as (_, alone, _log), httpx.Client(timeout=60) as client:
        for row in rows:
            text = texts[row["n"]]
            answer = client.post(
                alone + "/v1/embeddings", json={"model": "embedder", "input": text}
            )
            if text:
                assert row["error"] == ""
                np.testing.assert_allclose(
                    row["embedding"], answer.json()["data"][0]["embedding"], atol=1e-5
                )
            else:
                assert answer.status_code == 422  # (an empty text, refused by the route)
                assert row["error"] == f"422: {answer.text}"
                assert np.isnan(row["embedding"]).all()


def test_autoscaling_follows_the_engines_queue(cluster: Loopback, minilm_models: Path) -> None:
    """`num_replicas=auto`: under load the requests minilm's engine holds pass the target
    and a second replica starts; once the load stops, the deployment goes back to one."""
    deploy(
        cluster, models=minilm_models, num_replicas="auto", min_replicas=1, max_replicas=2,
        result_cache_mb=0, target_requests=4, upscale_delay_s=1, downscale_delay_s=2,
        look_back_period_s=11,  # (over Ray's 10 s between reports)
    )  # fmt: skip
    began = time.monotonic()
    answers = reference(cluster.url, "minilm")
    with Load(cluster.url, answers, retries=0, clients=16, model="minilm") as load:
        until(lambda: running(cluster) == 2, "a second replica, under load", 120)
        up = time.monotonic() - began
    idle = time.monotonic()
    until(lambda: running(cluster) == 1, "back to one replica, idle", 120)
    print(f"two replicas {up:.1f} s into the load, one {time.monotonic() - idle:.1f} s after")
    assert load.lost == []
    assert load.wrong == []

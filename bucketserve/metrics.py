"""Prometheus metrics: one object records everything, so no endpoint keeps a copy of the logic.

HTTP requests are recorded by the request-context middleware; admissions, rejections, batches,
drops and queue depth by the scheduler (its `Observer`); what load found about each model (its
policy and the invariance check's figures) by the engine at start.
Label values are bounded: `bucket` is always one of a model's configured edges.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Differences(Protocol):
    """What the invariance check measured batching and padding to do to a model's answers."""

    @property
    def padding(self) -> float: ...

    @property
    def batching(self) -> float: ...

    @property
    def tolerance(self) -> float: ...


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128)
# Fine enough for `bucketserve plan` to fit edges to live traffic (edges land on these values).
LENGTH_BUCKETS = (*range(4, 64, 4), *range(64, 128, 8), *range(128, 257, 16), 320, 384, 448, 512)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._info_labels: dict[tuple[str, int], tuple[str, str, str, str]] = {}
        r = self.registry
        self.requests = Counter(
            "bucketserve_requests",
            "requests (HTTP, and gRPC by method path) by route and status",
            ["route", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "bucketserve_request_seconds",
            "request latency (HTTP and gRPC)",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_seconds = Histogram(
            "bucketserve_queue_seconds",
            "time a sequence waited",
            ["model", "bucket"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.compute_seconds = Histogram(
            "bucketserve_compute_seconds",
            "time a batch ran",
            ["model", "bucket"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "bucketserve_batch_size",
            "real sequences per batch",
            ["model", "bucket"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.computed_tokens = Counter(
            "bucketserve_computed_tokens",
            "tokens computed (rows x padded length)",
            ["model", "bucket"],
            registry=r,
        )
        self.padded_tokens = Counter(
            "bucketserve_padded_tokens",
            "computed tokens that were padding",
            ["model", "bucket"],
            registry=r,
        )
        self.padding_ratio = Gauge(
            "bucketserve_padding_ratio",
            "padded / computed tokens since start",
            ["model", "bucket"],
            registry=r,
        )
        self.bound_keys = Gauge(
            "bucketserve_bound_keys", "bucket keys with a bound executor", ["model"], registry=r
        )
        self.queue_depth_gauge = Gauge(
            "bucketserve_queue_depth", "sequences waiting", ["model"], registry=r
        )
        self.rejected = Counter(
            "bucketserve_rejected", "requests refused before queueing", ["reason"], registry=r
        )
        self.dropped_total = Counter(
            "bucketserve_dropped",
            "sequences dropped before compute",
            ["model", "reason"],
            registry=r,
        )
        self.sequence_lengths = Histogram(
            "bucketserve_sequence_length",
            "lengths of admitted sequences",
            ["model"],
            buckets=LENGTH_BUCKETS,
            registry=r,
        )
        self.model_info = Gauge(
            "bucketserve_model_info",
            "each served model, with its effective binding (the `strategy` label, the name "
            "dashboards read) and batching policy (always 1)",
            ["model", "version", "strategy", "policy"],
            registry=r,
        )
        self.batching_difference = Gauge(
            "bucketserve_batching_difference",
            "the invariance check's worst |batched - alone| / (1 + |alone|), by what was tried",
            ["model", "check"],
            registry=r,
        )
        self.batching_tolerance = Gauge(
            "bucketserve_batching_tolerance",
            "the most batching may move an answer before the policy tightens",
            ["model"],
            registry=r,
        )
        self.load_failed = Gauge(
            "bucketserve_model_load_failed",
            "models of the repository that did not load (served partially; always 1)",
            ["model"],
            registry=r,
        )
        self._tokens: dict[tuple[str, str], list[int]] = {}

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def request_done(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)

    def admitted(self, model: str, lengths: Sequence[int]) -> None:
        histogram = self.sequence_lengths.labels(model)
        for length in lengths:
            histogram.observe(length)

    def model_loaded(
        self, model: str, version: int, binding: str, policy: str, differences: Differences
    ) -> None:
        """`differences`: the invariance check's figures
        (`bucketserve.core.bucketing.Invariance`)."""
        self._info_labels[(model, version)] = (model, str(version), binding, policy)
        self.model_info.labels(model, str(version), binding, policy).set(1)
        self.batching_difference.labels(model, "padding").set(differences.padding)
        self.batching_difference.labels(model, "batching").set(differences.batching)
        self.batching_tolerance.labels(model).set(differences.tolerance)

    def model_released(self, model: str, version: int, served: Collection[int]) -> None:
        """A model's version released, its model now serving `served` versions: the series
        of a version no longer served go (bounded label sets, however often models are
        loaded and unloaded), and those of the model when it serves none."""
        if version not in served:
            labels = self._info_labels.pop((model, version), None)
            if labels is not None:
                self.model_info.remove(*labels)
        if not served:
            for gauge, extra in ((self.bound_keys, ()), (self.batching_tolerance, ())):
                with contextlib.suppress(KeyError):
                    gauge.remove(model, *extra)
            for kind in ("padding", "batching"):
                with contextlib.suppress(KeyError):
                    self.batching_difference.remove(model, kind)

    def model_failed(self, model: str) -> None:
        self.load_failed.labels(model).set(1)

    def batch_done(
        self,
        model: str,
        bucket: int,
        lengths: Sequence[int],
        shape: tuple[int, int],
        queue_s: Sequence[float],
        compute_s: float,
    ) -> None:
        label = str(bucket)
        waits = self.queue_seconds.labels(model, label)
        for seconds in queue_s:
            waits.observe(seconds)
        self.compute_seconds.labels(model, label).observe(compute_s)
        self.batch_size.labels(model, label).observe(len(lengths))
        computed, real = shape[0] * shape[1], sum(lengths)
        self.computed_tokens.labels(model, label).inc(computed)
        self.padded_tokens.labels(model, label).inc(computed - real)
        totals = self._tokens.setdefault((model, label), [0, 0])
        totals[0] += computed
        totals[1] += computed - real
        self.padding_ratio.labels(model, label).set(totals[1] / totals[0])

    def dropped(self, model: str, reason: str, count: int) -> None:
        self.dropped_total.labels(model, reason).inc(count)

    def queue_depth(self, model: str, depth: int) -> None:
        self.queue_depth_gauge.labels(model).set(depth)

    def watch_bound_keys(self, model: str, count: Callable[[], int]) -> None:
        """Read at every scrape, so keys bound later (lazily) are counted too."""
        self.bound_keys.labels(model).set_function(count)

    def reject(self, reason: str) -> None:
        self.rejected.labels(reason).inc()

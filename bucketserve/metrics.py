"""Prometheus metrics: one object records everything, so no endpoint keeps a copy of the logic.

HTTP requests are recorded by the request-context middleware; admissions, rejections, batches,
drops, queue depth and each sequence's wait by priority level and tenant by the scheduler (its
`Observer`); what load found about each model (its policy and the invariance check's figures)
and the result cache's hits by the engine.
Label values are bounded: `bucket` is always one of a model's configured edges, `priority` one
of the server's levels, `tenant` one the operator named (any other is `other`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from bucketserve.about import VERSION
from bucketserve.settings import BULK_LEVEL


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
# ... and past 512, a quarter apart up to the longest contexts served (32,768)
LENGTH_BUCKETS += tuple(int(512 * 2 ** (i / 4)) // 64 * 64 for i in range(1, 25))


FOOTPRINT_TERMS = ("fixed", "per_token", "per_token_squared")
NO_TENANT = "none"  # the label of requests without a tenant (tenancy off)
OTHER_TENANT = "other"  # of a tenant the operator did not name
JOB_TENANT = "job:"  # the tenants of bulk jobs (each job its own, labelled "jobs")


class Metrics:
    def __init__(self, tenants: Collection[str] = ()) -> None:
        """`tenants`: those labelled by name (the key file's, --tenant-weights')."""
        self.registry = CollectorRegistry()
        # (the process's CPU, memory, open files and start time; the Python it runs on)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.tenants = frozenset(tenants)
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
        self.requests_waiting = Gauge(
            "bucketserve_requests_waiting",
            "requests admitted and waiting: none of their sequences taken into a batch yet "
            "(routers' queued requests)",
            ["model"],
            registry=r,
        )
        self.requests_running = Gauge(
            "bucketserve_requests_running",
            "requests admitted with a sequence taken into a batch, not answered yet",
            ["model"],
            registry=r,
        )
        self.tokens_waiting = Gauge(
            "bucketserve_tokens_waiting",
            "the steps of the sequences waiting (what a queue holds in work)",
            ["model"],
            registry=r,
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
        self.batch_memory = Gauge(
            "bucketserve_batch_memory_bytes",
            "what a batch of the model needs while it runs, measured at load: `fixed` + "
            "`per_token` x rows x length + `per_token_squared` x rows x length^2",
            ["model", "term"],
            registry=r,
        )
        self.longest_sequence = Gauge(
            "bucketserve_longest_sequence",
            "the longest sequence the model runs: its longest bucket, or less where a batch "
            "of one that long would not fit the memory budget (longer: 413)",
            ["model"],
            registry=r,
        )
        self.memory_budget = Gauge(
            "bucketserve_memory_budget_bytes",
            "what the batches running at once may need together (absent: no bound)",
            registry=r,
        )
        self.memory_running = Gauge(
            "bucketserve_memory_running_bytes",
            "what the batches running now need, by their models' footprints",
            registry=r,
        )
        self.memory_peak = Gauge(
            "bucketserve_memory_running_peak_bytes",
            "the most the batches running at once have needed since start",
            registry=r,
        )
        self.memory_waiting = Gauge(
            "bucketserve_memory_batches_waiting",
            "batches ready to run that wait for room in the memory budget",
            registry=r,
        )
        self.build_info = Gauge(
            "bucketserve_build_info",
            "what this server is (always 1): its version, and the ONNX Runtime it runs on",
            ["version", "onnxruntime"],
            registry=r,
        )
        self.build_info.labels(VERSION, _installed("onnxruntime", "onnxruntime-gpu")).set(1)
        self.load_failed = Gauge(
            "bucketserve_model_load_failed",
            "models of the repository that did not load (served partially; always 1)",
            ["model"],
            registry=r,
        )
        self.class_queue_seconds = Histogram(
            "bucketserve_class_queue_seconds",
            "time a sequence waited, by its priority level and tenant",
            ["model", "priority", "tenant"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.class_tokens = Counter(
            "bucketserve_class_tokens",
            "tokens served (real, not padding), by priority level and tenant",
            ["model", "priority", "tenant"],
            registry=r,
        )
        self.class_rejected = Counter(
            "bucketserve_class_rejected",
            "requests refused before queueing, by priority level, tenant and reason "
            "(tenant_share: the tenant held its share of a contended queue)",
            ["priority", "tenant", "reason"],
            registry=r,
        )
        self.cache_hits = Counter(
            "bucketserve_result_cache_hits",
            "sequences answered from the exact result cache",
            ["model"],
            registry=r,
        )
        self.cache_misses = Counter(
            "bucketserve_result_cache_misses",
            "sequences the exact result cache did not hold (then run)",
            ["model"],
            registry=r,
        )
        self.shared_sequences = Counter(
            "bucketserve_shared_sequences",
            "sequences answered by an identical one's run, queued or running at once",
            ["model"],
            registry=r,
        )
        self.saved_tokens = Counter(
            "bucketserve_result_cache_saved_tokens",
            "tokens not run: answered from the cache, or by an identical sequence's run",
            ["model"],
            registry=r,
        )
        self.cache_bytes = Gauge(
            "bucketserve_result_cache_bytes",
            "bytes the exact result cache holds (keys included), by model version",
            ["model", "version"],
            registry=r,
        )
        self.jobs = Gauge(
            "bucketserve_jobs", "bulk jobs (batches) kept, by status", ["status"], registry=r
        )
        self.job_lines = Counter(
            "bucketserve_job_lines",
            "lines of bulk jobs answered, by outcome (completed: 2xx; failed: the rest)",
            ["outcome"],
            registry=r,
        )
        self.job_tokens = Counter(
            "bucketserve_job_tokens",
            "tokens of the bulk jobs' lines answered (its rate: bulk tokens per second)",
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
            with contextlib.suppress(KeyError):
                self.cache_bytes.remove(model, str(version))
        if not served:
            for gauge in (self.bound_keys, self.batching_tolerance, self.longest_sequence):
                with contextlib.suppress(KeyError):
                    gauge.remove(model)
            for term in FOOTPRINT_TERMS:
                with contextlib.suppress(KeyError):
                    self.batch_memory.remove(model, term)
            for kind in ("padding", "batching"):
                with contextlib.suppress(KeyError):
                    self.batching_difference.remove(model, kind)

    def model_memory(self, model: str, terms: Mapping[str, float] | None, longest: int) -> None:
        """What a batch of `model` needs (its footprint's `terms`; None: not measured), and the
        longest sequence it runs."""
        for term, value in (terms or {}).items():
            self.batch_memory.labels(model, term).set(value)
        self.longest_sequence.labels(model).set(longest)

    def watch_memory(
        self,
        budget: int | None,
        running: Callable[[], int],
        peak: Callable[[], int],
        waiting: Callable[[], int],
    ) -> None:
        """Read at every scrape: the memory budget's figures."""
        if budget is not None:
            self.memory_budget.set(budget)
        self.memory_running.set_function(running)
        self.memory_peak.set_function(peak)
        self.memory_waiting.set_function(waiting)

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

    def watch_queue(
        self,
        model: str,
        waiting: Callable[[], int],
        running: Callable[[], int],
        tokens: Callable[[], int],
    ) -> None:
        """Read at every scrape: the model's requests waiting and running, tokens waiting."""
        self.requests_waiting.labels(model).set_function(waiting)
        self.requests_running.labels(model).set_function(running)
        self.tokens_waiting.labels(model).set_function(tokens)

    def reject(self, reason: str, level: int = 0, tenant: str = "") -> None:
        self.rejected.labels(reason).inc()
        self.class_rejected.labels(_level(level), self._tenant(tenant), reason).inc()

    def served(self, model: str, level: int, tenant: str, wait_s: float, tokens: int) -> None:
        label = self._tenant(tenant)
        self.class_queue_seconds.labels(model, _level(level), label).observe(wait_s)
        self.class_tokens.labels(model, _level(level), label).inc(tokens)

    def job_moved(self, old: str | None, new: str) -> None:
        """A bulk job went from status `old` (None: newly counted) to `new`."""
        if old is not None:
            self.jobs.labels(old).dec()
        self.jobs.labels(new).inc()

    def job_line_done(self, ok: bool, tokens: int) -> None:
        self.job_lines.labels("completed" if ok else "failed").inc()
        self.job_tokens.inc(tokens)

    def shared(self, model: str, count: int, tokens: int) -> None:
        self.shared_sequences.labels(model).inc(count)
        self.saved_tokens.labels(model).inc(tokens)

    def cache_looked_up(self, model: str, hits: int, misses: int, saved_tokens: int) -> None:
        self.cache_hits.labels(model).inc(hits)
        self.cache_misses.labels(model).inc(misses)
        self.saved_tokens.labels(model).inc(saved_tokens)

    def watch_cache(self, model: str, version: int, size: Callable[[], int]) -> None:
        """Read at every scrape: the bytes a model version's cache holds now."""
        self.cache_bytes.labels(model, str(version)).set_function(size)

    def _tenant(self, tenant: str) -> str:
        if not tenant:
            return NO_TENANT
        if tenant.startswith(JOB_TENANT):
            return "jobs"
        return tenant if tenant in self.tenants else OTHER_TENANT


def _installed(*packages: str) -> str:
    """The version of the first of `packages` installed (read from its metadata: nothing is
    imported), or "none"."""
    for package in packages:
        with contextlib.suppress(PackageNotFoundError):
            return version(package)
    return "none"


def _level(level: int) -> str:
    return "bulk" if level == BULK_LEVEL else str(level)

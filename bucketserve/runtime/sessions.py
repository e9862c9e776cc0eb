"""Creating ONNX Runtime sessions: thread pools, providers, shared weights, static shapes.

When a batch runs on several threads, every session of the process draws on one global
intra-op thread pool, so that many sessions (one per bucket key) never spin against each other
for the same cores. With one thread a batch (the default on a CPU: one batch per core), there
is no pool to share: each run computes on its caller's thread, and a session may then have a
pool of its own, for a batch that runs alone on every core (`create_session(threads=...)`).
All sessions share one CPU arena, so that each key's session does not keep an arena of its own,
but those of a model whose batches are large (`GraphFile.arena` off): the arena keeps the most
it ever held, and grows by doubling (a run of 8,192 tokens that needs 2.4 GiB took 3.1 GiB
from it, and kept it); without it what a run allocates is given back when the run ends, so the
process holds what the batches running now need, which the memory budget counts.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bucketserve.runtime.memory import map_large_allocations
from bucketserve.runtime.weights import SharedWeights

log = logging.getLogger(__name__)


Session = ort.InferenceSession  # (for the modules above the runtime, which never import it)


# Provider options the server sets unless a model's config does: CUDA's TF32 matrix products
# round inputs to 10 bits of mantissa and pick their kernels by the batch's shape, so a
# sequence's answer moved by up to 1.8e-3 with what it was batched with (MiniLM-L6's shape on
# an H100, loadtest.gpu_bench): the check then served one sequence per run, 650 sequences/s.
# In full fp32 it moved by 2.3e-6 and was batched: 14,000 sequences/s.
DEFAULT_OPTIONS: dict[str, dict[str, str]] = {"CUDAExecutionProvider": {"use_tf32": "0"}}


@dataclass(frozen=True)
class GraphFile:
    """The ONNX file a model's sessions load, the providers they ask for (and each one's
    options, as (provider, ((option, value), ...)) pairs), and the names of the free dims on
    the inputs' batch and time axes (what a static-shape session fixes)."""

    path: Path
    providers: tuple[str, ...]
    batch_dims: tuple[str, ...] = ()
    time_dims: tuple[str, ...] = ()
    options: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    arena: bool = True  # its sessions allocate from the process's arena (else on their own)

    def static_dims(self, rows: int, length: int) -> dict[str, int]:
        return {**dict.fromkeys(self.batch_dims, rows), **dict.fromkeys(self.time_dims, length)}

    def provider_options(self, provider: str) -> dict[str, str]:
        """`provider`'s options: the server's defaults, then the config's."""
        given = dict(self.options).get(provider, ())
        return {**DEFAULT_OPTIONS.get(provider, {}), **dict(given)}


_process_lock = threading.Lock()
_process_ready = False
_global_pool = False


def init_process(intra_op_threads: int | None = None) -> None:
    """Make the process-wide CPU arena, and the thread pool when a batch runs on more than one
    thread, once, before the first session."""
    global _process_ready, _global_pool
    with _process_lock:
        if not _process_ready:
            threads = intra_op_threads or usable_cores()
            if threads > 1:
                ort.set_global_thread_pool_sizes(threads, 1)
                _global_pool = True
            cpu = ort.OrtMemoryInfo(
                "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
            )
            ort.create_and_register_allocator(cpu, ort.OrtArenaCfg(0, -1, -1, -1))
            _process_ready = True


def usable_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota (a
    container's CPU limit). `os.cpu_count()` is the node's, which a pod may not have."""
    cores = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    return max(1, cores)


def runs_on_cpu(providers: list[str]) -> bool:
    """Whether a model asking for `providers` runs on the CPU here (as `create_session` picks)."""
    available = set(ort.get_available_providers())
    return next((p for p in providers if p in available), "CPUExecutionProvider") == (
        "CPUExecutionProvider"
    )


def thread_layout(
    instances: int | None, intra_op_threads: int | None, all_on_cpu: bool
) -> tuple[int, int]:
    """(instances, intra-op threads). On a CPU, one batch per core with one thread each: small
    batches parallelise poorly inside ONNX Runtime, so two single-threaded batches at once beat
    one batch on two threads (measured: +28% at batch sizes 1 and 4, equal at 16). On a GPU one
    batch at a time (a CUDA graph must not be replayed twice at once)."""
    cores = usable_cores()
    instances = instances or (cores if all_on_cpu else 1)
    return instances, intra_op_threads or max(1, cores // instances)


def own_pools_allowed() -> bool:
    """Whether a session may have a thread pool of its own (ONNX Runtime refuses one beside
    the global pool)."""
    init_process()
    return not _global_pool


def lone_threads(wanted: int | None, instances: int, threads: int) -> int | None:
    """Threads for a batch that runs alone (`wanted`, default every core), or None for none:
    only where several batches share the cores, each on fewer threads."""
    wanted = wanted or usable_cores()
    return wanted if instances > 1 and wanted > threads else None


def create_session(
    graph: GraphFile,
    *,
    weights: SharedWeights | None = None,
    static_dims: dict[str, int] | None = None,
    threads: int | None = None,
) -> ort.InferenceSession:
    """A session over `graph`. With `weights`, initializers come from the shared memmap and
    prepacking is off (a prepacked copy would be private to the session). `static_dims` fixes
    free dimensions by name, giving a static-shape session for one bucket key. `threads`: a
    pool of the session's own (where `own_pools_allowed`); else the process's layout."""
    init_process()
    options = ort.SessionOptions()
    if _global_pool:
        if threads is not None:
            raise ValueError("a session's own thread pool beside the global one")
        options.use_per_session_threads = False
    else:
        options.intra_op_num_threads = threads or 1
        # Its threads spin while a run lasts (a lone batch's latency) but not after it: a pool
        # left spinning would take cores from the runs on one thread that follow.
        options.add_session_config_entry("session.force_spinning_stop", "1")
    if graph.arena:
        options.add_session_config_entry("session.use_env_allocators", "1")
    else:
        options.enable_cpu_mem_arena = False
        map_large_allocations()
    options.log_severity_level = 3
    if weights is not None:
        weights.add_to(options)
        options.add_session_config_entry("session.disable_prepacking", "1")
    for name, size in (static_dims or {}).items():
        options.add_free_dimension_override_by_name(name, size)
    providers = list(graph.providers)
    available = set(ort.get_available_providers())
    wanted = [p for p in providers if p in available] or ["CPUExecutionProvider"]
    asked = [(p, graph.provider_options(p)) for p in wanted]
    session = ort.InferenceSession(str(graph.path), options, providers=asked)
    # The session reads the weights' pages for its whole life, but holds no reference to the
    # memmap they live in: tie their lifetimes here, or the pages may be unmapped under it.
    session.shared_weights = weights
    in_use = session.get_providers()
    if in_use[0] != providers[0]:
        # onnxruntime-gpu without a usable GPU falls back to CPU with only a log line of its own.
        log.warning("%s: asked for %s, running on %s", graph.path, providers[0], in_use[0])
    return session


def side_session(graph: GraphFile) -> ort.InferenceSession:
    """A session for runs outside an engine (benchmarks, tests), which leaves the process's
    thread layout as it is: on its pool if it has made one, else on one thread."""
    options = ort.SessionOptions()
    if _global_pool:
        options.use_per_session_threads = False
    else:
        options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(graph.path), options, providers=["CPUExecutionProvider"])


def run_all(
    session: ort.InferenceSession, feeds: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Every output of one plain run: load-time probes and checks (serving binds buffers)."""
    names = [o.name for o in session.get_outputs()]
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4  # a probe that fails is an answer, not an error to print
    return dict(zip(names, session.run(names, dict(feeds), quiet), strict=True))


def write_folded(source: Path, target: Path) -> None:
    """`source` saved to `target` with ONNX Runtime's basic, provider-independent graph
    optimizations applied: what every session would fold for itself (a Transpose on a kernel,
    a Cast on a weight) folded once, so that sessions can share the result instead of each
    keeping a copy. Weights go to `target`'s .data file."""
    init_process()
    options = ort.SessionOptions()
    options.use_per_session_threads = not _global_pool
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(target)
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", target.name + ".data"
    )
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
    )
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])


def return_freed_memory() -> None:
    """Released sessions' memory given back to the system: their Python objects collected,
    and the C heap trimmed (glibc keeps freed pages for reuse otherwise, so a model unloaded
    would not show in Pss)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # (not glibc: nothing to trim)
        ctypes.CDLL("libc.so.6").malloc_trim(0)

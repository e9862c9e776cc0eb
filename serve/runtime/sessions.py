"""Creating ONNX Runtime sessions: thread pools, providers, shared weights, static shapes.

Every session of the process draws on one global intra-op thread pool, so that many sessions
(one per bucket key) never spin against each other for the same cores.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import onnxruntime as ort

from serve.runtime.weights import SharedWeights

log = logging.getLogger(__name__)

_threads_lock = threading.Lock()
_threads_set = False


def use_global_threads(intra_op_threads: int | None = None) -> None:
    """Size the process-wide thread pool once, before the first session is made."""
    global _threads_set
    with _threads_lock:
        if not _threads_set:
            ort.set_global_thread_pool_sizes(intra_op_threads or os.cpu_count() or 1, 1)
            _threads_set = True


def create_session(
    onnx_path: Path,
    providers: list[str],
    *,
    weights: SharedWeights | None = None,
    static_dims: dict[str, int] | None = None,
) -> ort.InferenceSession:
    """A session over `onnx_path`. With `weights`, initializers come from the shared memmap and
    prepacking is off (a prepacked copy would be private to the session). `static_dims` fixes
    free dimensions by name, giving a static-shape session for one bucket key."""
    use_global_threads()
    options = ort.SessionOptions()
    options.use_per_session_threads = False
    options.log_severity_level = 3
    if weights is not None:
        weights.add_to(options)
        options.add_session_config_entry("session.disable_prepacking", "1")
    for name, size in (static_dims or {}).items():
        options.add_free_dimension_override_by_name(name, size)
    available = set(ort.get_available_providers())
    wanted = [p for p in providers if p in available] or ["CPUExecutionProvider"]
    session = ort.InferenceSession(str(onnx_path), options, providers=wanted)
    in_use = session.get_providers()
    if in_use[0] != providers[0]:
        # onnxruntime-gpu without a usable GPU falls back to CPU with only a log line of its own.
        log.warning("%s: asked for %s, running on %s", onnx_path, providers[0], in_use[0])
    return session

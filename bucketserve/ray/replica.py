"""One Ray Serve replica of bucketserve: the process's parts wired once (`process.wiring`), the
engine running on the replica's event loop, the HTTP application (every route: `/predict`,
KServe v2, OpenAI's, the task routes) as its ASGI ingress. Ray asks and the engine answers:

- health: `check_health` is the engine's readiness (every model that loaded is running and no
  drain began), so a replica that cannot serve is replaced rather than sent requests;
- autoscaling: `record_autoscaling_stats` reports the requests the engine holds, waiting and
  running (`bucketserve.ray.autoscaling` scales on them);
- a graceful stop (scale-down, a rolling update, `serve shutdown`): Ray routes nothing new to
  the replica and waits for what it holds; then `__del__` is the server's drain (new work
  refused, everything admitted answered) before the engine stops;
- metrics: the queue gauges, mirrored into Ray's metrics each second, with Ray Serve's
  deployment and replica tags (the replica's own `/metrics` is one replica's, as a proxy
  answers it from any).

Bulk jobs are off in a replica (each would keep its own files): Ray Data runs a corpus
(`bucketserve.ray.data`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ray import serve
from ray.serve import metrics as serve_metrics

from bucketserve.edges.http.app import create_app
from bucketserve.process.wiring import running, wire
from bucketserve.settings import Settings

log = logging.getLogger(__name__)

MIRROR_S = 1.0  # how often the queue gauges are copied into Ray's metrics
SIGNALS = {  # the engine's count -> the gauge Ray exports (as ray_<name>)
    "requests_waiting": "bucketserve_requests_waiting",
    "requests_running": "bucketserve_requests_running",
    "queued_tokens": "bucketserve_tokens_waiting",
}


@serve.deployment
@serve.ingress()
class Replica:
    async def __init__(self, settings: Settings, target_requests: float) -> None:  # type: ignore[misc]
        """The repository loaded and checked as `serve` loads it (a model that fails fails
        the replica, with why, unless allow_partial), and the engine started."""
        logging.getLogger("bucketserve").setLevel(settings.log_level.upper())
        self.wired = wire(settings)
        self.target_requests = target_requests
        self._gauges = {
            count: serve_metrics.Gauge(name, f"bucketserve's {count}", tag_keys=("model",))
            for count, name in SIGNALS.items()
        }
        self._running = running(self.wired.engine, self.wired.control, self.wired.metrics)
        await self._running.__aenter__()
        self._mirror = asyncio.create_task(self._mirrored(), name="ray-metrics")

    def __serve_build_asgi_app__(self) -> Any:
        wired = self.wired
        return create_app(wired.engine, wired.control, wired.metrics, wired.keys, wired.http)

    def check_health(self) -> None:
        """Raises (Ray replaces the replica) once the engine cannot take traffic."""
        if not self.wired.engine.ready:
            raise RuntimeError("bucketserve: not ready (a model stopped, or draining)")

    def record_autoscaling_stats(self) -> dict[str, float]:
        """The requests the engine holds, and the target (`bucketserve.ray.autoscaling`)."""
        engine = self.wired.engine
        held = sum(
            engine.summed(name, "requests_waiting") + engine.summed(name, "requests_running")
            for name in engine.registry.models
        )
        return {"requests": float(held), "target_requests": self.target_requests}

    async def _mirrored(self) -> None:
        engine = self.wired.engine
        while True:
            for name in engine.registry.models:
                for count, gauge in self._gauges.items():
                    gauge.set(engine.summed(name, count), tags={"model": name})
            await asyncio.sleep(MIRROR_S)

    async def __del__(self) -> None:
        """Ray's graceful stop, after what Ray sent has been answered: the server's drain."""
        if not hasattr(self, "_mirror"):  # (the constructor failed: nothing was started)
            return
        self._mirror.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._mirror
        await self._running.__aexit__(None, None, None)
        log.info("replica stopped: drained")

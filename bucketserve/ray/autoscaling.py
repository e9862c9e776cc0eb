"""Ray Serve's autoscaling on bucketserve's own queue: each replica reports the requests its
engine holds, waiting and running (`Replica.record_autoscaling_stats`), with the target it
was given; the replicas wanted are what the deployment holds, plus the requests Ray queued
before any replica took them, over that target. Ray's wrapper then applies min_replicas,
max_replicas and the up- and downscale delays.

Why not Ray's default (ongoing requests a replica): a request waiting in the engine for a
batch to fill is ongoing too, so the default grows the deployment exactly when batches are
filling; the engine's counts are those its queue holds, and the target is in requests a
replica should hold to keep its batches full (twice its largest, by default).
"""

from __future__ import annotations

from typing import Any


def queue_policy(ctx: Any) -> tuple[float, dict[str, Any]]:
    """The replicas wanted, from an `AutoscalingContext` (Ray's); no state kept."""
    reported = ctx.aggregated_metrics or {}
    held, targets = reported.get("requests", {}), reported.get("target_requests", {})
    if ctx.current_num_replicas == 0 or not targets:
        return ctx.target_num_replicas, {}
    load = sum(held.values()) + (ctx.total_queued_requests or 0.0)
    return load / max(targets.values()), {}

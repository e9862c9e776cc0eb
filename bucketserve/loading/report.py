"""What load decided about a model, said: the invariance check's verdict in the log, and the
config as served (effective values, never nulls) for `/v2/models/{m}/config`."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from bucketserve.core.bucketing import BucketPlan, Invariance, Policy
from bucketserve.core.layout import SAME_STEPS, InputRole, Layout
from bucketserve.core.model import SequenceRules
from bucketserve.loading.repository import ModelSpec
from bucketserve.loading.speed import Speed

log = logging.getLogger(__name__)

STRICTNESS = [Policy.BUCKETS, Policy.EXACT_LENGTH, Policy.SINGLE]
SERVED_AS = {
    Policy.BUCKETS: "served in length buckets",
    Policy.EXACT_LENGTH: "served in batches of exactly equal length, never padded",
    Policy.SINGLE: "served one sequence per run (exact, but unbatched)",
}


def _figure(value: float) -> float | str:
    return value if math.isfinite(value) else "failed"


def log_verdict(
    name: str,
    invariance: Invariance,
    policy: Policy,
    configured: str,
    failures: Sequence[str],
    single: str | None = None,
) -> None:
    """One line on what batching does to the model and how it is served; a warning when it
    is not served in buckets, or when the config asks for more batching than the check found
    safe. `single`: why the model cannot run batches at all."""
    if single is not None:
        log.warning("model %s: %s: %s", name, single, SERVED_AS[Policy.SINGLE])
        return
    measured = invariance.policy
    figures = (
        f"padding moves its outputs by {invariance.padding:.2g}, batching by "
        f"{invariance.batching:.2g} (tolerance {invariance.tolerance:.2g})"
    )
    for failure in failures:
        log.warning("model %s: %s", name, failure)
    if configured == "auto":
        level = logging.INFO if policy is Policy.BUCKETS else logging.WARNING
        log.log(level, "model %s: %s: %s", name, figures, SERVED_AS[policy])
    elif STRICTNESS.index(policy) < STRICTNESS.index(measured):
        log.warning(
            "model %s: %s, so it should be %s, but batching.policy = %r is set: its answers "
            "may differ from the model run alone by that much (the worst the check saw, on full "
            "batches like its traffic's too: texts, or pairs for a pair classifier)",
            name,
            figures,
            SERVED_AS[measured],
            configured,
        )
    else:
        log.info(
            "model %s: %s: %s (batching.policy = %r)", name, figures, SERVED_AS[policy], configured
        )


def log_speed(name: str, speed: Speed) -> None:
    """One line on whether batching pays (`speed`); a warning when it loses."""
    figures = (
        f"{speed.rows} rows of {speed.length} batched run {speed.batched_per_s:.0f} sequences/s, "
        f"one at a time {speed.single_per_s:.0f}/s ({speed.ratio:.2f}x)"
    )
    if speed.batching_loses:
        log.warning("model %s: %s: batching loses, %s", name, figures, SERVED_AS[Policy.SINGLE])
    else:
        log.info("model %s: %s", name, figures)


def pad_safe_report(
    name: str, nodes: list[str], before: Invariance, after: Invariance
) -> dict[str, Any]:
    """Said when a model's recurrent nodes were given each row's length (`pad_safe`): what was
    rewritten, the check's figures before and after, and which copy is served."""
    kept = after.policy is Policy.BUCKETS
    log.log(
        logging.INFO if kept else logging.WARNING,
        "model %s: %s given each row's length: padding moved its outputs by %.2g, now by %.2g: %s",
        name,
        ", ".join(nodes),
        before.padding,
        after.padding,
        "the rewritten copy is served, in length buckets"
        if kept
        else "still pad-sensitive, the model is served as it is",
    )
    return {
        "rewritten": nodes,
        "padding_before": _figure(before.padding),
        "padding_after": _figure(after.padding),
        "batching_after": _figure(after.batching),
        "served": "rewritten" if kept else "original",
    }


def served_config(
    spec: ModelSpec,
    layout: Layout,
    rules: SequenceRules,
    binding: str,
    providers: Sequence[str],
    invariance: Invariance,
    plan: BucketPlan,
    failures: Sequence[str],
    single: str | None = None,
) -> dict[str, Any]:
    """The model's config.toml as served: fitted edges, overrides and everything found at load
    (axes, per_step, policy, binding, a multiple the model runs at) written in, and the
    check's figures beside it."""
    config = spec.config.model_dump(mode="json", exclude_none=True)
    config["mode"] = "mutable" if binding == "mutable" else "bucketing"
    config["binding"] = "shared-session" if binding == "mutable" else binding
    config["batching"]["policy"] = plan.policy.value
    config["batching"]["buckets"] = list(plan.edges)  # (served, not asked: at a multiple)
    config["batching"]["bucket_count"] = len(plan.edges)
    for inp in layout.inputs:
        if inp.role is InputRole.ROW_LENGTHS:  # (the server's own: no part of the contract)
            del config["inputs"][inp.tensor.name]
            continue
        if inp.tensor.batch_axis is None:  # a constant, or a sequence input without a batch
            if inp.tensor.time_axis is not None:
                config["inputs"][inp.tensor.name]["time_axis"] = inp.tensor.time_axis
            continue
        config["inputs"][inp.tensor.name] |= _axes(inp.tensor.batch_axis, inp.tensor.time_axis)
        if inp.role is InputRole.MASK:  # (which way it points: found at load, if not given)
            config["inputs"][inp.tensor.name]["pad_value"] = int(inp.fill)
    if rules.vocab_size is not None:
        config["inputs"][layout.sequence.tensor.name]["reserved_ids"] = list(rules.reserved_ids)
    if rules.min_length > 1:
        config["inputs"][layout.sequence.tensor.name]["min_length"] = rules.min_length
    if rules.multiple > 1:
        config["inputs"][layout.sequence.tensor.name]["multiple"] = rules.multiple
    for out in layout.outputs:
        config["outputs"][out.name] |= {"per_step": out.per_step}
        if out.batch_axis is not None:
            config["outputs"][out.name]["batch_axis"] = out.batch_axis
        if out.time_axis is not None:
            config["outputs"][out.name]["time_axis"] = out.time_axis
        if out.steps != SAME_STEPS:  # a strided time axis: how many steps for T
            config["outputs"][out.name]["steps"] = str(out.steps)
    return {
        **config,
        "name": spec.name,
        "version": str(spec.version),
        "strategy": binding,  # (the effective binding, under the name clients read)
        "providers": list(providers),
        "check": {
            "padding": _figure(invariance.padding),
            "batching": _figure(invariance.batching),
            "tolerance": invariance.tolerance,
            "policy": invariance.policy.value,
            "spread": _figure(invariance.spread),
            "failures": list(failures),
            **({} if single is None else {"single": single}),
        },
    }


def _axes(batch: int, time: int | None) -> dict[str, int]:
    return {"batch_axis": batch} | ({} if time is None else {"time_axis": time})

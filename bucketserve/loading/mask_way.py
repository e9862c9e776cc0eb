"""Which way a mask points, where the config does not say: found by the check.

A mask fed the wrong way round hides every real step, or attends only to the padding; the
check compares the server with itself, so it sees that only as answers that do not depend on
the input (a spread of none) or as padding that moves them. Where it sees either, `mask_way`
runs the check again with the mask turned round; if the model then reads its input (and
padding leaves it alone where it moved it), that is the way it is served, with a warning
naming the `pad_value` to write. A config that said the other way is refused with the fix.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from bucketserve.core.bucketing import Invariance
from bucketserve.core.layout import Input, InputRole, Layout
from bucketserve.errors import ConfigError
from bucketserve.loading.check import IGNORED
from bucketserve.loading.repository import ModelSpec

log = logging.getLogger(__name__)


def mask_of(layout: Layout) -> Input | None:
    return next((i for i in layout.inputs if i.role is InputRole.MASK), None)


def mask_way(
    spec: ModelSpec,
    layout: Layout,
    invariance: Invariance,
    check: Callable[[Layout], tuple[Invariance, list[str]]],
) -> tuple[Layout, Invariance, list[str], dict[str, Any]] | None:
    """Where the check shows the mask misread (answers that ignore the input, or that padding
    moves) and the mask turned round reads it (and padding leaves its answers alone where it
    moved them): the layout with the mask turned round, its check, and what was found. The
    model's own config said which way? Then ConfigError naming the fix."""
    mask = mask_of(layout)
    if mask is None or (reads_input(invariance) and invariance.padding <= invariance.tolerance):
        return None
    pad = 1 - int(mask.fill)
    turned = dataclasses.replace(
        layout,
        inputs=tuple(dataclasses.replace(i, fill=pad) if i is mask else i for i in layout.inputs),
    )
    try:
        other, failures = check(turned)
    except ConfigError:
        return None
    fixed = "reads its input" if not reads_input(invariance) else "padding leaves its answers alone"
    if not (
        reads_input(other) and (not reads_input(invariance) or other.padding <= other.tolerance)
    ):
        return None
    name = mask.tensor.name
    if "pad_value" in spec.config.inputs[name].model_fields_set:
        raise ConfigError(
            f"model {spec.name}: input {name} points the other way: with pad_value = "
            f"{pad} the model {fixed}, with {int(mask.fill)} it does not; set pad_value = {pad}"
        )
    log.warning(
        "model %s: input %s is a mask %s at padding (pad_value = %d): with it the model %s, "
        "the other way round it did not; write pad_value = %d in its config to say so",
        spec.name,
        name,
        "set" if pad else "clear",
        pad,
        fixed,
        pad,
    )
    return turned, other, failures, {"input": name, "pad_value": pad, "because": fixed}


def reads_input(invariance: Invariance) -> bool:
    """Whether different sequences got different answers: the model read its input."""
    return invariance.spread > IGNORED

"""Which way a mask points, decided at load on the model's own graph, before the server writes
any copy of it (a batch-1 declaration freed, RNNs given each row's length) and before the
invariance check; the copies and the check then feed it the way decided.

A mask fed the wrong way round hides every real step, or attends only to the padding. Seen
output by output, on sequences run alone (no padding, so nothing else can move them), the
wrong way shows as an output that stops reading its input (different sequences answered
alike) where the other way reads it, or answers that are not numbers (a mean over no real
step) where the other way's are. Outputs are read one by one because one output can ignore
the mask while another depends on it: a per-step path beside the RNN reads the tokens either
way, while the mean over the mask reads nothing the wrong way. Where both ways stay plausible
and their answers differ, padding decides: a sequence batched with a longer one and a pad row
keeps its answer alone only the right way; unless the model's rows move each other even
unpadded (int8's batch-wide scale), where padding moves it either way and tells nothing.
Where that still leaves both, and the config does not say, the load is refused naming
`pad_value`; a config that says one way where the model reads only the other is refused with
the fix. The way found where the config is silent is
served with a warning naming the `pad_value` to write, and said under `check.mask`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bucketserve.core.bucketing import Invariance
from bucketserve.core.layout import Input, InputRole, Layout
from bucketserve.core.model import SequenceRules
from bucketserve.errors import ConfigError
from bucketserve.loading.check import IGNORED, Run, difference, random_sequences
from bucketserve.loading.repository import ModelSpec

log = logging.getLogger(__name__)

PROBES = 3  # sequences of one length run alone each way: the spread is between them


@dataclass(frozen=True)
class MaskWay:
    """The way the mask is fed (its value at padding; None: the model has no mask), and what
    the load found where the config did not say it (for `check.mask`)."""

    fill: int | None = None
    found: dict[str, Any] | None = None

    def applied(self, layout: Layout) -> Layout:
        """`layout` with its mask fed this way."""
        if self.fill is None:
            return layout
        return dataclasses.replace(
            layout,
            inputs=tuple(
                dataclasses.replace(i, fill=self.fill) if i.role is InputRole.MASK else i
                for i in layout.inputs
            ),
        )


@dataclass(frozen=True)
class _Reading:
    """The model's answers to sequences alone with its mask fed one way: per output, whether
    different sequences are answered apart; whether every answer is a number."""

    answers: list[dict[str, np.ndarray]]
    reads: dict[str, bool]
    finite: bool

    def plausible(self, other: _Reading) -> bool:
        """No output ignores the input (or answers what is not a number) where the other way
        it does not, and some output reads it."""
        return (
            any(self.reads.values())
            and all(self.reads[o] or not other.reads[o] for o in self.reads)
            and (self.finite or not other.finite)
        )


def mask_of(layout: Layout) -> Input | None:
    return next((i for i in layout.inputs if i.role is InputRole.MASK), None)


def mask_way(
    spec: ModelSpec, layout: Layout, rules: SequenceRules, run: Run, tolerance: float
) -> MaskWay:
    """The way `spec`'s mask points (its graph run plainly by `run`), by the module's rules;
    ConfigError where its config says the other way, or where nothing tells the two apart and
    the config is silent."""
    mask = mask_of(layout)
    if mask is None:
        return MaskWay()
    name, given = mask.tensor.name, int(mask.fill)
    said = "pad_value" in spec.config.inputs[name].model_fields_set
    ways = {fill: MaskWay(fill).applied(layout) for fill in (given, 1 - given)}
    length = min(rules.max_length, rules.run_length(rules.min_length + 6))
    probes = random_sequences(rules, [length] * PROBES, seed=11)
    readings = {fill: _reading(way, probes, run) for fill, way in ways.items()}
    plausible = [f for f in ways if readings[f].plausible(readings[1 - f])]
    because = "reads its input"
    if len(plausible) == 2 and _apart(readings[0], readings[1]) > tolerance:
        unmoved = [f for f in ways if _padding(ways[f], rules, run) <= tolerance]
        if len(unmoved) == 1 and _batching(ways[given], probes, run) <= tolerance:
            plausible, because = unmoved, "padding leaves its answers alone"
        elif not said:
            raise ConfigError(
                f"model {spec.name}: input {name} is a mask, and the model reads its input "
                "with the mask either way round (nothing at load tells which is right): say "
                "which in its config, pad_value = 0 for ones on the real steps (Hugging Face's "
                "attention_mask) or pad_value = 1 for a mask set at the padding (ids == pad_id)"
            )
    if len(plausible) != 1 or plausible[0] == given:
        return MaskWay(given)
    fill = plausible[0]
    if said:
        raise ConfigError(
            f"model {spec.name}: input {name} points the other way: with pad_value = {fill} "
            f"the model {because}, with {given} it does not; set pad_value = {fill}"
        )
    log.warning(
        "model %s: input %s is a mask %s at padding (pad_value = %d): with it the model %s, "
        "the other way round it did not; write pad_value = %d in its config to say so",
        spec.name,
        name,
        "set" if fill else "clear",
        fill,
        because,
        fill,
    )
    return MaskWay(fill, {"input": name, "pad_value": fill, "because": because})


def _reading(layout: Layout, probes: Sequence[np.ndarray], run: Run) -> _Reading:
    try:
        answers = [_alone(layout, seq, run) for seq in probes]
    except Exception:  # ONNX Runtime refusing the mask this way round: a way it cannot take
        return _Reading([], dict.fromkeys(layout.output_names, False), finite=False)
    reads = {
        o: max(difference(a[o], answers[0][o]) for a in answers[1:]) > IGNORED for o in answers[0]
    }
    finite = all(np.isfinite(v).all() for a in answers for v in a.values())
    return _Reading(answers, reads, finite)


def _alone(layout: Layout, sequence: np.ndarray, run: Run) -> dict[str, np.ndarray]:
    (answer,) = layout.split(run(layout.collate([sequence], 1, len(sequence))), [len(sequence)])
    return answer


def _apart(one: _Reading, other: _Reading) -> float:
    """How far the two ways' answers to the same sequences are: none, and the way is moot."""
    return max(
        difference(b[o], a[o]) for a, b in zip(one.answers, other.answers, strict=True) for o in a
    )


def _batching(layout: Layout, probes: Sequence[np.ndarray], run: Run) -> float:
    """How far sequences of one length batched unpadded move each other's answers."""
    length = len(probes[0])
    together = layout.split(
        run(layout.collate(probes, len(probes), length)), [length] * len(probes)
    )
    alone = [_alone(layout, seq, run) for seq in probes]
    return max(difference(t[o], a[o]) for t, a in zip(together, alone, strict=True) for o in a)


def _padding(layout: Layout, rules: SequenceRules, run: Run) -> float:
    """How far padding moves answers with the mask this way: a short sequence and a longer
    one batched with a pad row, padded past the longer, against each alone."""
    lo, hi = rules.min_length, rules.max_length
    lengths = [rules.run_length(min(hi, lo + 2)), rules.run_length(min(hi, lo + 9))]
    sequences = random_sequences(rules, lengths, seed=12)
    padded = rules.run_length(min(hi, lengths[1] + 8))
    try:
        together = layout.split(run(layout.collate(sequences, 3, padded)), lengths)
        alone = [_alone(layout, seq, run) for seq in sequences]
    except Exception:  # (a batch it cannot run: padding is no help to it this way)
        return float("inf")
    return max(difference(t[o], a[o]) for t, a in zip(together, alone, strict=True) for o in a)


def reads_input(invariance: Invariance) -> bool:
    """Whether different sequences got different answers: the model read its input."""
    return invariance.spread > IGNORED

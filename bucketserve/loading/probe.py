"""What running the model tells about it at load, where its graph does not say.

- The shortest input it runs on: a strided front end needs some samples before it gives a
  frame (a sequence shorter than that is refused at the edge, naming the length).
- Whether it runs only at multiples of some length: a detector that adds a full-resolution
  path to one pooled over 32 x 32 cells and upsampled broadcasts only at widths that are
  multiples of 32. Then a sequence runs padded up to the next multiple, each output cut back
  to the steps that cover its real ones (an output L / s steps long for L: ceil(T / s)).
- Each output's batch and time axes, where the dim names leave them open: run one sequence at
  lengths from the shortest to the longest bucket, the dim that grows with the length is time;
  run two and three sequences, the dim that counts them is the batch.
- How each output's time axis follows the input's (`Steps`, floor((T + a) / s)): found by
  searching for the lengths where it grows, then checked at every bucket edge, the shortest
  and longest lengths and random ones between. A rule that holds only from some length on (a
  size clamped below) makes that length the shortest served. An output whose length follows
  no such rule refuses to load: the server must know every output shape it will bind.
- Whether rows stay apart: a model whose batch is fixed at 1, or whose outputs do not count
  the rows of a batch (an output declared [1, ...] that merges them, one flattened over batch
  and time), is served one sequence a run, and says why.

Outputs whose free dims carry the sequence input's names need none of this: their time axis is
the input's, step for step.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bucketserve.core.bucketing import round_up
from bucketserve.core.layout import SAME_STEPS, Layout, Steps, Tensor
from bucketserve.core.model import SequenceRules
from bucketserve.errors import ConfigError
from bucketserve.loading.axes import Axes, check_per_step
from bucketserve.loading.check import Run, random_sequences
from bucketserve.loading.repository import ModelSpec

log = logging.getLogger(__name__)

Shapes = dict[str, tuple[int, ...]]
VERIFIED_RANDOM = 8  # random lengths a step rule is checked at, besides the bucket edges


@dataclass(frozen=True)
class Probed:
    min_length: int
    outputs: dict[str, Tensor]  # every output, axes and steps settled
    single: str | None  # why the model runs one sequence at a time, if it must
    multiple: int = 1  # it runs only at lengths that are multiples of this


class _Failed(Exception):
    pass


class _Shapes:
    """Output shapes of the model run on random sequences, each shape run once."""

    def __init__(
        self,
        run: Run,
        inputs: Layout,
        rules: SequenceRules,
        names: list[str],
        rows_at: Callable[[int], int] | None = None,
    ) -> None:
        self.run, self.inputs, self.rules, self.names = run, inputs, rules, names
        self.rows_at = rows_at or (lambda length: 1 << 30)
        self._seen: dict[tuple[int, int], Shapes | str] = {}

    def at(self, rows: int, length: int) -> Shapes:
        """The outputs' shapes for `rows` sequences of `length`; _Failed when the model fails
        on them or gives an empty output."""
        key = (rows, length)
        if key not in self._seen:
            sequences = random_sequences(self.rules, [length] * rows, seed=length)
            try:
                outputs = self.run(self.inputs.collate(sequences, rows, length))
                shapes = {name: tuple(outputs[name].shape) for name in self.names}
                empty = [f"output {n} is empty {list(s)}" for n, s in shapes.items() if 0 in s]
                self._seen[key] = empty[0] if empty else shapes
            except Exception as exc:  # ONNX Runtime raises its own types
                self._seen[key] = str(exc).strip().splitlines()[-1][:300]
        seen = self._seen[key]
        if isinstance(seen, str):
            raise _Failed(seen)
        return seen

    def failure(self, rows: int, length: int) -> str:
        """What the model said when it failed on `rows` x `length` ("" if it ran)."""
        try:
            self.at(rows, length)
        except _Failed as exc:
            return str(exc)
        return ""

    def ok(self, rows: int, length: int) -> bool:
        try:
            self.at(rows, length)
        except _Failed:
            return False
        return True

    @property
    def lengths_alone(self) -> list[int]:
        """The lengths run so far with one sequence, which ran."""
        return sorted(n for (r, n), s in self._seen.items() if r == 1 and not isinstance(s, str))


def _first_above(size: Callable[[int], int], value: int, lo: int, hi: int) -> int | None:
    """The least length in (lo, hi] where the non-decreasing `size` exceeds `value`."""
    if size(hi) <= value:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if size(mid) > value:
            hi = mid
        else:
            lo = mid
    return hi


def fit_steps(size: Callable[[int], int], shortest: int, longest: int) -> Steps | None:
    """The rule floor((T + a) / s) that `size` (an output's steps for T input steps) follows
    from `shortest` to `longest`, found from where it grows; None when it grows by more
    than one step at once (no such rule)."""
    first = size(shortest)
    grows = _first_above(size, first, shortest, longest)
    if grows is None:  # constant over every length served
        stride = longest + 1
        return Steps(stride, first * stride - shortest)
    if size(grows) - size(grows - 1) != 1:
        return None
    again = _first_above(size, size(grows), grows, longest)
    stride = again - grows if again is not None else max(longest - grows + 1, grows - shortest)
    return Steps(stride, size(grows) * stride - grows)


def verification_lengths(shortest: int, longest: int, edges: list[int]) -> list[int]:
    """Where a step rule is checked: every bucket edge, the ends, and random lengths."""
    rng = np.random.default_rng(longest)
    spread = rng.integers(shortest, longest + 1, VERIFIED_RANDOM).tolist()
    return sorted({shortest, longest, *(e for e in edges if e >= shortest), *spread})


def probe(
    spec: ModelSpec,
    run: Run,
    inputs: Layout,
    rules: SequenceRules,
    rows_at: Callable[[int], int] | None = None,
) -> Probed:
    """The shortest length, every output's axes and steps, and whether rows stay apart, from
    runs up to `rules.max_length` and, at each length, of at most `rows_at(length)` rows
    (the shapes serving may run; default: any)."""
    fail = functools.partial(ConfigError.at, spec.onnx_path)
    names = list(spec.config.outputs)
    longest = rules.max_length
    edges = [e for e in spec.config.batching.edges if e <= longest]
    shapes = _Shapes(run, inputs, rules, names, rows_at)
    shortest = _shortest(shapes, longest, fail)
    multiple = _multiple(shapes, shortest, longest, edges, fail)
    if multiple > 1:
        log.info(
            "model %s: it runs only at lengths that are multiples of %d (from %d): a sequence "
            "runs padded up to one, its outputs cut back",
            spec.name,
            multiple,
            shortest,
        )
    longest = round_up(longest, multiple)
    lengths = sorted({shortest, round_up((shortest + longest) // 2, multiple), longest})
    open_axes = any(spec.axes.outputs[name] is None for name in names)
    alone = {n: shapes.at(1, n) for n in lengths} if open_axes else {}
    single = None
    if spec.axes.batch_fixed:
        single = "it has no batch axis" if spec.axes.unbatched else "its batch is fixed at 1"
    found: dict[str, tuple[int | None, int | None, tuple[int | None, ...]]] = {}
    for name in names:
        given = spec.axes.outputs[name]
        if given is not None:
            dims = spec.signature.outputs[name].dims
            fixed = tuple(
                d if isinstance(d, int) and i not in given.free() else None
                for i, d in enumerate(dims)
            )
            found[name] = (given.batch, given.time, fixed)
            continue
        time = _time_axis(name, alone, fail)
        batch: int | None = None
        if single is None:
            batch, single = _batch_axis(name, shapes, lengths, time)
        if batch is None:  # one sequence a run: a leading dim of 1 is its batch, if any
            first = [s[name] for s in alone.values()]
            lead = time != 0 and len(first[0]) > 1 and all(s[0] == 1 for s in first)
            batch = 0 if lead else None
        size = alone[shortest][name]
        check_per_step(name, spec.config.outputs[name].per_step, Axes(0, time), size, fail)
        fixed = tuple(None if i in (batch, time) else size[i] for i in range(len(size)))
        found[name] = (batch, time, fixed)
    outputs = {}
    served_from = shortest - multiple + 1  # (a shorter sequence runs padded to `shortest`)
    for name, (batch, time, fixed) in found.items():
        steps = SAME_STEPS
        if time is not None and name not in spec.axes.by_name and multiple > 1:
            steps = _steps_at_multiples(name, shapes, time, shapes.lengths_alone, multiple, fail)
        elif time is not None and name not in spec.axes.by_name:
            steps, since = _steps(name, shapes, time, shortest, longest, edges, fail)
            if since > served_from:
                log.info(
                    "model %s: output %s follows %s from %d steps: a shorter sequence is "
                    "refused, naming that length",
                    spec.name,
                    name,
                    steps,
                    since,
                )
                served_from = since
        dtype = spec.signature.outputs[name].dtype
        outputs[name] = Tensor(name, dtype, fixed, batch, time, steps)
    return Probed(served_from, outputs, single, multiple)


def _shortest(shapes: _Shapes, longest: int, fail: Callable[[str, str], ConfigError]) -> int:
    """The shortest length the model runs on, alone, with no output empty (binary search:
    a front end that needs n steps needs them at every length past n too)."""
    if shapes.ok(1, 1):
        return 1
    hi = 2
    while hi < longest and not shapes.ok(1, hi):
        hi *= 2
    hi = min(hi, longest)
    try:
        shapes.at(1, hi)
    except _Failed as exc:
        raise fail(
            "batching.buckets",
            f"the model runs on no length up to the longest bucket ({longest} steps): at "
            f"{hi} steps, {exc}; check the input roles (and vocab_size, and any size a shape "
            "fixes)",
        ) from None
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if shapes.ok(1, mid):
            hi = mid
        else:
            lo = mid
    return hi


def _multiple(
    shapes: _Shapes,
    shortest: int,
    longest: int,
    edges: list[int],
    fail: Callable[[str, str], ConfigError],
) -> int:
    """1 when the model runs at the length after its shortest; else the multiple it runs at:
    the least divisor m of the shortest length at which it runs `shortest + m` steps, then
    checked at every bucket edge rounded up to one."""
    if shortest >= longest or shapes.ok(1, shortest + 1):
        return 1
    divisors = [m for m in range(2, shortest + 1) if shortest % m == 0]
    multiple = next((m for m in divisors if shapes.ok(1, shortest + m)), None)
    if multiple is None:
        raise fail(
            "batching.buckets",
            f"the model runs at {shortest} steps but at none of {shortest + 1} to "
            f"{2 * shortest} ({shapes.failure(1, shortest + 1)}): bucketserve serves models "
            "that run at every length from their shortest, or at every multiple of one",
        )
    for length in sorted({round_up(n, multiple) for n in (*edges, longest)}):
        if not shapes.ok(1, length):
            raise fail(
                "batching.buckets",
                f"the model runs at {shortest} and {shortest + multiple} steps, as at "
                f"multiples of {multiple}, but not at {length} "
                f"({shapes.failure(1, length)})",
            )
    return multiple


def _steps_at_multiples(
    name: str,
    shapes: _Shapes,
    axis: int,
    lengths: list[int],
    multiple: int,
    fail: Callable[[str, str], ConfigError],
) -> Steps:
    """How output `name`'s time axis follows the input's for a model that runs only at
    multiples of `multiple`: L / s steps at every length L it was run at (s dividing the
    multiple), so a sequence of T steps, run padded, keeps the ceil(T / s) that cover it."""
    sizes = {n: shapes.at(1, n)[name][axis] for n in lengths}
    strides = {n // size if size and n % size == 0 else 0 for n, size in sizes.items()}
    stride = strides.pop() if len(strides) == 1 else 0
    if not stride or multiple % stride:
        shown = ", ".join(f"{size} steps for {n}" for n, size in sizes.items())
        raise fail(
            f"outputs.{name}",
            f"its time axis is {shown}: for a model that runs at multiples of {multiple}, "
            f"bucketserve serves outputs of L / s steps for L, s dividing {multiple}",
        )
    return Steps(stride, stride - 1)


def _time_axis(
    name: str, alone: dict[int, Shapes], fail: Callable[[str, str], ConfigError]
) -> int | None:
    """The one dim of output `name` that follows the length (run alone at several), if any."""
    sizes = [s[name] for s in alone.values()]
    if len({len(s) for s in sizes}) > 1:
        raise fail(f"outputs.{name}", f"its rank changes with the length: {sizes}")
    varying = [i for i in range(len(sizes[0])) if len({s[i] for s in sizes}) > 1]
    if len(varying) > 1:
        shown = ", ".join(f"{list(s)} at {n} steps" for n, s in zip(alone, sizes, strict=True))
        raise fail(
            f"outputs.{name}",
            f"its shape is {shown}: more than one dim follows the length; bucketserve serves "
            "outputs with one batch axis, at most one time axis, and fixed sizes otherwise",
        )
    return varying[0] if varying else None


def _batch_axis(
    name: str, shapes: _Shapes, lengths: list[int], time: int | None
) -> tuple[int | None, str | None]:
    """The dim of output `name` that counts the rows of a batch, or why there is none (then
    the model runs one sequence at a time)."""
    three = max((n for n in lengths if shapes.rows_at(n) >= 3), default=lengths[0])
    points = [(2, lengths[0]), (3, three)]
    try:
        batched = [(rows, n, shapes.at(rows, n)[name], shapes.at(1, n)[name]) for rows, n in points]
    except _Failed as exc:
        return None, f"a batch of {points[0][0]} fails ({exc})"
    rank = len(batched[0][3])
    candidates = [
        i
        for i in range(rank)
        if i != time
        and all(
            len(shape) == rank
            and shape[i] == rows
            and one[i] == 1
            and all(shape[j] == one[j] for j in range(rank) if j != i)
            for rows, _, shape, one in batched
        )
    ]
    if len(candidates) == 1:
        return candidates[0], None
    rows, n, shape, one = batched[0]
    return None, (
        f"output {name} does not count the rows of a batch ({list(one)} for one sequence of "
        f"{n} steps, {list(shape)} for {rows})"
    )


def _steps(
    name: str,
    shapes: _Shapes,
    axis: int,
    shortest: int,
    longest: int,
    edges: list[int],
    fail: Callable[[str, str], ConfigError],
) -> tuple[Steps, int]:
    """How output `name`'s time axis follows the input's, checked at every length of
    `verification_lengths` and every length run so far, and the length it follows it from:
    a rule that holds only past some length (a size clamped below, as an adaptive pooling
    keeps one step) holds from the least length past the last it misses."""

    def size(length: int) -> int:
        return shapes.at(1, length)[name][axis]

    try:
        steps = fit_steps(size, shortest, longest)
        checked = sorted({*verification_lengths(shortest, longest, edges), *shapes.lengths_alone})
        wrong = [n for n in checked if steps is None or steps.of(n) != size(n)]
        since = shortest
        if steps is not None and wrong and max(wrong) < longest:  # from some length on?
            rule = steps
            since = _first_above(lambda n: rule.of(n) == size(n), 0, max(wrong), longest) or 0
            wrong = [n for n in checked if n >= since and rule.of(n) != size(n)]
    except _Failed as exc:
        raise fail(f"outputs.{name}", f"running the model alone to measure it: {exc}") from None
    if steps is None or wrong:
        shown = ", ".join(f"{size(n)} steps for {n}" for n in checked[:6])
        raise fail(
            f"outputs.{name}",
            f"its time axis follows the input's by no rule floor((T + a) / s) ({shown}...): "
            "the server could not know the shape it will bind",
        )
    return steps, since

"""The builder: a model spec becomes a ready model.

spec -> the file its sessions load (for session-per-key, written once so they share weights)
-> what a batch of it needs in memory, and so the lengths and rows the budget leaves it
(`room`), which bound every run from here on -> a load-time session -> layout and rules
(`layouts`) -> which way a mask points, decided on the original graph (`mask_way`) -> the
invariance check (a model that does not read its input refused) and the policy it allows,
where a copy may serve better checked too, its mask fed the way decided (a batch-1
declaration freed, `batch_free`; RNNs given each row's length, `pad_safe`) -> whether
batching pays (`speed`) -> the bucket plan -> an executor (and, on a CPU, a second one on
every core for a batch that runs alone, when it answers as the first) -> the keys the config
asks for bound and warm -> `Model`. The loader (`loader`) calls it for every model of a
repository.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from bucketserve.core.bucketing import BucketPlan, Invariance, Policy, round_up
from bucketserve.core.budget import Hold
from bucketserve.core.layout import InputRole, Layout
from bucketserve.core.model import Model, ModelInfo, SequenceRules
from bucketserve.core.task import Task
from bucketserve.errors import ConfigError, brief
from bucketserve.loading.batch_free import freed_spec
from bucketserve.loading.calibration import calibrated
from bucketserve.loading.check import (
    Run,
    Traffic,
    guarded,
    guarded_batches,
    measure,
    thread_difference,
)
from bucketserve.loading.config import TokenizerConfig
from bucketserve.loading.fingerprint import fingerprint_of
from bucketserve.loading.layouts import Served, input_layout, layout_of
from bucketserve.loading.mask_way import MaskWay, mask_of, mask_way, reads_input
from bucketserve.loading.pad_safe import pad_safe_spec
from bucketserve.loading.report import log_speed, log_verdict, pad_safe_report, served_config
from bucketserve.loading.repository import (
    ModelSpec,
)
from bucketserve.loading.room import Room, footprint_of
from bucketserve.loading.rules import Sources, task_rules
from bucketserve.loading.served_file import default_cache_dir, served_graph
from bucketserve.loading.speed import Speed, measure_speed
from bucketserve.loading.traffic import traffic
from bucketserve.runtime.binding import run_bound
from bucketserve.runtime.executors import Executor, make_executor
from bucketserve.runtime.sessions import (
    GraphFile,
    Session,
    create_session,
    own_pools_allowed,
    run_all,
    runs_on_cpu,
)
from bucketserve.runtime.weights import SharedWeights

log = logging.getLogger(__name__)


def load_tokenizer(path: Path, max_length: int) -> Tokenizer:
    """The tokenizer, with any padding it carries turned off and truncation at `max_length`.

    (all-MiniLM's tokenizer.json pads every text to 128: that would make every request cost
    128 tokens whatever its length.)
    """
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    return tokenizer


def special_tokens(tokenizer: Tokenizer | None) -> dict[str, int]:
    """The tokenizer's special tokens by their text: those it adds as special, and those its
    post-processor frames a text with (none without a tokenizer)."""
    if tokenizer is None:
        return {}
    added = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    framed = tokenizer.encode("")
    marked = zip(framed.tokens, framed.ids, framed.special_tokens_mask, strict=True)
    return added | {token: i for token, i, mark in marked if mark}


def build_model(
    spec: ModelSpec,
    binding: str | None = None,
    cache_dir: Path | None = None,
    lone_batch_threads: int | None = None,
    fingerprint: str | None = None,
    budget: int | None = None,
    hold: Hold | None = None,
) -> Model:
    """Load `spec`: the file its sessions share, what its batches need in memory, its layout,
    the invariance check and the policy it allows, the executor, then bind and warm the keys
    that the config asks for. `binding` overrides the config's mode and binding (tests,
    benchmarks); `cache_dir` is where session-per-key writes the weights its sessions share
    (default: the user's cache); `lone_batch_threads`: threads of the runner for a batch that
    runs alone (None: none); `fingerprint`: the spec's, where the caller read it already
    (`loading.fingerprint`); `budget`: the bytes every batch running at once may need
    together (None: not bounded): nothing at load runs a batch that would not fit, and no
    key holds more rows than fit alone; `hold`: where each run at load holds its memory in
    that budget (a model loaded while others serve)."""
    began = time.perf_counter()
    fingerprint = fingerprint or fingerprint_of(spec)  # (the files as given, not a served copy)
    wanted = binding or (spec.config.binding if spec.config.mode == "bucketing" else "mutable")
    cache = cache_dir or default_cache_dir()
    room = Room(budget, footprint_of(spec, wanted, cache, budget, hold), hold)
    checked, found = _served_copy(spec, wanted, cache, room)
    spec, config, served = checked.spec, checked.spec.config, checked.served
    tokenizer = (
        load_tokenizer(spec.tokenizer_path, config.tokenizer.max_length)
        if spec.tokenizer_path is not None and config.tokenizer is not None
        else None
    )
    pad_id = int(config.inputs[config.sequence_input].pad_value)
    sources = Sources(spec, served.layout, special_tokens(tokenizer), pad_id, tokenizer is not None)
    served_tasks = task_rules(sources)
    plan, speed = _planned(checked, room)
    executor, lone = _runners(checked, wanted, plan, lone_batch_threads)
    described = served_config(  # (the providers in use: the load session's are the same)
        spec,
        served.layout,
        served.rules,
        executor.binding,
        checked.session.get_providers(),
        checked.invariance,
        plan,
        checked.failures,
        served.single,
    )
    if lone is not None:
        described["lone_batch_threads"] = lone_batch_threads
    described["memory"] = room.described(spec, plan, checked.graph.arena)
    if speed is not None:
        found["speed"] = speed.described()
    described["check"] |= found
    batching = config.batching
    info = ModelInfo(
        name=spec.name,
        version=spec.version,
        layout=served.layout,
        plan=plan,
        # (a sequence is read up to the longest bucket; one past what fits in memory is
        # refused after, with the memory's reasons, not the length's)
        rules=dataclasses.replace(served.rules, max_length=batching.longest),
        max_queue_delay_s=batching.max_queue_delay_ms / 1000,
        queue_capacity=batching.queue_capacity,
        invariance=checked.invariance,
        text_chars=config.tokenizer.chars if config.tokenizer is not None else None,
        served_config=described,
        task_rules=served_tasks,
        prompts=dict(config.prompts or {}),
        aliases=tuple(config.aliases),
        fingerprint=fingerprint,
        long_inputs=config.tokenizer.long_inputs if config.tokenizer is not None else "truncate",
        window_overlap=_overlap(config.tokenizer, tokenizer),
    )
    described["tasks"] = info.tasks  # (the same mapping the config route serves)
    model = Model(info, executor, tokenizer, lone)
    every = batching.prepare == "all" and plan.policy is Policy.BUCKETS
    for key in [plan.default_key, *(plan.all_keys() if every else [])]:
        with room.holding(key.rows, key.length):  # (a static session warms the whole key)
            model.prepare(key)
    calibration = calibrated(model, spec, cache_dir or default_cache_dir())
    if calibration is not None:  # (the embedding's rule, with its ranges: int8 and uint8)
        rules = dict(info.task_rules)
        rules[Task.EMBED] = dataclasses.replace(rules[Task.EMBED], calibration=calibration)
        model.info = dataclasses.replace(info, task_rules=rules)
        described["embedding_calibration"] = calibration.described()
    loaded_s = time.perf_counter() - began
    described["load_seconds"] = {"total": round(loaded_s, 3), "check": round(checked.seconds, 3)}
    log.info(
        "model %s v%d: %s, keys %s bound, providers %s; loaded in %.2f s (the check %.2f s)",
        spec.name,
        spec.version,
        executor.binding,
        ", ".join(map(str, sorted(executor.bound_keys))),
        executor.providers,
        loaded_s,
        checked.seconds,
    )
    return model


def _overlap(config: TokenizerConfig | None, tokenizer: Tokenizer | None) -> int:
    """The windows' overlap, checked: less than the tokens a window holds of a text."""
    if config is None or tokenizer is None:
        return 0
    room = config.max_length - tokenizer.num_special_tokens_to_add(False)
    if config.window_overlap >= room:
        raise ConfigError(
            f"[tokenizer] window_overlap {config.window_overlap}: a window holds {room} tokens "
            "of a text (max_length less the special tokens); the overlap must be fewer"
        )
    return config.window_overlap


def _served_copy(
    spec: ModelSpec, wanted: str, cache: Path, room: Room
) -> tuple[_Checked, dict[str, Any]]:
    """The check of `spec`, then of the copies that may serve it better (a batch-1
    declaration freed, RNNs given each row's length): the one served, and what was found
    (for the config route's `check`). The copies need what the original needs in memory."""
    checked = _checked(spec, wanted, cache, room)
    found: dict[str, Any] = {}
    if checked.mask.found is not None:
        found["mask"] = checked.mask.found
    auto = spec.config.batching.policy == "auto"
    if spec.axes.batch_fixed and not spec.axes.unbatched and auto:
        checked, found["batch_freed"] = _batch_freed(checked, wanted, cache, room)
    spec = checked.spec
    if (
        checked.invariance.policy is Policy.EXACT_LENGTH
        and auto
        and (safe := pad_safe_spec(spec, cache, checked.graph.path, checked.served)) is not None
    ):
        try:
            again = _checked(safe[0], wanted, cache, room, checked.mask)
        except Exception as exc:  # a ConfigError, or ONNX Runtime refusing the rewritten copy
            log.warning(
                "model %s: %s given each row's length fails the check (%s): the model is served "
                "as it is",
                spec.name,
                ", ".join(safe[1]),
                brief(str(exc)),
            )
            found["pad_safe"] = {
                "rewritten": safe[1],
                "served": "original",
                "check": "failed (logged)",
            }
        else:
            found["pad_safe"] = pad_safe_report(
                spec.name, safe[1], checked.invariance, again.invariance
            )
            if again.invariance.policy is Policy.BUCKETS:
                checked = again
    return checked, found


def _planned(checked: _Checked, room: Room) -> tuple[BucketPlan, Speed | None]:
    """The bucket plan at the policy the check allows (or the config sets), said in the log,
    up to the longest length whose batch of one fits the memory budget, no key holding more
    rows than fit; where it batches exactly and the config leaves it to the check, whether
    batching pays (one sequence a run where it does not)."""
    spec, served, invariance = checked.spec, checked.served, checked.invariance
    batching, rules = spec.config.batching, served.rules
    policy = invariance.policy if batching.policy == "auto" else Policy(batching.policy)
    if served.single is not None:  # no config makes a model batch that cannot
        policy = Policy.SINGLE
    log_verdict(spec.name, invariance, policy, batching.policy, checked.failures, served.single)
    edges = sorted({round_up(edge, rules.multiple) for edge in room.edges(spec)})
    if room.longest(spec) < batching.longest:  # (cut where one sequence stops fitting: no
        fits = max(rules.multiple, room.longest(spec) // rules.multiple * rules.multiple)
        edges = sorted({min(edge, fits) for edge in edges})  # edge rounded up past it)
    plan = BucketPlan(
        tuple(edges),
        batching.max_batch_size,
        batching.max_batch_tokens,
        policy,
        rules.multiple,
        room.footprint,
        room.budget,
    )
    if batching.policy != "auto" or policy is Policy.SINGLE:
        return plan, None
    speed = measure_speed(checked.session, served.layout, rules, plan)
    if speed is not None:
        log_speed(spec.name, speed)
        if speed.batching_loses:
            plan = dataclasses.replace(plan, policy=Policy.SINGLE)
    return plan, speed


def _runners(
    checked: _Checked, wanted: str, plan: BucketPlan, lone_threads: int | None
) -> tuple[Executor, Executor | None]:
    """The executor of the binding asked for (unpadded batches, equal lengths or one sequence,
    run at their own shape: one session with buffers at the largest), and, on a CPU, a second
    on `lone_threads` for a batch that runs alone, where it answers as the first."""
    graph, session, served = checked.graph, checked.session, checked.served
    final = wanted if plan.policy is Policy.BUCKETS else "mutable"
    static = wanted == "session-per-key"
    executor = make_executor(final, graph, served.layout, plan, None if static else session)
    if not lone_threads or static or plan.policy is not Policy.BUCKETS:
        return executor, None
    run = functools.partial(run_all, session)
    layout, rules = served.layout, served.rules
    lone = lone_runner(checked.spec, final, graph, layout, rules, plan, run, lone_threads)
    return executor, lone


def _batch_freed(
    checked: _Checked, binding: str, cache: Path, room: Room
) -> tuple[_Checked, dict[str, Any]]:
    """A model declared for a batch of 1: its copy with the declaration freed, checked, and
    served where the check finds it batches exactly (`batch_free`); else the original."""
    name = checked.spec.name
    try:
        again = _checked(freed_spec(checked.spec, cache), binding, cache, room, checked.mask)
    except Exception as exc:  # a ConfigError, or ONNX Runtime refusing the freed copy
        log.warning(
            "model %s: with its batch-1 declaration freed, its copy fails the check (%s): "
            "served one sequence a run",
            name,
            brief(str(exc)),
        )
        return checked, {"served": "original", "check": "failed (logged)"}
    policy = again.invariance.policy if again.served.single is None else Policy.SINGLE
    if policy is Policy.SINGLE:
        log.info(
            "model %s: declared for a batch of 1, and its graph does not batch exactly (%s): "
            "served one sequence a run",
            name,
            again.served.single or f"batching moves its answers by {again.invariance.batching:.2g}",
        )
        return checked, {"served": "original", "policy": policy.value}
    log.info(
        "model %s: declared for a batch of 1, its graph batches exactly: served from a copy "
        "with the declaration freed (%s)",
        name,
        policy.value,
    )
    return again, {"served": "freed", "policy": policy.value}


@dataclass(frozen=True)
class _Checked:
    """A spec with its served file, load session, layout and what the check measured."""

    spec: ModelSpec
    graph: GraphFile
    session: Session
    served: Served
    invariance: Invariance
    failures: list[str]
    seconds: float  # the check's
    mask: MaskWay  # the way its mask is fed, decided on the original graph


def _checked(
    spec: ModelSpec, binding: str, cache_dir: Path, room: Room, mask: MaskWay | None = None
) -> _Checked:
    """The file `spec`'s sessions load, one session on it for load time, the layout found by
    running it, its mask fed the way `mask` says (None: the original graph, whose mask's way
    is decided here, `mask_way`), and the invariance check, each running only shapes serving
    may run (`room`). ConfigError for a model that does not read its input."""
    static = binding == "session-per-key"
    graph = dataclasses.replace(served_graph(spec, cache_dir, static), arena=room.arena(spec))
    # One session for what load time runs (probes, the check). Session-per-key shares the
    # memmapped weights, so this one does too (no private copy); otherwise it is the session
    # the executor keeps.
    session = create_session(graph, weights=SharedWeights(graph.path) if static else None)
    inputs = input_layout(spec)
    allows = room.allows(spec)
    run = guarded(spec.name, functools.partial(run_all, session), inputs, allows, room.holding)
    served = layout_of(spec, run, room.longest(spec), room.rows_at(spec))
    began = time.perf_counter()
    tolerance = spec.config.batching.tolerance
    if mask is None:
        mask = mask_way(spec, served.layout, served.rules, run, tolerance)
    served = dataclasses.replace(served, layout=mask.applied(served.layout))
    together = functools.partial(run_bound, session, served.layout)
    invariance, failures = measure(
        spec.name,
        run,
        guarded_batches(spec.name, together, allows, room.holding),
        served.layout,
        served.rules,
        room.edges(spec),
        tolerance,
        batched=served.single is None,
        traffic=traffic_of(spec, served.rules, room.rows_at(spec)),
        full=spec.config.batching.policy != "auto",  # (a forced policy: its bound is said)
        rows_at=room.rows_at(spec),
    )

    if not reads_input(invariance):
        raise ConfigError(
            f"model {spec.name}: answers the same whatever the sequence (different sequences "
            f"alone differ by {invariance.spread:.2g}): it does not read its input as the server "
            "feeds it; check each input's role"
            + (", and the mask's pad_value" if mask_of(served.layout) is not None else "")
        )
    seconds = time.perf_counter() - began
    return _Checked(spec, graph, session, served, invariance, failures, seconds, mask)


def traffic_of(
    spec: ModelSpec, rules: SequenceRules, rows_at: Callable[[int], int] | None = None
) -> Traffic:
    """Sequences like `spec`'s traffic for the check: its texts (a classifier that takes token
    types is sent pairs), or random valid sequences for a model without a tokenizer; a full
    batch as the config and `rows_at` (the memory budget) allow."""
    config = spec.config
    tokenizer = None
    if spec.tokenizer_path is not None and config.tokenizer is not None:
        tokenizer = load_tokenizer(spec.tokenizer_path, config.tokenizer.max_length)
    roles = {i.role for i in config.inputs.values()}
    pairs = config.classifier is not None and InputRole.TOKEN_TYPES in roles
    return traffic(rules, config.batching, tokenizer, pairs, rows_at)


def lone_runner(
    spec: ModelSpec,
    binding: str,
    graph: GraphFile,
    layout: Layout,
    rules: SequenceRules,
    plan: BucketPlan,
    run: Run,
    threads: int,
) -> Executor | None:
    """A second executor of `binding`, on a session with `threads` of its own, for a batch
    that runs alone; None, and a warning, unless its answers stay within the model's tolerance
    of the load session's (a thread count may change how a kernel splits its sums)."""
    if not runs_on_cpu(list(graph.providers)) or not own_pools_allowed():
        return None
    lone = create_session(graph, threads=threads)
    difference = thread_difference(spec.name, run, functools.partial(run_all, lone), layout, rules)
    if difference > spec.config.batching.tolerance:
        log.warning(
            "model %s: on %d threads its answers move by %.3g (tolerance %.3g): a batch that "
            "runs alone stays on its one thread",
            spec.name,
            threads,
            difference,
            spec.config.batching.tolerance,
        )
        return None
    log.info(
        "model %s: a batch that runs alone gets %d threads (its answers within %.3g of one's)",
        spec.name,
        threads,
        difference,
    )
    return make_executor(binding, graph, layout, plan, lone)

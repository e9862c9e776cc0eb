"""The engine: the request path and the lifecycle. `infer(call)` is the one entrance every edge
uses; `start`, `drain` and `stop` run the models the registry serves, each version with its
scheduler. Imports the registry, the call, the scheduler and the lifecycle below it.

A call is decided here, in this order: which model and version (the registry resolves it, by
the head's task where the call names none); its deadline (from then); its priority level; its
head: the task that answers from the outputs, or the outputs asked for by name
(`heads.Picked`); how many sequences (too many, or more than the queue can take now, is
refused before anything is decoded); the sequences, validated (tokenised, for texts); the
request's token budget; what the task needs of each sequence; then the model's scheduler
answers them (at the call's level, charged to its tenant): from the answers it keeps, by each
sequence's identity (its exact inputs and the answer asked), where the model's answers cannot
depend on batching; else by a run, the head answering each from its outputs in the worker
thread as its batch finishes. A head that runs no model (the tokenizer alone) is answered
here once admitted. Inputs taken whole in windows (`calls.in_windows`) are run window by
window, as sequences like any other, and each input's answer is then made of its windows'
(`heads.WindowHead`).

The engine's one lifecycle state is shared by every scheduler it runs, those started after a
drain began included: a model that model control loads during a drain admits nothing. A model
that control replaces or unloads is `retire`d: its scheduler stops once the last request that
resolved to it has left. Without a running event loop it is also the Python API
(`model(name).predict`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from bucketserve.core.budget import MemoryBudget
from bucketserve.core.calls import (
    Answer,
    Call,
    Inputs,
    LateChunks,
    TextPairs,
    Texts,
    Windowed,
)
from bucketserve.core.heads import DirectHead, Picked, TextHead, WindowHead, answer_key
from bucketserve.core.layout import Outputs
from bucketserve.core.lifecycle import Lifecycle
from bucketserve.core.model import Model
from bucketserve.core.registry import Registry
from bucketserve.core.result_cache import Reuse, exact_inputs, refused_because
from bucketserve.core.scheduler import Scheduler
from bucketserve.core.shares import Shares
from bucketserve.core.task import Task
from bucketserve.errors import InvalidInput, PayloadTooLarge
from bucketserve.metrics import Metrics
from bucketserve.settings import BULK_LEVEL, Settings
from bucketserve.tracing import Tracing

log = logging.getLogger(__name__)

BULK_WAIT_S = 24 * 3600  # a bulk job's line: it waits within its job's completion window


class Engine:
    def __init__(
        self,
        registry: Registry,
        settings: Settings | None = None,
        instances: int = 1,
        tracing: Tracing | None = None,
        shares: Callable[[], Shares] = Shares,
        memory: MemoryBudget | None = None,
    ) -> None:
        """Run what `registry` serves (`bucketserve.loading.load_engine` builds it from a
        repository). `instances`: batches of one model that may run at once. `tracing`:
        where the spans go (default: off). `shares`: each model's tenants' shares, fresh.
        `memory`: the budget every batch running at once shares, whatever its model (the
        one the models' plans were made for; default: no bound)."""
        self.registry = registry
        self.settings = settings or Settings()
        self.instances = instances
        self.tracing = tracing or Tracing()
        self.memory = memory or MemoryBudget(None)
        self._shares = shares
        self.lifecycle = Lifecycle()
        self._served: dict[Model, Running] = {}  # every model running, by the model object
        self._metrics: Metrics | None = None

    def model(
        self, name: str | None = None, version: str | None = None, task: Task = Task.PREDICT
    ) -> Model:
        """The model served under `name` (when None: the one for `task`, `Registry.for_task`),
        at `version` if one is named."""
        return self.registry.resolve(name, version, task)

    @property
    def draining(self) -> bool:
        return self.lifecycle.draining

    @property
    def ready(self) -> bool:
        """Whether it takes traffic: every model that loaded is running, and no drain began
        (the lifecycle is serving)."""
        return self.lifecycle.serving

    @property
    def schedulers(self) -> dict[str, Scheduler]:
        """The scheduler of each model served by name (at the version served by default)."""
        return {name: self._served[m].scheduler for name, m in self.registry.models.items()}

    @property
    def running_models(self) -> int:
        """Models (versions) whose scheduler runs: those served, and those retiring."""
        return len(self._served)

    # -- the lifecycle (inside an event loop) ---------------------------------------------

    def start(self, metrics: Metrics) -> None:
        """A scheduler for every model the registry serves, running; from the event loop."""
        self._metrics = metrics
        memory = self.memory
        metrics.watch_memory(
            memory.total, lambda: memory.used, lambda: memory.peak, lambda: memory.waiting
        )
        for model in self.registry.served():
            self.run(model)
        for name in self.registry.failed:
            metrics.model_failed(name)
        self.lifecycle.serve()

    def run(self, model: Model) -> None:
        """`model`'s scheduler, created and running (at start, and for each model control
        loads): it obeys the engine's drain, whenever it starts."""
        metrics = self._metrics
        assert metrics is not None, "run a model while not serving"
        info = model.info
        reuse = None if self.cache_refused(model) else Reuse(self.cache_bound_bytes)
        scheduler = Scheduler(
            model,
            metrics,
            max_delay_s=info.max_queue_delay_s,
            capacity=info.queue_capacity,
            instances=self.instances,
            tracing=self.tracing,
            attributes={
                "bucketserve.model": model.name,
                "bucketserve.model_version": str(info.version),
            },
            lifecycle=self.lifecycle,
            shares=self._shares(),
            max_overtakes=self.settings.max_overtakes,
            reuse=reuse,
            memory=self.memory,
        )
        if info.plan.max_length > self.settings.max_request_tokens:
            log.warning(
                "model %s: its buckets reach %d steps, but a request may hold %d at most: a "
                "longer sequence is refused (422); raise --max-request-tokens to serve them",
                model.name,
                info.plan.max_length,
                self.settings.max_request_tokens,
            )
        task = asyncio.create_task(scheduler.run(), name=f"scheduler-{model.name}")
        self._served[model] = Running(scheduler, task)
        metrics.watch_bound_keys(model.name, model.executor.bound_key_count)
        metrics.watch_queue(
            model.name,
            functools.partial(self.summed, model.name, "requests_waiting"),
            functools.partial(self.summed, model.name, "requests_running"),
            functools.partial(self.summed, model.name, "queued_tokens"),
        )
        if reuse is not None:
            metrics.watch_cache(model.name, info.version, lambda: reuse.kept_bytes)
        metrics.model_loaded(
            model.name, info.version, model.binding, info.plan.policy.value, info.invariance
        )
        footprint = info.plan.footprint
        metrics.model_memory(
            model.name, None if footprint is None else footprint.terms, info.plan.max_length
        )

    def summed(self, name: str, count: str) -> int:
        """A scheduler count of every version of the model `name` running (a version being
        replaced still answers what it took)."""
        return sum(getattr(s.scheduler, count) for m, s in self._served.items() if m.name == name)

    async def retire(self, model: Model) -> None:
        """Once no request that resolved to `model` is left (the registry no longer serves
        it): its scheduler stopped, its metrics' series removed, nothing of it held here."""
        served = self._served[model]
        await served.scheduler.settled()  # (every request that resolved to it has left)
        served.task.cancel()
        await asyncio.gather(served.task, return_exceptions=True)
        if served.scheduler.reuse is not None:  # (a version reloaded starts with no answers)
            served.scheduler.reuse.clear()
        name, version = model.name, model.info.version
        del self._served[model]
        del served, model  # (the last references here: what the model held can be freed)
        if self._metrics is not None:
            self._metrics.model_released(name, version, self.registry.versions(name))
        log.info("model %s v%d released", name, version)

    @contextlib.asynccontextmanager
    async def running(self, metrics: Metrics) -> AsyncIterator[None]:
        """Schedulers running inside the block; at its end, everything admitted is answered
        (the drain), then they stop."""
        self.start(metrics)
        try:
            yield
        finally:
            await self.drain()
            await self.stop()

    async def drain(self) -> bool:
        """Refuse new work, wait until everything admitted is answered; False on timeout.
        Said once in the log, however many callers wait (SIGTERM, then the process's end)."""
        first = not self.draining
        self.lifecycle.drain()
        running = list(self._served.values())
        settled = asyncio.gather(*(s.scheduler.settled() for s in running))
        try:
            await asyncio.wait_for(settled, self.settings.drain_timeout_s)
        except TimeoutError:
            log.error(
                "drain: admitted requests still running after %.0f s", self.settings.drain_timeout_s
            )
            return False
        if first:
            log.info(
                "drained: %d requests admitted since start, %d answered",
                sum(s.scheduler.admitted for s in running),
                sum(s.scheduler.answered for s in running),
            )
        return True

    async def stop(self) -> None:
        tasks = [served.task for served in self._served.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the request path -----------------------------------------------------------------

    def deadline(self, timeout_ms: float | None) -> float:
        """A request's deadline: the server default, which the client may shorten, not extend."""
        limit = self.settings.request_timeout_ms
        ms = limit if timeout_ms is None else min(timeout_ms, limit)
        return time.monotonic() + ms / 1000

    def level(self, priority: int | None) -> int:
        """A call's priority level: as asked (1 first, as Triton counts), else the default."""
        levels = self.settings.priority_levels
        if not priority:  # (None, or Triton's 0: the default)
            return self.settings.default_priority
        if not 1 <= priority <= levels:
            raise InvalidInput(
                f"priority {priority}: this server's levels are 1 (first) to {levels}; 0 or "
                f"none is the default, {self.settings.default_priority}",
                param="priority",
            )
        return priority

    @property
    def cache_bound_bytes(self) -> int:
        return int(self.settings.result_cache_mb * 2**20)

    def cache_refused(self, model: Model) -> str | None:
        """Why `model` has no result cache (None: it has one, bounded at cache_bound_bytes)."""
        return refused_because(model.info.invariance, self.cache_bound_bytes)

    def within_token_budget(self, sequences: Sequence[np.ndarray]) -> None:
        """One request's cost is bounded: its sequences' tokens (or steps) together."""
        tokens = sum(len(s) for s in sequences)
        limit = self.settings.max_request_tokens
        if tokens > limit:
            raise InvalidInput(
                f"the request holds {tokens} tokens, more than the limit of {limit} per request "
                "(the server's --max-request-tokens)"
            )

    @staticmethod
    def within_memory(model: Model, sequences: Sequence[np.ndarray]) -> None:
        """Every sequence's batch of one fits the memory budget: one longer than the model's
        buckets reach (cut where a longer batch of one would not fit) is refused (413), never
        admitted to be killed."""
        plan = model.plan
        for i, sequence in enumerate(sequences):
            if len(sequence) > plan.max_length:
                need = plan.need(1, plan.run_length(len(sequence)))
                raise PayloadTooLarge(
                    f"sequence {i}: {len(sequence)} steps (tokens) need {_gib(need)} to run, "
                    f"more than this server's memory budget ({_gib(plan.budget or 0)}): the "
                    f"longest model {model.name} runs here is {plan.max_length}. Send shorter "
                    f'inputs, or serve it with `long_inputs = "windows"` and a max_length of '
                    f"at most {plan.max_length}, or give the server more memory "
                    "(--memory-budget, or the container's limit)",
                    param="input",
                )

    async def infer(self, call: Call) -> Answer:
        """Decide and run one request, in the order of the module docstring."""
        task = call.head.task if call.head is not None else Task.PREDICT
        model = self.registry.resolve(call.model, call.version, task, call.stand_in)
        served = self._served[model]
        with served.scheduler.using():
            answer = await self._infer(call, model, served)
        if call.stand_in and call.model is not None and not self.registry.knows(call.model):
            return dataclasses.replace(answer, stood_in_for=call.model)
        return answer

    async def _infer(self, call: Call, model: Model, served: Running) -> Answer:
        """The request on the model it resolved to, which stays running until it is done."""
        # (counted from the request's arrival here; a job's line waits as long as its job may)
        bulk = call.bulk
        deadline = time.monotonic() + BULK_WAIT_S if bulk else self.deadline(call.timeout_ms)
        with self.tracing.span("bucketserve.admission", {"bucketserve.model": model.name}):
            level = BULK_LEVEL if bulk else self.level(call.priority)
            head = call.head or Picked(tuple(wanted_outputs(model, call.outputs)))
            head.outputs(model)  # (a model that cannot do the task is refused here)
            count = call.inputs.count(model)
            if count > self.settings.max_sequences:
                raise InvalidInput(f"too many sequences: {count} > {self.settings.max_sequences}")
            # (a text is not tokenised only to be refused)
            served.scheduler.refuse_now(count, level, call.tenant)
            if not getattr(head, "runs_model", True):  # (the tokenizer alone: no batch)
                return await self._answered_here(cast(DirectHead, head), model, served, call)
            # A head that reads a text's own tokens (its spans, its strings) gets them from the
            # one tokenisation that made the sequence; its answer is then the text's, not only
            # its ids', so neither the cache nor a shared run applies.
            reads_text = getattr(head, "reads_text", False)
            merges = hasattr(head, "merged")  # (a head that makes a text's answer of windows')
            read = functools.partial(_read, call.inputs, model, reads_text, merges)
            sequences, tokens, windows = (
                await asyncio.to_thread(read) if call.inputs.heavy else read()
            )
            self.within_token_budget(sequences)
            self.within_memory(model, sequences)
            admissible = getattr(head, "admissible", None)  # (what a task needs of a sequence)
            if admissible is not None:
                for i, sequence in enumerate(sequences):
                    admissible(model, sequence, i)
        whole = head
        if windows is not None:  # (each window answers as the head's `per_window` says)
            head = cast(WindowHead, head).per_window()
        if tokens is None:
            finishes = [functools.partial(head.answer, model)] * len(sequences)
        else:
            text_head = cast(TextHead, head)  # (`reads_text` said so)
            finishes = [functools.partial(text_head.answer, model, tokens=t) for t in tokens]
        # The answers' reuse is keyed by each sequence's exact inputs and the answer asked;
        # an answer that is a text's, not only its ids', is never reused.
        asked = answer_key(head)
        identities = None if reads_text else [exact_inputs(s) + asked for s in sequences]
        answers = await served.scheduler.infer(
            sequences, deadline, call.request_id, level, call.tenant, identities, finishes
        )
        lengths = [len(s) for s in sequences]
        if windows is not None:
            return _merged(cast(WindowHead, whole), model, answers, lengths, windows)
        return Answer(model, answers, lengths)

    async def _answered_here(
        self, head: DirectHead, model: Model, served: Running, call: Call
    ) -> Answer:
        """A call whose head runs no model (the tokenizer alone), admitted: answered here, in
        a worker thread when its inputs are heavy, and counted for the drain."""
        answer = functools.partial(head.answer_all, model, call.inputs)
        answers = await asyncio.to_thread(answer) if call.inputs.heavy else answer()
        served.scheduler.answered_alone()
        return Answer(model, answers, _lengths(answers))


def _gib(size: float) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


def _lengths(answers: Sequence[Outputs]) -> list[int]:
    """Each answer's length, where no sequence ran: its tokens (or 1, a text)."""
    return [int(np.size(next(iter(a.values()), ()))) for a in answers]


def _read(
    inputs: Inputs, model: Model, with_tokens: bool, merges: bool
) -> tuple[list[np.ndarray], list[list[dict[str, Any]]] | None, Windowed | None]:
    """The call's validated sequences; (`with_tokens`) each text's tokens beside them, from
    one tokenisation; or, for inputs taken whole (`Texts.windows`, `TextPairs.windows`),
    every input's windows in order, and the windows. InvalidInput where the inputs are not
    texts."""
    if isinstance(inputs, Texts | TextPairs) and not with_tokens:
        windows = inputs.windows(model, merges)
        if windows is not None:
            return [seq for each in windows for seq, _ in each], None, windows
    if not with_tokens:
        return inputs.sequences(model), None, None
    if not isinstance(inputs, Texts | LateChunks):
        raise InvalidInput("this task reads texts: send texts, not token ids or tensors")
    return (*inputs.with_tokens(model), None)


def _merged(
    head: WindowHead, model: Model, answers: list[Outputs], lengths: list[int], windows: Windowed
) -> Answer:
    """Each input's answer made of its windows' (`head.merged`, with the characters each
    holds), and its length every token of its windows (what usage counts)."""
    merged, counted, start = [], [], 0
    for each in windows:
        end = start + len(each)
        spans = [span for _, span in each]
        merged.append(head.merged(model, answers[start:end], lengths[start:end], spans))
        counted.append(sum(lengths[start:end]))
        start = end
    return Answer(model, merged, counted)


@dataclass(frozen=True)
class Running:
    """A model running: its scheduler (which owns its queues, its answers' reuse and the count
    of its requests in flight) and that scheduler's task."""

    scheduler: Scheduler
    task: asyncio.Task[None]


def wanted_outputs(model: Model, names: Sequence[str] | None) -> list[str]:
    """The outputs to send back, each once: all of them by default. Asking for fewer saves
    encoding and bytes (a per-token hidden state is hundreds of floats per token)."""
    known = model.info.layout.output_names
    if names is None:
        return known
    unknown = [n[:64] for n in names if n not in known]
    if unknown:
        raise InvalidInput(f"model {model.name} has no output(s) {unknown}; it has {known}")
    return list(dict.fromkeys(names))

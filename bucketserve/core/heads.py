"""What a task head is: what turns a model's outputs for one sequence into a task's answer,
applied inside the one core call, so that no route post-processes what the core returned. A
route asks for a head in its `Call`; the head names its task (the registry resolves a call
without a model by it), says which outputs it reads (and refuses a model that cannot do its
task) before anything is admitted, then answers each sequence from its outputs, already cut
to the sequence's own length. Each task's head lives with its rule, in the task's module
(`embedding`, `classifier`, `sparse`); here: the protocol, `Picked` (the outputs a call asked
for by name: the predict task), and what every head shares. Imports the model.

A head answers in the worker thread that ran the sequence's batch, as the batch finishes
(`Scheduler`): a request holds its answers, never the batch's raw outputs (a sparse model's
logits are the vocabulary's width at every token), and the result cache keeps answers too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from bucketserve.core.layout import Outputs
from bucketserve.core.model import Model
from bucketserve.core.task import Task
from bucketserve.errors import TaskNotServed


class Head(Protocol):
    @property
    def task(self) -> Task:
        """The task it answers: a call without a model goes to a model that serves it."""

    def outputs(self, model: Model) -> tuple[str, ...]:
        """The model outputs this head reads, or InvalidInput when the model cannot do the
        task (with the request's field at fault)."""

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        """One sequence's answer from its outputs (those `outputs` named) and its steps (the
        token ids a sparse vector is indexed by). A head may also have `admissible(model,
        sequence, index)`, which refuses (InvalidInput) a sequence its task cannot answer,
        before anything is admitted."""


class TextHead(Head, Protocol):
    """A head that reads a text's own tokens beside the outputs (`reads_text`: their strings
    and spans, as `Model.tokens` gives them)."""

    reads_text: bool

    def answer(
        self,
        model: Model,
        outputs: Outputs,
        sequence: np.ndarray,
        tokens: Sequence[dict[str, Any]] = (),
    ) -> Outputs: ...


class WindowHead(Head, Protocol):
    """A head that answers an input taken whole in windows (`Texts.windows`,
    `TextPairs.windows`): each window by `per_window`'s head, then the input's answer made of
    theirs (`merged`, with each window's tokens and the characters it holds)."""

    def per_window(self) -> Head: ...

    def merged(
        self,
        model: Model,
        windows: list[Outputs],
        lengths: list[int],
        spans: list[tuple[int, int] | None],
    ) -> Outputs: ...


class DirectHead(Head, Protocol):
    """A head that runs no model (`runs_model` False: the tokenizer alone): it answers a
    call's inputs whole."""

    runs_model: bool

    def answer_all(self, model: Model, inputs: Any) -> list[Outputs]: ...


def answer_key(head: Head) -> bytes:
    """What tells heads' answers apart: identical sequences share a run, and the cache keeps
    an answer, only under the same head (a frozen dataclass: its fields are its answer)."""
    return repr(head).encode()


def owned(array: np.ndarray) -> np.ndarray:
    """`array`, or a copy where it is a view of a batch's output: an answer keeps nothing of
    its batch alive."""
    return array.copy() if isinstance(array, np.ndarray) and array.base is not None else array


@dataclass(frozen=True)
class Picked:
    """The outputs asked for by name, each as the model gives it, cut to the sequence."""

    names: tuple[str, ...]
    task = Task.PREDICT

    def outputs(self, model: Model) -> tuple[str, ...]:
        return self.names

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        return {name: owned(outputs[name]) for name in self.names}


def not_served(model: Model, why: str) -> TaskNotServed:
    """The error of a task `model` does not serve (`why`), naming those it does."""
    return TaskNotServed(
        f"model {model.name} {why} (it serves {', '.join(model.info.tasks)})", param="model"
    )


def rule_of(model: Model, task: Task, why: str) -> Any:
    """The model's rule for `task`, or the error saying `why` it has none."""
    rule = model.info.rule(task)
    if rule is None:
        raise not_served(model, why)
    return rule

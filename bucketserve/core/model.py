"""A served model: validation at the edge, then collate -> run -> split for each batch.

Built ready by `bucketserve.loading` (checked, bound, warm); the request path only reads it.
`Model.predict(sequences)` is the Python API; the server's scheduler calls `run_batch` with
batches it formed itself across requests. The model runs batches through a `Runner` (an ONNX
Runtime executor, or a fake in tests) and never imports ONNX Runtime itself; a batch that runs
alone may go to a second runner on every core (`lone`), checked at load to answer as the first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from bucketserve.core.bucketing import BucketKey, BucketPlan, Invariance, round_up
from bucketserve.core.layout import Layout, Outputs
from bucketserve.core.task import Task
from bucketserve.core.text_codec import TRUNCATE, TextCodec, Truncation
from bucketserve.errors import InvalidInput

__all__ = ["TRUNCATE", "Model", "ModelInfo", "Runner", "SequenceRules", "Truncation"]

if TYPE_CHECKING:
    from tokenizers import Tokenizer


class Runner(Protocol):
    """What runs a model's batches: `bucketserve.runtime`'s executors, or a fake in tests."""

    binding: str  # shared-session, session-per-key or mutable

    @property
    def providers(self) -> list[str]: ...

    def bound_key_count(self) -> int: ...

    def batch_shape(self, key: BucketKey, lengths: Sequence[int]) -> tuple[int, int]: ...

    def prepare(self, key: BucketKey) -> bool: ...

    def run(
        self, key: BucketKey, feeds: Mapping[str, np.ndarray], rows: int, length: int
    ) -> dict[str, np.ndarray]: ...


@dataclass(frozen=True)
class SequenceRules:
    """What one valid sequence is for a model: checked at the edge, before anything queues.

    A sequence is sent in the model input's own axes without the batch axis (token ids [T],
    audio samples [T], fbank frames [T, 80], an image line [3, 32, W]) and kept time first."""

    dtype: np.dtype
    max_length: int
    vocab_size: int | None = None  # tokens: ids lie in [0, vocab_size)
    step_shape: tuple[int, ...] = ()  # features: the sizes of one step, time first
    time_axis: int = 0  # features: where time lies in a sequence as sent
    min_length: int = 1  # the shortest the model runs on (a strided front end needs some)
    reserved_ids: tuple[int, ...] = ()  # tokens: ids that may not appear inside a sequence
    multiple: int = 1  # the model runs only at multiples of this: a sequence is padded up

    def run_length(self, length: int) -> int:
        """The length a sequence of `length` steps runs at alone (its outputs cut back)."""
        return round_up(length, self.multiple)

    @property
    def shape_as_sent(self) -> str:
        sizes = [str(d) for d in self.step_shape]
        sizes.insert(self.time_axis, "T")
        return "[" + ", ".join(sizes) + "]"

    def validate(self, item: Any, index: int = 0, time_first: bool = False) -> np.ndarray:
        """One sequence as sent (`time_first`: already time first, a v2 tensor's row) -> a
        time-first array, or InvalidInput saying what is wrong with it."""
        where = f"sequence {index}"
        rank = 1 if self.vocab_size is not None else 1 + len(self.step_shape)
        if nesting(item, rank + 1) > rank:  # (before numpy walks millions of nested lists)
            raise InvalidInput(f"{where}: nested deeper than {self.shape_as_sent}")
        try:
            array = np.asarray(item)
        except (ValueError, TypeError):
            raise InvalidInput(f"{where}: not a rectangular array") from None
        if array.ndim >= 1 and array.size == 0:
            raise InvalidInput(f"{where}: empty")
        if self.vocab_size is not None:
            self._check_tokens(array, where, self.vocab_size)
        else:
            if array.ndim != 1 + len(self.step_shape) or array.dtype.kind not in "iuf":
                raise InvalidInput(f"{where}: expected numbers of shape {self.shape_as_sent}")
            if not time_first:
                array = np.moveaxis(array, self.time_axis, 0)
            if array.shape[1:] != self.step_shape:
                sent = list(np.moveaxis(array, 0, self.time_axis).shape)
                raise InvalidInput(
                    f"{where}: expected numbers of shape {self.shape_as_sent}, got {sent}"
                )
        if len(array) > self.max_length:
            raise InvalidInput(
                f"{where}: length {len(array)} exceeds the longest bucket ({self.max_length})"
            )
        if len(array) < self.min_length:
            raise InvalidInput(
                f"{where}: length {len(array)} is shorter than the model takes (at least "
                f"{self.min_length} steps)"
            )
        with np.errstate(over="ignore"):  # an overflow shows as infinity, refused just below
            converted = array.astype(self.dtype, copy=False)
        if converted.dtype.kind == "f" and not np.isfinite(converted).all():  # 1e39 -> inf
            raise InvalidInput(
                f"{where}: features must be finite numbers that fit {converted.dtype.name}"
            )
        return converted

    def _check_tokens(self, array: np.ndarray, where: str, vocab_size: int) -> None:
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise InvalidInput(f"{where}: expected a list of integer token ids")
        if array.min() < 0 or array.max() >= vocab_size:
            raise InvalidInput(f"{where}: token ids must lie in [0, {vocab_size})")
        if self.reserved_ids:
            found = np.flatnonzero(np.isin(array, self.reserved_ids))
            if found.size:
                raise InvalidInput(
                    f"{where}: id {array[found[0]]} at position {found[0]} is reserved (the "
                    f"model reads it as padding): ids {list(self.reserved_ids)} cannot appear "
                    "inside a sequence"
                )


def nesting(item: Any, most: int) -> int:
    """How deep lists nest at the front of `item` (its first element's, and so on), up to
    `most`: what numpy would make its rank, read in a few steps."""
    depth = 0
    while isinstance(item, list) and item and depth < most:
        item, depth = item[0], depth + 1
    return depth


# Cohere's input types, and the prompt names sentence-transformers models give each
INPUT_TYPE_PROMPTS = {
    "search_query": ("query",),
    "search_document": ("document", "passage"),
}


@dataclass(frozen=True)
class ModelInfo:
    """What the request path knows of a model, fixed at load."""

    name: str
    version: int
    layout: Layout
    plan: BucketPlan
    rules: SequenceRules
    max_queue_delay_s: float
    queue_capacity: int
    invariance: Invariance  # what batching was measured to do to the answers
    text_chars: int | None  # texts are cut to this many characters before tokenising
    served_config: Mapping[str, Any]  # the config route's body: the config as served
    # each task it serves beside its outputs, and the task's rule (built by `loading` from
    # the config's section: an Embedding, a Classifier...; True where the task needs none)
    task_rules: Mapping[Task, Any] = field(default_factory=dict)
    prompts: Mapping[str, str] = field(default_factory=dict)  # name -> text put before a text
    aliases: tuple[str, ...] = ()  # other names it answers to (its config's `aliases`)
    fingerprint: str = ""  # the digest of what makes its answers (`loading.fingerprint`)
    long_inputs: str = "truncate"  # a text longer than the model: cut, or "windows"
    window_overlap: int = 0  # windows: the tokens each shares with the one before

    def prompt(self, name: str | None) -> str:
        """The text put before each of a request's texts for `prompt_name` (None: none)."""
        if name is None:
            return ""
        if name not in self.prompts:
            known = ", ".join(sorted(self.prompts)) or "none"
            raise InvalidInput(
                f"prompt_name {name[:64]!r}: model {self.name} has no such prompt (its "
                f"prompts: {known})",
                param="prompt_name",
            )
        return self.prompts[name]

    def prompt_of_type(self, input_type: str | None) -> str:
        """The prompt for Cohere's `input_type`: the prompt of that name, else of the name
        sentence-transformers models give it (search_query: query; search_document:
        document, else passage); none when the model has no such prompt."""
        if input_type is None:
            return ""
        names = [input_type, *INPUT_TYPE_PROMPTS.get(input_type, ())]
        return next((self.prompts[n] for n in names if n in self.prompts), "")

    def rule(self, task: Task) -> Any:
        """The model's rule for `task`, or None when it does not serve it."""
        return self.task_rules.get(task)

    @property
    def tasks(self) -> list[str]:
        """What the model serves: predict, and the tasks it has a rule for, in Task's order."""
        return [task.value for task in Task if task is Task.PREDICT or task in self.task_rules]


class Model:
    def __init__(
        self,
        info: ModelInfo,
        executor: Runner,
        tokenizer: Tokenizer | None = None,
        lone: Runner | None = None,
    ) -> None:
        """`lone`: the runner for a batch that runs alone (as the scheduler judges it), on
        more threads than each of the batches that share the cores; its keys mirror the
        executor's."""
        self.info = info
        self.name = info.name
        self.plan = info.plan
        self.executor = executor
        self.tokenizer = tokenizer
        self.lone = lone
        self._text = (
            None
            if tokenizer is None
            else TextCodec(info.name, tokenizer, info.rules.dtype, info.text_chars)
        )

    @property
    def binding(self) -> str:
        return self.executor.binding

    def prepare(self, key: BucketKey) -> None:
        """Bind `key` ahead of its first batch (MXNet's `prepare`) and warm it with pad rows."""
        for runner in (self.executor, self.lone):
            if runner is not None and runner.prepare(key):
                rows, length = runner.batch_shape(key, [max(self.info.rules.min_length, 1)])
                runner.run(key, self.info.layout.collate([], rows, length), rows, length)

    def validate(self, item: Any, index: int = 0, time_first: bool = False) -> np.ndarray:
        return self.info.rules.validate(item, index, time_first)

    @property
    def text(self) -> TextCodec:
        """The model's text handling (`text_codec`); InvalidInput for a model that takes no
        text."""
        if self._text is None:
            raise InvalidInput(
                f"model {self.name} has no tokenizer: it takes token ids (or features), not text"
            )
        return self._text

    def encode(
        self, texts: Sequence[str | tuple[str, str]], truncation: Truncation = TRUNCATE
    ) -> list[np.ndarray]:
        """Texts, or text pairs (with each token's segment), -> token id sequences, for models
        whose config names a tokenizer; each cut to the model's length as `truncation` says
        (the Python API's; `text` holds the rest of the model's text handling)."""
        return self.text.encode(texts, truncation)

    @property
    def lone_takes_every_core(self) -> bool:
        """Whether a batch that runs alone runs on more threads than the others."""
        return self.lone is not None

    def batch_shape(self, key: BucketKey, lengths: Sequence[int]) -> tuple[int, int]:
        """(rows, length) a batch with these lengths is computed at: its cost in tokens."""
        return self.executor.batch_shape(key, lengths)

    def run_batch(
        self, key: BucketKey, sequences: Sequence[np.ndarray], lone: bool = False
    ) -> list[Outputs]:
        """Collate -> run -> split for one batch of validated sequences that fit `key`;
        `lone`: no other batch runs or waits, so it may take every core."""
        runner = self.lone if lone and self.lone is not None else self.executor
        lengths = [len(s) for s in sequences]
        rows, length = runner.batch_shape(key, lengths)
        layout = self.info.layout
        outputs = runner.run(key, layout.collate(sequences, rows, length), rows, length)
        return layout.split(outputs, lengths)

    def predict(self, items: Sequence[Any]) -> list[Outputs]:
        """Outputs for each item, in order: the Python API, batched by bucket."""
        sequences = [self.validate(item, i) for i, item in enumerate(items)]
        results: dict[int, Outputs] = {}
        for key, indices in self.plan.batches([len(s) for s in sequences]):
            batch = self.run_batch(key, [sequences[i] for i in indices])
            results.update(zip(indices, batch, strict=True))
        return [results[i] for i in range(len(sequences))]

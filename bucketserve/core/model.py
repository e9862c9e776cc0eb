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
from bucketserve.core.layout import Layout, Outputs, segmented
from bucketserve.core.task import Task
from bucketserve.core.text_cut import BEYOND, cut_text
from bucketserve.errors import InvalidInput

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


@dataclass(frozen=True)
class Truncation:
    """What to do with a text longer than the model takes: cut it (`allowed`), from its end
    or, `left`, from its start; or refuse it."""

    allowed: bool = True
    left: bool = False


TRUNCATE = Truncation()


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
        self._left: Tokenizer | None = None  # the tokenizer cutting texts from the start
        self._uncut: Tokenizer | None = None  # the tokenizer that cuts nothing: a text's words

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

    def encode(
        self, texts: Sequence[str | tuple[str, str]], truncation: Truncation = TRUNCATE
    ) -> list[np.ndarray]:
        """Texts, or text pairs (with each token's segment), -> token id sequences, for models
        whose config names a tokenizer; each cut to the model's length as `truncation` says."""
        encodings = [e for e, _ in self._encodings(texts, truncation)]
        dtype = self.info.rules.dtype
        if texts and isinstance(texts[0], str):
            return [np.asarray(e.ids, dtype=dtype) for e in encodings]
        return [segmented(np.asarray(e.ids, dtype=dtype), e.type_ids) for e in encodings]

    def _encodings(
        self,
        texts: Sequence[str | tuple[str, str]],
        truncation: Truncation = TRUNCATE,
        special: bool = True,
    ) -> list[tuple[Any, int]]:
        """The tokenizer's encodings of texts (or pairs), each with how many characters were
        cut from its start: a text past the model's characters is first cut to a window on
        the side the request keeps, holding every token the tokenizer keeps of it
        (`text_cut`). InvalidInput for one longer than the model takes, unless it may be
        cut."""
        tokenizer = self._tokenizer(truncation)
        chars = self.info.text_chars or BEYOND
        pairs = bool(texts) and not isinstance(texts[0], str)
        specials = tokenizer.num_special_tokens_to_add(pairs) if special else 0
        cuts = [
            cut_text(
                text,
                i,
                chars=chars,
                left=truncation.left,
                allowed=truncation.allowed,
                budget=self._max_tokens - specials,
                words=self._words,
            )
            for i, text in enumerate(texts)
        ]
        encodings = tokenizer.encode_batch([c.text for c in cuts], add_special_tokens=special)
        if not truncation.allowed:
            longer = next((i for i, e in enumerate(encodings) if e.overflowing), None)
            if longer is not None:
                raise InvalidInput(
                    f"text {longer}: longer than the model takes ({self._max_tokens} tokens); "
                    "send truncate=true to have it cut"
                )
        return [(e, c.shift) for e, c in zip(encodings, cuts, strict=True)]

    def _tokenizer(self, truncation: Truncation) -> Tokenizer:
        if self.tokenizer is None:
            raise InvalidInput(
                f"model {self.name} has no tokenizer: it takes token ids (or features), not text"
            )
        if not truncation.left:
            return self.tokenizer
        if self._left is None:  # (made once, on the first request that asks: a copy)
            left = type(self.tokenizer).from_str(self.tokenizer.to_str())
            left.enable_truncation(self._max_tokens, direction="left")
            self._left = left
        return self._left

    def _words(self, text: str) -> list[int | None]:
        """Each token's word, as the tokenizer splits `text` whole (no special tokens)."""
        return list(self._whole().encode(text, add_special_tokens=False).word_ids)

    def _whole(self) -> Tokenizer:
        """The tokenizer that cuts nothing."""
        if self._uncut is None:  # (made once, on the first long text: a copy)
            assert self.tokenizer is not None
            uncut = type(self.tokenizer).from_str(self.tokenizer.to_str())
            uncut.no_truncation()
            self._uncut = uncut
        return self._uncut

    def encode_windows(self, texts: Sequence[str], overlap: int) -> list[list[np.ndarray]]:
        """Each text whole, as windows of the model's length: its tokens cut into runs that
        fill a window with the tokenizer's special tokens around them, each run starting
        `overlap` tokens before the last one ended (a text that fits is one window, as
        `encode` gives it). Nothing of a text is cut, its characters included."""
        tokenizer = self._tokenizer(TRUNCATE)
        room = self._max_tokens - tokenizer.num_special_tokens_to_add(False)
        dtype = self.info.rules.dtype
        windows = []
        for encoding in self._whole().encode_batch(list(texts), add_special_tokens=False):
            encoding.truncate(room, stride=overlap)
            runs = [encoding, *encoding.overflowing]
            windows.append([np.asarray(tokenizer.post_process(r).ids, dtype) for r in runs])
        return windows

    def encode_chunks(self, texts: Sequence[str]) -> tuple[np.ndarray, list[int | None]]:
        """Texts as one sequence, one after another inside the tokenizer's special tokens
        (Jina's late chunking), and each token's text (None: a special token);
        InvalidInput when together they are longer than the model takes."""
        self._tokenizer(TRUNCATE)  # (a model without a tokenizer refuses texts)
        whole = self._whole()
        parts = whole.encode_batch(list(texts), add_special_tokens=False)
        merged = type(parts[0]).merge(parts, growing_offsets=True)  # (Encoding.merge)
        framed = whole.post_process(merged)
        if len(framed.ids) > self._max_tokens:
            raise InvalidInput(
                f"late_chunking: the inputs together take {len(framed.ids)} tokens, more than "
                f"the model's {self._max_tokens}; send fewer, or embed them apart",
                param="input",
            )
        owner = iter([i for i, part in enumerate(parts) for _ in part.ids])
        chunks = [None if special else next(owner) for special in framed.special_tokens_mask]
        return np.asarray(framed.ids, self.info.rules.dtype), chunks

    def encode_pair_windows(
        self, pairs: Sequence[tuple[str, str]], overlap: int
    ) -> list[list[tuple[np.ndarray, tuple[int, int]]]]:
        """Each (query, document) pair with the document whole: the query kept whole in every
        window and the document's tokens cut into runs that fill the rest, as
        `encode_windows` cuts a text; each window with its segments, and the characters of
        the document it holds."""
        tokenizer = self._tokenizer(TRUNCATE)
        whole = self._whole()
        frame = tokenizer.num_special_tokens_to_add(True)
        dtype = self.info.rules.dtype
        windows = []
        for i, (query, document) in enumerate(pairs):
            asked = whole.encode(query, add_special_tokens=False)
            room = self._max_tokens - frame - len(asked.ids)
            if room <= overlap:
                raise InvalidInput(
                    f"pair {i}: the query takes {len(asked.ids)} of the model's "
                    f"{self._max_tokens} tokens, and leaves windows of the document none "
                    f"past their overlap ({overlap}); send a shorter query, or long_inputs "
                    "truncate"
                )
            encoding = whole.encode(document, add_special_tokens=False)
            encoding.truncate(room, stride=overlap)
            runs = [encoding, *encoding.overflowing]
            pair_windows = []
            for run in runs:
                framed = tokenizer.post_process(asked, run)
                ids = segmented(np.asarray(framed.ids, dtype), framed.type_ids)
                span = (run.offsets[0][0], run.offsets[-1][1]) if run.offsets else (0, 0)
                pair_windows.append((ids, span))
            windows.append(pair_windows)
        return windows

    def tokens(
        self, texts: Sequence[str], special: bool = True, truncation: Truncation = TRUNCATE
    ) -> list[list[dict[str, Any]]]:
        """Each text's tokens as the model's tokenizer makes them (cut to its length): id, the
        text it covers (a special token's own), whether it is special, its character span,
        and the token's own string (`piece`: a WordPiece continuation's "##s")."""
        return self._tokens(texts, self._encodings(texts, truncation, special))

    def encode_with_tokens(
        self, texts: Sequence[str], truncation: Truncation = TRUNCATE
    ) -> tuple[list[np.ndarray], list[list[dict[str, Any]]]]:
        """`encode` and `tokens` of the same texts from one tokenisation: each text's ids,
        and its tokens (for a head that reads a text's own tokens: spans, strings)."""
        encodings = self._encodings(texts, truncation)
        dtype = self.info.rules.dtype
        return [np.asarray(e.ids, dtype=dtype) for e, _ in encodings], self._tokens(
            texts, encodings
        )

    @staticmethod
    def _tokens(
        texts: Sequence[str], encodings: Sequence[tuple[Any, int]]
    ) -> list[list[dict[str, Any]]]:
        return [
            [
                {"id": i, "text": piece if mark else text[a + shift : b + shift]}
                | {"special": bool(mark)}
                | ({} if mark else {"start": a + shift, "stop": b + shift})
                | {"piece": piece}
                for i, piece, mark, (a, b) in zip(
                    e.ids, e.tokens, e.special_tokens_mask, e.offsets, strict=True
                )
            ]
            for text, (e, shift) in zip(texts, encodings, strict=True)
        ]

    def joined(self, pieces: Sequence[str]) -> str:
        """Token strings joined into text, by the tokenizer's decoder (WordPiece's "##")."""
        tokenizer = self._tokenizer(TRUNCATE)
        decoder = tokenizer.decoder
        return str(decoder.decode(list(pieces))) if decoder is not None else "".join(pieces)

    def decode(self, rows: Sequence[Sequence[int]], skip_special: bool = True) -> list[str]:
        """Token id lists -> texts, by the model's tokenizer (ids it does not know refused)."""
        tokenizer = self._tokenizer(TRUNCATE)
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        for r, row in enumerate(rows):
            wrong = next((i for i in row if not 0 <= i < size), None)
            if wrong is not None:
                raise InvalidInput(f"ids {r}: {wrong} is not a token id (0 to {size - 1})")
        return list(tokenizer.decode_batch([list(r) for r in rows], skip_special))

    @property
    def _max_tokens(self) -> int:
        assert self.tokenizer is not None
        assert self.tokenizer.truncation is not None  # (`load_tokenizer` turns it on)
        return int(self.tokenizer.truncation["max_length"])

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

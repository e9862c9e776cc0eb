"""The one call through which every edge reaches the core: a request as the core takes it,
whatever protocol brought it (`Call`), and what the core gives back (`Answer`).

An edge decodes its bytes into a `Call`: which model and version, the inputs, the outputs
wanted or the task head that answers (`heads`), the client's own deadline, the request's id,
its priority level and its tenant.
`Engine.infer` does the rest. The inputs
stay as the client sent them until the model is known, then become validated sequences:
`Sequences` (items as sent: token id lists, or feature steps), `Texts` and `TextPairs`
(tokenised by the model), or another `Inputs` an edge defines (KServe v2 tensors, in
`bucketserve.edges.kserve`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from bucketserve.core.heads import Head
from bucketserve.core.layout import Outputs, segmented, token_ids
from bucketserve.core.model import TRUNCATE, Model, Truncation
from bucketserve.errors import InvalidInput

# A body, or a request's items, this large is decoded in a worker thread (a hop there and back
# is ~140 us): 64 KiB of JSON numbers take milliseconds, 8 MB ~150 ms, which on the event loop
# would hold every other request back.
OFF_LOOP_BYTES = 64 * 1024
# A hop costs what tokenising ~300 characters does (measured: 139 us against 0.46 us a
# character); up to 2,000 characters (under a millisecond) the event loop tokenises itself:
# most requests are a sentence or two.
INLINE_TEXT_CHARS = 2000


class Inputs(Protocol):
    """A request's inputs as its edge decoded them, before the model is known."""

    def count(self, model: Model) -> int:
        """How many sequences, read without decoding them: a request the queue cannot take
        is refused on this alone."""

    @property
    def heavy(self) -> bool:
        """Whether decoding them is worth a worker thread."""

    def sequences(self, model: Model) -> list[np.ndarray]:
        """The validated sequences for `model`, in order, or InvalidInput saying what is wrong."""


# Why a text model refuses token ids a client may have made with another tokenizer.
FOREIGN_IDS = (
    "model {name} takes text: send the texts, not token ids. OpenAI's clients send ids "
    "of OpenAI's own tokenizer (LangChain's OpenAIEmbeddings does by default; pass "
    "check_embedding_ctx_length=False), which this model would read as other tokens. If "
    "your ids are this model's own, start the server with --openai-token-ids"
)


# Each input's windows (a text, or a pair's document, taken whole), each window with the
# characters of the text it holds (None where no answer says them)
Windowed = list[list[tuple[np.ndarray, tuple[int, int] | None]]]


def in_windows(asked: str | None, model: Model, merges: bool) -> bool:
    """Whether inputs are taken whole, in windows: the request asks (and a head that cannot
    make an answer of windows' then refuses), or it leaves it to the model's config, which
    asks, and the head merges."""
    if (asked or model.info.long_inputs) != "windows" or (asked is None and not merges):
        return False
    if not merges:
        raise InvalidInput(
            "long_inputs windows: this task answers each input from one sequence; send "
            "long_inputs truncate (embeddings, sparse weights, per-token vectors and rerank "
            "scores merge windows)",
            param="long_inputs",
        )
    return True


@dataclass(frozen=True)
class Sequences:
    """Items as sent: token id lists, or per-step feature vectors (time first). `own_ids`:
    whether a client's token ids are known to be the model's own; when not (OpenAI's
    protocol, whose ids are its tokenizer's), a model that takes text refuses them."""

    items: Sequence[Any]
    wire_bytes: int = 0  # what they took on the wire: the cost of decoding them
    own_ids: bool = True

    def count(self, model: Model) -> int:
        return len(self.items)

    @property
    def heavy(self) -> bool:
        return self.wire_bytes >= OFF_LOOP_BYTES

    def sequences(self, model: Model) -> list[np.ndarray]:
        if not self.own_ids and model.tokenizer is not None:
            raise InvalidInput(FOREIGN_IDS.format(name=model.name), param="input")
        return [model.validate(item, i) for i, item in enumerate(self.items)]


@dataclass(frozen=True)
class Texts:
    """Texts, for a model with a tokenizer: each after the prompt named (if one is), cut by
    characters, tokenised (cut to the model's length as `truncation` says), then validated."""

    texts: Sequence[str]
    truncation: Truncation = TRUNCATE
    prompt_name: str | None = None  # the model's prompt put before each text, if one is named
    input_type: str | None = None  # else Cohere's input type, whose prompt the model may have
    long_inputs: str | None = None  # "windows" or "truncate"; None: the model's config says

    def count(self, model: Model) -> int:
        return len(self.texts)

    def windows(self, model: Model, merges: bool) -> Windowed | None:
        """Each text's windows (`Model.encode_windows`) when the texts are taken whole
        (`in_windows`), else None (cut as they are)."""
        if not in_windows(self.long_inputs, model, merges):
            return None
        windows = model.text.encode_windows(self._prompted(model), model.info.window_overlap)
        return [[(model.validate(w, i), None) for w in text] for i, text in enumerate(windows)]

    @property
    def heavy(self) -> bool:
        return sum(len(t) for t in self.texts) > INLINE_TEXT_CHARS

    def sequences(self, model: Model) -> list[np.ndarray]:
        encoded = model.encode(self._prompted(model), self.truncation)
        return [model.validate(seq, i) for i, seq in enumerate(encoded)]

    def with_tokens(self, model: Model) -> tuple[list[np.ndarray], list[list[dict[str, Any]]]]:
        """`sequences`, and each text's tokens (`Model.tokens`) from the same tokenisation."""
        encoded, tokens = model.text.encode_with_tokens(self._prompted(model), self.truncation)
        return [model.validate(seq, i) for i, seq in enumerate(encoded)], tokens

    def _prompted(self, model: Model) -> Sequence[str]:
        # An empty text means nothing to embed or tag (a tokenizer still makes it [CLS] [SEP]):
        # refused, as OpenAI's API and text-embeddings-inference refuse it.
        empty = next((i for i, text in enumerate(self.texts) if not text), None)
        if empty is not None:
            raise InvalidInput(f"text {empty}: empty")
        info = model.info
        named = self.prompt_name is not None
        prompt = info.prompt(self.prompt_name) if named else info.prompt_of_type(self.input_type)
        return [prompt + text for text in self.texts] if prompt else self.texts


@dataclass(frozen=True)
class LateChunks:
    """Texts embedded as one sequence, one after another (Jina's late chunking): each pooled
    over its own tokens afterwards, every one of them seen in the context of the others. Its
    one sequence's tokens each say which text they are of (`with_tokens`: "chunk")."""

    texts: Sequence[str]

    def count(self, model: Model) -> int:
        return 1

    @property
    def heavy(self) -> bool:
        return sum(len(t) for t in self.texts) > INLINE_TEXT_CHARS

    def sequences(self, model: Model) -> list[np.ndarray]:
        return self.with_tokens(model)[0]

    def with_tokens(self, model: Model) -> tuple[list[np.ndarray], list[list[dict[str, Any]]]]:
        empty = next((i for i, text in enumerate(self.texts) if not text), None)
        if empty is not None:
            raise InvalidInput(f"text {empty}: empty")
        sequence, chunks = model.text.encode_chunks(self.texts)
        return [model.validate(sequence, 0)], [[{"chunk": c} for c in chunks]]


@dataclass(frozen=True)
class TextPairs:
    """Text pairs (a query and a document), each one sequence as the model's tokenizer pairs
    them: the second text's tokens in segment 1, the longer text cut first."""

    pairs: Sequence[tuple[str, str]]
    truncation: Truncation = TRUNCATE
    long_inputs: str | None = None  # "windows" or "truncate"; None: the model's config says

    def count(self, model: Model) -> int:
        return len(self.pairs)

    def windows(self, model: Model, merges: bool) -> Windowed | None:
        """Each pair's windows (`Model.encode_pair_windows`: the query whole in each, the
        document in runs, with the characters each holds) when the documents are taken whole
        (`in_windows`), else None (cut as they are)."""
        if not in_windows(self.long_inputs, model, merges):
            return None
        self._refuse_empty()
        windows = model.text.encode_pair_windows(self.pairs, model.info.window_overlap)
        return [
            [(segmented(model.validate(token_ids(w), i), w["segment"]), span) for w, span in pair]
            for i, pair in enumerate(windows)
        ]

    def _refuse_empty(self) -> None:
        empty = next((i for i, pair in enumerate(self.pairs) if not all(pair)), None)
        if empty is not None:
            raise InvalidInput(f"pair {empty}: a text is empty")

    @property
    def heavy(self) -> bool:
        return sum(len(a) + len(b) for a, b in self.pairs) > INLINE_TEXT_CHARS

    def sequences(self, model: Model) -> list[np.ndarray]:
        self._refuse_empty()
        encoded = model.encode(self.pairs, self.truncation)
        return [
            segmented(model.validate(token_ids(seq), i), seq["segment"])
            for i, seq in enumerate(encoded)
        ]


@dataclass(frozen=True)
class Call:
    """One request, as every edge hands it to the core."""

    inputs: Inputs
    model: str | None = None  # None: the repository's default model
    version: str | None = None  # None: the version served
    outputs: tuple[str, ...] | None = None  # None: every output of the model
    timeout_ms: float | None = None  # the client's own deadline; it only shortens the server's
    request_id: str = ""  # said in the log and in a failed batch's answer
    head: Head | None = None  # the task that answers from the outputs (None: the outputs)
    priority: int | None = None  # its level, 1 first (None or 0: the server's default)
    tenant: str = ""  # whose share of the model it uses ("" when tenancy is off)
    bulk: bool = False  # a bulk job's line: below every level, without the server's deadline
    # a route standing in for a server that ignores model names (TEI): a name the registry
    # does not know goes to the one model that serves the task, and the answer says so
    stand_in: bool = False


@dataclass(frozen=True)
class Answer:
    """The outputs asked for (or the head's answers), one dict per sequence in the request's
    order, and each sequence's length as it was run (tokens after truncation, or steps)."""

    model: Model
    outputs: list[Outputs]
    lengths: list[int]  # (a text embedded in windows: every token of its windows)
    stood_in_for: str | None = None  # the unknown name the call gave (`Call.stand_in`)

"""The order a batch's requests run in: by length, each request's longest text in its
model's tokens, so that neighbouring lines fill one bucket key's batches.

Lengths are counted a chunk of texts at a time (CHUNK_CHARS, CHUNK_TEXTS: a tokenizer's
encoding costs about a KiB a text, whatever its length), each text cut to what can count: a
tokenizer that truncates at N tokens gives no text more than N, and a text's first
N x CHARS_A_TOKEN characters hold N tokens of ordinary words in any language (a text they
do not fill, long runs of spaces, is ordered by its start: an order, not an answer), so a
6 MiB line costs its tokenizer a few KiB, not hundreds of MiB of encodings.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import orjson

from bucketserve.core.model import Model
from bucketserve.jobs.lines import Read, Requests

# Where the routes' bodies hold their texts: what a line's length is read from
TEXT_FIELDS = ("input", "inputs", "texts", "text", "query", "documents", "text_1", "text_2")
CHUNK_CHARS = 1 << 18  # texts tokenised in one call: about this many characters
CHUNK_TEXTS = 2048  # and at most this many texts
CHARS_A_TOKEN = 16  # a text is counted from its first (the tokenizer's limit) x this
UNCUT_CHARS = 1 << 16  # the part counted where the tokenizer truncates nothing


def file_lengths(read: Read, requests: Requests, model: Model | None) -> np.ndarray:
    """Each request of the file's length, read again from the file one at a time."""
    bodies = (requests.parsed(i)["body"] for i in range(len(read)))
    return lengths(bodies, len(read), model)


def lengths(bodies: Iterable[Any], count: int, model: Model | None) -> np.ndarray:
    """Each of `count` bodies' length: its longest text in the model's tokens, or its
    longest list of ids (a text where no tokenizer reads it: its characters); 0 for what
    has neither."""
    tokenizer = model.tokenizer if model is not None else None
    found = np.zeros(count, np.int64)
    cut = _countable_chars(tokenizer)
    waiting: list[tuple[int, str]] = []
    chars = 0
    for i, body in enumerate(bodies):
        for item in _texts(body):
            if isinstance(item, str) and tokenizer is not None:
                waiting.append((i, item[:cut]))
                chars += min(len(item), cut)
            else:
                found[i] = max(found[i], len(item))
        if chars >= CHUNK_CHARS or len(waiting) >= CHUNK_TEXTS:
            _counted(tokenizer, waiting, found)
            waiting, chars = [], 0
    _counted(tokenizer, waiting, found)
    return found


def body_lengths(bodies: list[bytes], model: Model | None) -> np.ndarray:
    """`lengths` of bodies given as JSON."""
    return lengths((orjson.loads(body) for body in bodies), len(bodies), model)


def order(lengths: np.ndarray) -> np.ndarray:
    """The requests' order: by length, the file's order among equals."""
    return np.argsort(lengths, kind="stable")


def _countable_chars(tokenizer: Any) -> int:
    truncation = getattr(tokenizer, "truncation", None)
    if not truncation or not truncation.get("max_length"):
        return UNCUT_CHARS
    return int(truncation["max_length"]) * CHARS_A_TOKEN


def _counted(tokenizer: Any, waiting: list[tuple[int, str]], found: np.ndarray) -> None:
    """The waiting texts tokenised in one call, each request's length its longest."""
    if not waiting:
        return
    encode = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
    encodings = encode([text for _, text in waiting])
    for (i, _), encoding in zip(waiting, encodings, strict=True):
        found[i] = max(found[i], len(encoding.ids))


def _texts(body: Any) -> Iterator[Any]:
    """The texts (or id lists) a body holds under the routes' text fields."""

    def walk(value: Any) -> Iterator[Any]:
        ids = isinstance(value, list) and value and all(isinstance(v, int) for v in value)
        if isinstance(value, str) or ids:
            yield value
        elif isinstance(value, list):
            for item in value:
                yield from walk(item)
        elif isinstance(value, dict) and "text" in value:
            yield from walk(value["text"])

    if isinstance(body, dict):
        for name in TEXT_FIELDS:
            if name in body:
                yield from walk(body[name])

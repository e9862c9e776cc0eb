"""A batch's input file, read before any work: each line one request, as OpenAI's Batch API
takes it (`{"custom_id", "method": "POST", "url", "body"}`). A file with a line that is not
JSON, a request without its fields, a `custom_id` seen before, a `url` other than the
batch's endpoint, a model the server does not serve or two models in one file is refused
whole, each such line named in OpenAI's `errors` (its code, its line number); the rest of a
request's body is the route's to judge, line by line, as it judges any request.

Then the order the lines run in: by length, the longest text of each line tokenised once by
its model's tokenizer, so that neighbouring lines fill one bucket key's batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bucketserve.core.engine import Engine
from bucketserve.core.model import Model
from bucketserve.errors import BucketserveError

# The routes a batch may run, each with the bodies it takes online
ENDPOINTS = (
    "/v1/embeddings", "/embeddings", "/v1/rerank", "/rerank", "/v2/rerank", "/v1/embed",
    "/v2/embed", "/classify", "/classify_tokens", "/embed", "/embed_all", "/embed_sparse",
    "/v1/score", "/score", "/predict",
)  # fmt: skip
# Where the routes' bodies hold their texts: what a line's length is read from
TEXT_FIELDS = ("input", "inputs", "texts", "text", "query", "documents", "text_1", "text_2")
MAX_ERRORS = 100  # of a refused file's lines, the first this many are named


@dataclass(frozen=True)
class Line:
    number: int  # 1 first, as OpenAI counts a file's lines
    custom_id: str
    body: bytes  # the request's body, as JSON


@dataclass
class Read:
    """An input file, read: its requests, or the errors that refuse it (OpenAI's)."""

    lines: list[Line] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None  # the one model its requests name (None: the route's default)

    def refuse(self, code: str, message: str, line: int | None = None, **more: Any) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append({"code": code, "message": message, "line": line, **more})


def raw_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The file's non-blank lines, numbered from 1."""
    with path.open("rb") as file:
        for number, raw in enumerate(file, 1):
            if raw.strip():
                yield number, raw


def read(path: Path, endpoint: str, engine: Engine) -> Read:
    """The file's requests for `endpoint`, checked as the module docstring says."""
    found = Read()
    seen: set[str] = set()
    models: set[str | None] = set()
    for number, raw in raw_lines(path):
        try:
            request = orjson.loads(raw)
        except orjson.JSONDecodeError:
            found.refuse("invalid_json_line", "This line is not parseable as valid JSON.", number)
            continue
        line = _line(request, number, endpoint, found)
        if line is None:
            continue
        if line.custom_id in seen:
            found.refuse(
                "duplicate_custom_id",
                f"The custom_id {line.custom_id!r} is used by an earlier line; each must be "
                "unique.",
                number,
                param="custom_id",
            )
            continue
        seen.add(line.custom_id)
        name = request["body"].get("model")
        if isinstance(name, str) and not served(engine, name):
            found.refuse(
                "model_not_found",
                f"The model {name!r} is not served here.",
                number,
                param="body.model",
            )
            continue
        models.add(name if isinstance(name, str) else None)
        found.lines.append(line)
    if len(models) > 1:
        found.refuse(
            "model_mismatch",
            "The requests of one file must name one model; this one names "
            + ", ".join(sorted(str(m) for m in models)),
        )
    if not found.lines and not found.errors:
        found.refuse("empty_file", "The file has no requests.")
    found.model = next(iter(models), None)
    return found


def _line(request: Any, number: int, endpoint: str, found: Read) -> Line | None:
    """One request's line, or None (and its error noted)."""
    if not isinstance(request, dict):
        found.refuse("invalid_request", "The line is not a JSON object.", number)
        return None
    for name, kind in (("custom_id", str), ("method", str), ("url", str), ("body", dict)):
        if not isinstance(request.get(name), kind):
            found.refuse(
                "missing_required_parameter",
                f"The line has no {name} ({'an object' if kind is dict else 'a string'}).",
                number,
                param=name,
            )
            return None
    if request["method"].upper() != "POST":
        found.refuse("invalid_method", "The method must be POST.", number, param="method")
        return None
    if request["url"] != endpoint:
        found.refuse(
            "url_mismatch",
            f"The url {request['url'][:200]!r} is not the batch's endpoint {endpoint!r}.",
            number,
            param="url",
        )
        return None
    return Line(number, request["custom_id"], orjson.dumps(request["body"]))


def lengths(lines: list[Line], model: Model | None) -> np.ndarray:
    """Each line's length: its longest text in the model's tokens (each text tokenised
    once, all in one call), or its longest list of ids; 0 for what has neither."""
    found = [_texts(orjson.loads(line.body)) for line in lines]
    tokenizer = model.tokenizer if model is not None else None
    flat = [item for items in found for item in items]
    counts = [len(item) for item in flat]  # (ids; texts where no tokenizer reads them)
    texts = [i for i, item in enumerate(flat) if isinstance(item, str)]
    if tokenizer is not None and texts:
        encoded = tokenizer.encode_batch([flat[i] for i in texts])
        for i, tokens in zip(texts, encoded, strict=True):
            counts[i] = len(tokens.ids)
    each = iter(counts)
    return np.array([max((next(each) for _ in items), default=0) for items in found], np.int64)


def _texts(body: Any) -> list[Any]:
    """The texts (or id lists) a body holds under the routes' text fields."""
    found: list[Any] = []

    def walk(value: Any) -> None:
        ids = isinstance(value, list) and value and all(isinstance(v, int) for v in value)
        if isinstance(value, str) or ids:
            found.append(value)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, dict) and "text" in value:
            walk(value["text"])

    for name in TEXT_FIELDS:
        if name in body:
            walk(body[name])
    return found


def order(lengths: np.ndarray) -> np.ndarray:
    """The lines' order: by length, the file's order among equals."""
    return np.argsort(lengths, kind="stable")


def served(engine: Engine, name: str | None) -> bool:
    """Whether the model `name` (None: the default) answers now."""
    return the_model(engine, name) is not None


def the_model(engine: Engine, name: str | None) -> Model | None:
    """The model a file's lines name (or the server's default), for its tokenizer."""
    try:
        return engine.model(name)
    except BucketserveError:
        return None

"""A batch's input file, read before any work: each line one request, as OpenAI's Batch API
takes it (`{"custom_id", "method": "POST", "url", "body"}`). A file with a line that is not
JSON, a request without its fields, a `custom_id` seen before, a `url` other than the
batch's endpoint, a model the server does not serve or two models in one file is refused
whole, each such line named in OpenAI's `errors` (its code, its line number); the rest of a
request's body is the route's to judge, line by line, as it judges any request.

Read in one pass, a line at a time, keeping of each request only where it lies in the file
(its offset and size) and its line number: a file's memory is a few numbers a line, never
its lines (`Requests` reads one again when it is sent). Repeated `custom_id`s are found from
a hash of each, the lines whose hashes meet read again to compare the ids themselves.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bucketserve.core.engine import Engine
from bucketserve.core.model import Model
from bucketserve.errors import BucketserveError

MAX_ERRORS = 100  # of a refused file's lines, the first this many are named


@dataclass
class Read:
    """An input file, read: where each of its requests lies (its offset and size in bytes,
    its line number), or the errors that refuse it (OpenAI's)."""

    offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    numbers: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    errors: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None  # the one model its requests name (None: the route's default)

    def __len__(self) -> int:
        return len(self.offsets)

    def refuse(self, code: str, message: str, line: int | None = None, **more: Any) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append({"code": code, "message": message, "line": line, **more})


def raw_lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """The file's non-blank lines: each one's number (from 1), offset and bytes."""
    with path.open("rb") as file:
        offset = 0
        for number, raw in enumerate(file, 1):
            if raw.strip():
                yield number, offset, raw
            offset += len(raw)


def read(path: Path, endpoint: str, engine: Engine) -> Read:
    """The file's requests for `endpoint`, checked as the module docstring says."""
    found = Read()
    offsets, sizes, numbers, hashes = array("q"), array("q"), array("q"), array("q")
    models: set[str | None] = set()
    for number, offset, raw in raw_lines(path):
        try:
            request = orjson.loads(raw)
        except orjson.JSONDecodeError:
            found.refuse("invalid_json_line", "This line is not parseable as valid JSON.", number)
            continue
        if not _checked(request, number, endpoint, found):
            continue
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
        offsets.append(offset)
        sizes.append(len(raw))
        numbers.append(number)
        hashes.append(hash(request["custom_id"]))
    found.offsets, found.sizes, found.numbers = (
        np.frombuffer(a, np.int64) if a else np.zeros(0, np.int64)
        for a in (offsets, sizes, numbers)
    )
    _refuse_repeats(path, found, np.frombuffer(hashes, np.int64) if hashes else None)
    if len(models) > 1:
        found.refuse(
            "model_mismatch",
            "The requests of one file must name one model; this one names "
            + ", ".join(sorted(str(m) for m in models)),
        )
    if not len(found) and not found.errors:
        found.refuse("empty_file", "The file has no requests.")
    found.errors.sort(key=lambda e: (e["line"] is None, e["line"] or 0))
    found.model = next(iter(models), None)
    return found


def _checked(request: Any, number: int, endpoint: str, found: Read) -> bool:
    """Whether the line is a request for `endpoint` (else its error noted)."""
    if not isinstance(request, dict):
        found.refuse("invalid_request", "The line is not a JSON object.", number)
        return False
    for name, kind in (("custom_id", str), ("method", str), ("url", str), ("body", dict)):
        if not isinstance(request.get(name), kind):
            found.refuse(
                "missing_required_parameter",
                f"The line has no {name} ({'an object' if kind is dict else 'a string'}).",
                number,
                param=name,
            )
            return False
    if request["method"].upper() != "POST":
        found.refuse("invalid_method", "The method must be POST.", number, param="method")
        return False
    if request["url"] != endpoint:
        found.refuse(
            "url_mismatch",
            f"The url {request['url'][:200]!r} is not the batch's endpoint {endpoint!r}.",
            number,
            param="url",
        )
        return False
    return True


def _refuse_repeats(path: Path, found: Read, hashes: np.ndarray | None) -> None:
    """Each line whose `custom_id` an earlier line has, refused: only the lines whose hashes
    meet are read again, and their ids compared whole."""
    if hashes is None:
        return
    values, counts = np.unique(hashes, return_counts=True)
    suspects = np.flatnonzero(np.isin(hashes, values[counts > 1]))
    seen: set[str] = set()
    with Requests(path, found.offsets, found.sizes) as requests:
        for i in suspects.tolist():
            custom_id = requests.custom_id(i)
            if custom_id in seen:
                found.refuse(
                    "duplicate_custom_id",
                    f"The custom_id {custom_id!r} is used by an earlier line; each must be unique.",
                    int(found.numbers[i]),
                    param="custom_id",
                )
            seen.add(custom_id)


class Requests:
    """A batch's input file, its requests read one at a time where `read` found them."""

    def __init__(self, path: Path, offsets: np.ndarray, sizes: np.ndarray) -> None:
        self.offsets, self.sizes = offsets, sizes
        self._fd = os.open(path, os.O_RDONLY)

    def raw(self, i: int) -> bytes:
        return os.pread(self._fd, int(self.sizes[i]), int(self.offsets[i]))

    def parsed(self, i: int) -> dict[str, Any]:
        request: dict[str, Any] = orjson.loads(self.raw(i))
        return request

    def custom_id(self, i: int) -> str:
        return str(self.parsed(i)["custom_id"])

    def request(self, i: int) -> tuple[str, bytes]:
        """Request `i`: its custom_id, and its body as JSON."""
        request = self.parsed(i)
        return request["custom_id"], orjson.dumps(request["body"])

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> Requests:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def served(engine: Engine, name: str | None) -> bool:
    """Whether the model `name` (None: the default) answers now."""
    return the_model(engine, name) is not None


def the_model(engine: Engine, name: str | None) -> Model | None:
    """The model a file's lines name (or the server's default), for its tokenizer."""
    try:
        return engine.model(name)
    except BucketserveError:
        return None

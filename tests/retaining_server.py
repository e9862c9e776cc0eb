"""`bucketserve serve` that deliberately keeps every line of every batch input it reads,
parsed, for the life of the process: the negative control of `test_batch_memory`, whose
bounds must catch it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import orjson

from bucketserve.jobs import lines
from bucketserve.process.cli import main

RETAINED: list[Any] = []
_read_lines = lines.raw_lines


def retaining(*args: Any, **kwargs: Any) -> Iterator[Any]:
    for item in _read_lines(*args, **kwargs):
        RETAINED.append(orjson.loads(item[-1]))  # (the line's bytes come last)
        yield item


lines.raw_lines = retaining  # type: ignore[assignment]
sys.exit(main())

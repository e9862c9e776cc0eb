"""A running batch's answers, appended to its output and error files in the order's prefix
and made durable at each checkpoint (the files synced, then the state committed), and how a
batch that cannot go on says why (`JobFailed`). The first write that fails breaks the
writer: nothing more is written, and the batch fails with `output_unwritable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bucketserve.jobs.store import Progress, Store

WRITE_BUFFER = 1 << 20  # (answers are a few KiB each: one write to the system per hundreds)


class JobFailed(Exception):
    """The batch cannot go on (its model gone, its files unwritable): failed, with this."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    @classmethod
    def unwritable(cls, what: str, exc: OSError) -> JobFailed:
        return cls("output_unwritable", f"writing {what}: {exc.strerror or exc}")


@dataclass
class Answered:
    """One line's answer, as its file line."""

    ok: bool
    line: bytes
    tokens: int


class Writer:
    """The answers, appended to the batch's files in the order's prefix, made durable at each
    checkpoint (files synced, then the state committed)."""

    def __init__(self, folder: Path, progress: Progress) -> None:
        self.progress = progress
        self.broken = False  # a write failed: nothing more is written
        self._pending: dict[int, Answered] = {}
        try:
            self._files = {
                True: _opened(folder / "output.jsonl", progress.output_bytes),
                False: _opened(folder / "errors.jsonl", progress.error_bytes),
            }
        except OSError as exc:
            raise JobFailed.unwritable("the output", exc) from None
        self._written = {True: progress.output_bytes, False: progress.error_bytes}
        self._counts = {True: progress.completed, False: progress.failed}
        self._tokens = progress.tokens
        self._next = progress.done

    def answered(self, position: int, answer: Answered) -> None:
        if self.broken:  # (the batch fails with the first failure; later lines go nowhere)
            return
        self._pending[position] = answer
        while self._next in self._pending:
            done = self._pending[self._next]
            try:
                self._files[done.ok].write(done.line)
            except OSError as exc:
                self.broken = True
                raise JobFailed.unwritable("the output", exc) from None
            del self._pending[self._next]
            self._written[done.ok] += len(done.line)
            self._counts[done.ok] += 1
            self._tokens += done.tokens
            self._next += 1

    def snapshot(self) -> Progress:
        """What is answered so far, its bytes handed to the system. On the loop, where lines
        are appended: no line is half in it."""
        try:
            for file in self._files.values():
                file.flush()
        except OSError as exc:
            self.broken = True
            raise JobFailed.unwritable("the output", exc) from None
        return Progress(self._next, self._written[True], self._written[False],
                        self._counts[True], self._counts[False], self._tokens)  # fmt: skip

    def durable(self, progress: Progress, store: Store, batch_id: str) -> None:
        """`progress` made durable: the files synced (lines appended meanwhile, past it, are
        cut at a restart), then the state committed. In a thread: the loop goes on."""
        try:
            for file in self._files.values():
                os.fsync(file.fileno())
            store.checkpoint(batch_id, progress)
        except OSError as exc:
            self.broken = True
            raise JobFailed.unwritable("the output", exc) from None
        self.progress = progress

    async def checkpoint(self, store: Store, batch_id: str) -> None:
        await asyncio.to_thread(self.durable, self.snapshot(), store, batch_id)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *_: object) -> None:
        for file in self._files.values():
            with contextlib.suppress(OSError):
                file.close()


def _opened(path: Path, size: int) -> Any:
    """`path` for appending after its first `size` bytes (what a checkpoint counted)."""
    file = path.open("ab", buffering=WRITE_BUFFER)
    if file.seek(0, os.SEEK_END) < size:  # (a checkpoint is committed after its bytes)
        file.close()
        raise JobFailed("output_lost", f"{path.name} is shorter than its last checkpoint")
    file.truncate(size)
    return file

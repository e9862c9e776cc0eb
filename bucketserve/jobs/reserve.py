"""Room kept on the jobs directory's disk for recording a batch's end: a file of
`RESERVE_BYTES` that the store gives back when a write that ends a batch finds the disk full
(`Store.end`), so that a batch whose output filled the disk is still recorded `failed`, never
left in progress. It is made again once the disk has room, and a batch is created only while
it is whole.

Random bytes, not zeros: a filesystem that compresses or dedups would keep zeros in no room.
"""

from __future__ import annotations

import os
from pathlib import Path

RESERVE_BYTES = 256 * 1024  # a few dozen SQLite commits (a batch's end writes two or three)


class Reserve:
    def __init__(self, path: Path, size: int = RESERVE_BYTES) -> None:
        self.path, self.size = path, size

    def keep(self) -> bool:
        """Whether the reserve is whole, made now if it was not (False: no room for it)."""
        try:
            if self.path.stat().st_size == self.size:
                return True
        except FileNotFoundError:
            pass
        try:
            with self.path.open("wb") as file:
                file.write(os.urandom(self.size))
                file.flush()
                os.fsync(file.fileno())
        except OSError:
            self.path.unlink(missing_ok=True)  # (a part of it is no reserve)
            return False
        return True

    def release(self) -> bool:
        """Its room given back to the disk; False when there was none to give."""
        try:
            self.path.unlink()
        except OSError:
            return False
        return True

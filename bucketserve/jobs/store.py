"""Where bulk work lives on disk, under the jobs directory: `state.sqlite` (the files' records
and each batch's object and progress, in SQLite's write-ahead log, so that a power cut
leaves the last committed state), `files/` (each file's bytes, an upload written whole
before its record) and `batches/ID/` (a running batch's order and its output so far).

One server holds a directory at a time (an exclusive lock on `lock`): two servers resuming
the same batches would each run them. Nothing is written, and the lock is not taken, until
bulk work is first asked for or a directory with state in it is found at the start.

A batch's end is recorded even when the disk is full (`end`): the write may free the room
kept for it (`reserve`); where even that cannot be written (a read-only disk) the end is
said from memory and committed by the next write that can be. Every other write that fails
raises OSError, the state as it was.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bucketserve.errors import Unavailable
from bucketserve.jobs.reserve import Reserve

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created_at INTEGER NOT NULL,
    object TEXT NOT NULL,
    done INTEGER NOT NULL DEFAULT 0,
    output_bytes INTEGER NOT NULL DEFAULT 0,
    error_bytes INTEGER NOT NULL DEFAULT 0,
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    tokens INTEGER NOT NULL DEFAULT 0
);
"""


@dataclass(frozen=True)
class FileRecord:
    id: str
    tenant: str
    filename: str
    purpose: str
    bytes: int
    created_at: int

    def described(self) -> dict[str, Any]:
        """As OpenAI's API answers a file object."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


@dataclass(frozen=True)
class Progress:
    """How far a running batch is: the first `done` lines of its order answered, their
    answers in the first `output_bytes` of its output and `error_bytes` of its errors."""

    done: int = 0
    output_bytes: int = 0
    error_bytes: int = 0
    completed: int = 0
    failed: int = 0
    tokens: int = 0


@dataclass(frozen=True)
class BatchRecord:
    id: str
    tenant: str
    object: dict[str, Any]  # OpenAI's batch object, but its request counts
    progress: Progress

    @property
    def status(self) -> str:
        return str(self.object["status"])

    def described(self) -> dict[str, Any]:
        """As OpenAI's API answers a batch object."""
        total = self.object.get("request_counts", {}).get("total", 0)
        counts = {"total": total, "completed": self.progress.completed}
        return {**self.object, "request_counts": counts | {"failed": self.progress.failed}}


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def now() -> int:
    return int(time.time())


class Store:
    """The jobs directory. Every method may be called from any thread (one connection, held
    under a lock: the state is small, its writes few)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._held: int | None = None  # the lock file's descriptor, while held
        self.reserve = Reserve(root / "reserve")
        self._unwritten: dict[str, dict[str, Any]] = {}  # batches' ends not yet committed

    @property
    def has_state(self) -> bool:
        return (self.root / "state.sqlite").is_file()

    def open(self) -> None:
        """Take the directory (its lock, its schema); Unavailable if another server holds it
        or it cannot be made."""
        if self._db is not None:
            return
        try:
            (self.root / "files").mkdir(parents=True, exist_ok=True)
            (self.root / "batches").mkdir(exist_ok=True)
            held = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise Unavailable(f"bulk jobs: the jobs directory: {exc.strerror}") from None
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(held)
            raise Unavailable(  # (its path is the host's: the log names it, a client not)
                "bulk jobs: another server holds this server's jobs directory; start this one "
                "with its own --jobs-dir"
            ) from None
        self._held = held
        db = sqlite3.connect(self.root / "state.sqlite", check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")  # (a commit is on disk when it returns)
        db.executescript(SCHEMA)
        self._db = db
        if not self.reserve.keep():
            log.warning("bulk jobs: the jobs directory's disk is full; no batch starts until "
                        "it has room")  # fmt: skip

    def close(self) -> None:
        with self._lock:
            if self._unwritten:
                log.error("bulk jobs: the end of batches %s could not be written; they resume "
                          "at the next start", ", ".join(self._unwritten))  # fmt: skip
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._held is not None:
                os.close(self._held)  # (the lock goes with it)
                self._held = None

    def _run(self, sql: str, *args: Any, reserved: bool = False) -> list[tuple[Any, ...]]:
        """`sql` committed; OSError where it cannot be (a full or read-only disk). A
        `reserved` write that finds no room gives back the reserve and tries once more."""
        self.open()
        assert self._db is not None
        with self._lock:
            self._commit_unwritten()
            try:
                return self._committed(sql, args)
            except OSError:
                if not (reserved and self.reserve.release()):
                    raise
            return self._committed(sql, args)

    def _committed(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        assert self._db is not None
        try:
            with self._db:
                return self._db.execute(sql, args).fetchall()
        except sqlite3.OperationalError as exc:  # (full, read-only, I/O: what the disk said)
            raise OSError(errno.EIO, f"the jobs state: {exc}") from None

    def _commit_unwritten(self) -> None:
        """Ends said from memory, committed now if they can be (under the lock)."""
        for batch_id, described in list(self._unwritten.items()):
            try:
                self._committed(
                    "UPDATE batches SET object = ? WHERE id = ?", (json.dumps(described), batch_id)
                )
            except OSError:
                return
            del self._unwritten[batch_id]

    # -- files ----------------------------------------------------------------------------

    def file_path(self, file_id: str) -> Path:
        return self.root / "files" / file_id

    def upload_path(self) -> Path:
        """Where an upload is written before it is a file (renamed when whole)."""
        self.open()
        return self.root / "files" / f".upload-{uuid.uuid4().hex}"

    def add_file(
        self,
        written: Path,
        tenant: str,
        filename: str,
        purpose: str,
        file_id: str | None = None,
        reserved: bool = False,
    ) -> FileRecord:
        """`written` (whole, flushed) as a new file of `tenant`'s: its record first, then its
        bytes moved in (a restart between the two makes the same file again). `reserved`: a
        batch's output at its end, which may use the reserve."""
        record = FileRecord(
            file_id or new_id("file-"), tenant, filename, purpose, written.stat().st_size, now()
        )
        self._run(
            "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?)",
            record.id, tenant, filename, purpose, record.bytes, record.created_at,
            reserved=reserved,
        )  # fmt: skip
        os.replace(written, self.file_path(record.id))
        return record

    def file(self, file_id: str, tenant: str) -> FileRecord | None:
        rows = self._run("SELECT * FROM files WHERE id = ? AND tenant = ?", file_id, tenant)
        return FileRecord(*rows[0]) if rows else None

    def files(self, tenant: str, purpose: str | None = None) -> list[FileRecord]:
        """`tenant`'s files, newest first."""
        rows = self._run(
            "SELECT * FROM files WHERE tenant = ? AND (? IS NULL OR purpose = ?) "
            "ORDER BY created_at DESC, rowid DESC",
            tenant, purpose, purpose,
        )  # fmt: skip
        return [FileRecord(*row) for row in rows]

    def count_files(self, tenant: str, purpose: str) -> int:
        rows = self._run(
            "SELECT count(*) FROM files WHERE tenant = ? AND purpose = ?", tenant, purpose
        )
        return int(rows[0][0])

    def delete_file(self, file_id: str) -> None:
        self._run("DELETE FROM files WHERE id = ?", file_id)
        self.file_path(file_id).unlink(missing_ok=True)

    # -- batches --------------------------------------------------------------------------

    def batch_dir(self, batch_id: str) -> Path:
        return self.root / "batches" / batch_id

    def add_batch(self, tenant: str, described: dict[str, Any]) -> BatchRecord:
        self._run(
            "INSERT INTO batches (id, tenant, created_at, object) VALUES (?, ?, ?, ?)",
            described["id"], tenant, described["created_at"], json.dumps(described),
        )  # fmt: skip
        return BatchRecord(described["id"], tenant, described, Progress())

    def batch(self, batch_id: str, tenant: str | None = None) -> BatchRecord | None:
        rows = self._run(
            "SELECT * FROM batches WHERE id = ? AND (? IS NULL OR tenant = ?)",
            batch_id, tenant, tenant,
        )  # fmt: skip
        return self._said(_batch(rows[0])) if rows else None

    def batches(self, tenant: str | None = None) -> list[BatchRecord]:
        """The batches (of `tenant`, or every one), newest first."""
        rows = self._run(
            "SELECT * FROM batches WHERE (? IS NULL OR tenant = ?) "
            "ORDER BY created_at DESC, rowid DESC",
            tenant, tenant,
        )  # fmt: skip
        return [self._said(_batch(row)) for row in rows]

    def _said(self, record: BatchRecord) -> BatchRecord:
        """`record` as it stands: its end, where that is not yet committed."""
        ended = self._unwritten.get(record.id)
        return (
            record
            if ended is None
            else BatchRecord(record.id, record.tenant, ended, record.progress)
        )

    def update(self, batch_id: str, **fields: Any) -> BatchRecord:
        """Set fields of the batch's object (a status and its time, its files...)."""
        record = self.batch(batch_id)
        assert record is not None
        described = {**record.object, **fields}
        self._run("UPDATE batches SET object = ? WHERE id = ?", json.dumps(described), batch_id)
        return BatchRecord(batch_id, record.tenant, described, record.progress)

    def recorded(self, batch_id: str) -> bool:
        """Whether the batch's object is committed as it is said (its end not held in
        memory)."""
        return batch_id not in self._unwritten

    def end(self, batch_id: str, **fields: Any) -> BatchRecord:
        """Set the fields that end a batch (its final status, its errors, its files), even on
        a full disk (the reserve given back for it) and, where nothing can be written, said
        from memory until a later write can commit it; never raises for the disk."""
        record = self.batch(batch_id)
        assert record is not None
        described = {**record.object, **fields}
        try:
            self._run(
                "UPDATE batches SET object = ? WHERE id = ?", json.dumps(described), batch_id,
                reserved=True,
            )  # fmt: skip
        except OSError as exc:
            log.error("batch %s: its end could not be written (%s); said from memory until "
                      "it can be", batch_id, exc.strerror)  # fmt: skip
            with self._lock:
                self._unwritten[batch_id] = described
        return BatchRecord(batch_id, record.tenant, described, record.progress)

    def checkpoint(self, batch_id: str, progress: Progress) -> None:
        self._run(
            "UPDATE batches SET done = ?, output_bytes = ?, error_bytes = ?, completed = ?, "
            "failed = ?, tokens = ? WHERE id = ?",
            progress.done, progress.output_bytes, progress.error_bytes, progress.completed,
            progress.failed, progress.tokens, batch_id,
        )  # fmt: skip


def _batch(row: tuple[Any, ...]) -> BatchRecord:
    batch_id, tenant, _, described, *progress = row
    return BatchRecord(batch_id, tenant, json.loads(described), Progress(*progress))

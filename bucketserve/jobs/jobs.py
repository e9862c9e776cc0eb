"""The server's bulk jobs: files and batches made, listed and cancelled for their owner (the
tenant of the request that made them, not its key: a rotated key's tenant keeps them), within
the quotas, each counted and taken in one step (an upload holds its slot while it is
written); each unfinished batch run by its `Runner`, resumed at the start, stopped
(checkpointed, left in progress) at the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bucketserve.core.engine import Engine
from bucketserve.errors import (
    InsufficientStorage,
    InvalidInput,
    NotFound,
    QuotaExceeded,
    Unavailable,
)
from bucketserve.jobs.runner import FINAL, Runner
from bucketserve.jobs.sender import Dispatch
from bucketserve.jobs.store import BatchRecord, FileRecord, Store, new_id, now
from bucketserve.metrics import Metrics
from bucketserve.settings import Settings

log = logging.getLogger(__name__)

WINDOW_S = {"24h": 24 * 3600}  # OpenAI's completion windows: the one it offers


class Jobs:
    def __init__(
        self, root: Path, engine: Engine, metrics: Metrics, settings: Settings, dispatch: Dispatch
    ) -> None:
        """`dispatch`: the routes a batch's lines are sent to, in process (the process's)."""
        self.store, self.engine, self.metrics = Store(root), engine, metrics
        self.max_file_bytes = int(settings.max_file_mb * 2**20)
        self.max_files, self.max_jobs = settings.max_files, settings.max_jobs
        self.dispatch = dispatch
        self._runners: dict[str, tuple[Runner, asyncio.Task[None]]] = {}
        self._counted = False
        # Quotas are counted and taken as one step, under this lock: each upload being
        # written holds a slot of its tenant's (its path here), until kept or given up.
        self._owning = threading.Lock()
        self._uploading: dict[Path, str] = {}

    def _open(self) -> None:
        """The store taken, and its batches counted in the metrics, once."""
        self.store.open()
        if not self._counted:
            self._counted = True
            for record in self.store.batches():
                self.metrics.job_moved(None, record.status)

    # -- the process's start and drain ----------------------------------------------------

    def resume(self) -> None:
        """Every unfinished batch of an existing jobs directory, run again from its last
        checkpoint (a directory another server holds: said, and left to it)."""
        if not self.store.has_state:
            return
        try:
            self._open()
        except Unavailable as exc:
            log.warning("%s (%s)", exc, self.store.root)
            return
        for record in self.store.batches():
            if record.status not in FINAL:
                log.info("batch %s: resumed (%s)", record.id, record.status)
                self._start(record.id)

    async def stop(self) -> None:
        """Every runner stopped at its next line; what is in flight answered and kept."""
        for runner, _ in self._runners.values():
            runner.stop()
        await asyncio.gather(*(task for _, task in self._runners.values()), return_exceptions=True)
        self.store.close()

    def _start(self, batch_id: str) -> None:
        runner = Runner(self.store, batch_id, self.engine, self.dispatch, self.metrics)
        task = asyncio.create_task(runner.run(), name=f"batch {batch_id}")
        self._runners[batch_id] = (runner, task)
        task.add_done_callback(lambda _: self._ended(batch_id))

    def _ended(self, batch_id: str) -> None:
        """A runner ended; one that broke (a bug) fails its batch, rather than leave it in
        progress with nothing running it."""
        _, task = self._runners.pop(batch_id)
        broke = None if task.cancelled() else task.exception()
        if broke is None:
            return
        log.error("batch %s: its runner failed", batch_id, exc_info=broke)
        with contextlib.suppress(Exception):  # (the store itself may be what broke)
            old = self.store.batch(batch_id)
            error = {
                "code": "internal_error",
                "message": "the server failed running it",
                "line": None,
            }
            self.store.end(batch_id, status="failed", failed_at=now(),
                           errors={"object": "list", "data": [error]})  # fmt: skip
            self.metrics.job_moved(old.status if old else None, "failed")

    async def finished(self, batch_id: str) -> None:
        """Until the batch's runner ends (the command's wait)."""
        if batch_id in self._runners:
            await asyncio.shield(self._runners[batch_id][1])

    # -- files ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def upload_slot(self, tenant: str) -> Iterator[Path]:
        """Where an upload of `tenant`'s is written, one slot of its quota held for it until
        `add_file` keeps it or the block ends: uploads sent at once never keep more than the
        quota."""
        with self._owning:
            path = self.upload_path(tenant)
            self._uploading[path] = tenant
        try:
            yield path
        finally:
            with self._owning:
                self._uploading.pop(path, None)
            path.unlink(missing_ok=True)  # (a kept upload was moved away)

    def upload_path(self, tenant: str) -> Path:
        """Where an upload of `tenant`'s is written; refused when it keeps its quota of uploads,
        those being written counted (a batch's output is not: it is the server's doing)."""
        self._open()
        writing = sum(owner == tenant for owner in self._uploading.values())
        if self.store.count_files(tenant, "batch") + writing >= self.max_files:
            raise QuotaExceeded(
                f"this tenant keeps {self.max_files} files, the most it may (--max-files); "
                "delete one first"
            )
        return self.store.upload_path()

    def add_file(self, written: Path, tenant: str, filename: str, purpose: str) -> FileRecord:
        """`written` kept as a file of `tenant`'s, in the slot it held (one step)."""
        with self._owning, _storage("the file"):
            self._uploading.pop(written, None)
            return self.store.add_file(written, tenant, filename, purpose)

    def file(self, file_id: str, tenant: str) -> FileRecord:
        self._open()
        found = self.store.file(file_id, tenant)
        if found is None:
            raise NotFound(f"No such File object: {file_id}", param="file_id")
        return found

    def files(self, tenant: str, purpose: str | None) -> list[FileRecord]:
        self._open()
        return self.store.files(tenant, purpose)

    def delete_file(self, file_id: str, tenant: str) -> FileRecord:
        with self._owning:  # (no batch made over it meanwhile)
            found = self.file(file_id, tenant)
            running = [r for r in self.store.batches(tenant) if r.status not in FINAL]
            if any(r.object["input_file_id"] == file_id for r in running):
                raise InvalidInput(
                    f"{file_id} is the input of an unfinished batch: cancel it first",
                    param="file_id",
                )
            with _storage("the deletion"):
                self.store.delete_file(file_id)
            return found

    # -- batches --------------------------------------------------------------------------

    def create(
        self,
        tenant: str,
        input_file_id: str,
        endpoint: str,
        window: str,
        metadata: dict[str, str] | None,
    ) -> BatchRecord:
        endpoints = self.dispatch.paths  # (the routes marked so, where they are declared)
        if endpoint not in endpoints:
            raise InvalidInput(
                f"endpoint {endpoint!r}: a batch runs one of {', '.join(endpoints)}",
                param="endpoint",
            )
        if window not in WINDOW_S:
            raise InvalidInput(
                f"completion_window {window!r}: the one offered is 24h",
                param="completion_window",
            )
        with self._owning, _storage("the batch"):  # (the file and the quota held meanwhile)
            record = self._add_batch(tenant, input_file_id, endpoint, window, metadata)
        self.metrics.job_moved(None, record.status)
        self._start(record.id)
        return record

    def _add_batch(
        self,
        tenant: str,
        input_file_id: str,
        endpoint: str,
        window: str,
        metadata: dict[str, str] | None,
    ) -> BatchRecord:
        given = self.file(input_file_id, tenant)
        if given.purpose != "batch":
            raise InvalidInput(
                f"{input_file_id} was uploaded for {given.purpose!r}; a batch's input is "
                "uploaded with purpose 'batch'",
                param="input_file_id",
            )
        unfinished = [r for r in self.store.batches(tenant) if r.status not in FINAL]
        if len(unfinished) >= self.max_jobs:
            raise QuotaExceeded(
                f"this tenant has {len(unfinished)} unfinished batches, the most it may "
                "(--max-jobs); wait for one, or cancel one"
            )
        if not self.store.reserve.keep():  # (a batch is made only while its end can be kept)
            raise InsufficientStorage(
                "the jobs directory's disk has no room to record a batch's end: free some"
            )
        created = now()
        described: dict[str, Any] = {
            "id": new_id("batch_"),
            "object": "batch",
            "endpoint": endpoint,
            "errors": None,
            "input_file_id": input_file_id,
            "completion_window": window,
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": created,
            "in_progress_at": None,
            "expires_at": created + WINDOW_S[window],
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": metadata,
        }
        return self.store.add_batch(tenant, described)

    def batch(self, batch_id: str, tenant: str) -> BatchRecord:
        self._open()
        found = self.store.batch(batch_id, tenant)
        if found is None:
            raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
        return found

    def batches(self, tenant: str) -> list[BatchRecord]:
        self._open()
        return self.store.batches(tenant)

    def cancel(self, batch_id: str, tenant: str) -> BatchRecord:
        """The batch stops sending; what it answered stays in its output (`cancelled` once
        what was in flight is answered)."""
        record = self.batch(batch_id, tenant)
        if record.status in FINAL or record.status == "cancelling":
            return record
        with _storage("the cancel"):
            moved = self.store.update(batch_id, status="cancelling", cancelling_at=now())
        self.metrics.job_moved(record.status, "cancelling")
        record = moved
        if batch_id in self._runners:
            self._runners[batch_id][0].cancel()
        return record


@contextlib.contextmanager
def _storage(what: str) -> Iterator[None]:
    """A write of the jobs state that the disk refused (full, read-only): 507 to the client,
    the state as it was."""
    try:
        yield
    except OSError as exc:
        raise InsufficientStorage(f"{what} could not be kept: {exc.strerror}") from None

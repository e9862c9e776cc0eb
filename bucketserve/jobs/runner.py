"""One batch, from its input file to its output files: read and checked (`lines`), ordered by
length (`ordering`) into its plan (`plan`), then each line read from the file and sent
through the one request path (`sender.Dispatch`: the routes in process, at the bulk level)
with a bounded number in flight, and answered back in the order's prefix: the answers of
the first `done` lines of the order are in the first bytes of the output and error files
that the last checkpoint names. A restart truncates both files to their checkpoint and goes
on from `done`, so each line is answered exactly once.

A line the server could not take now (503: a queue full, or 504) is sent again later, by the
rule of all bulk work (`sender.send`). Any other answer is the line's: 2xx in the output
file, the rest in the error file, as OpenAI's are.

A batch always ends: any write that fails (a full disk, a read-only one, a quota) fails it
with `output_unwritable`, what its last checkpoint holds kept as its output, and its end is
recorded even on a full disk (`Store.end`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bucketserve.core.engine import Engine
from bucketserve.jobs import lines, ordering
from bucketserve.jobs.plan import Plan, read_plan, write_plan
from bucketserve.jobs.sender import IN_FLIGHT, Dispatch, Reply, send
from bucketserve.jobs.store import BatchRecord, Store, now
from bucketserve.jobs.writer import Answered, JobFailed, Writer
from bucketserve.metrics import JOB_TENANT, Metrics
from bucketserve.runtime.sessions import return_freed_memory

log = logging.getLogger(__name__)

CHECKPOINT_S = 1.0  # answers are made durable at least this often
FINAL = ("completed", "failed", "expired", "cancelled")


class Runner:
    def __init__(
        self, store: Store, batch_id: str, engine: Engine, dispatch: Dispatch, metrics: Metrics
    ) -> None:
        self.store, self.batch_id, self.engine = store, batch_id, engine
        self.dispatch, self.metrics = dispatch, metrics
        self.folder = store.batch_dir(batch_id)
        self._fingerprints: list[str] = []  # of the versions that answered, first seen first
        self._cancel = asyncio.Event()
        self._stop = asyncio.Event()

    def cancel(self) -> None:
        self._cancel.set()

    def stop(self) -> None:
        """Stop sending (the server drains): what is in flight is answered and checkpointed;
        the batch stays in progress, for the next start."""
        self._stop.set()

    @property
    def record(self) -> BatchRecord:
        record = self.store.batch(self.batch_id)
        assert record is not None
        return record

    def _status(self, status: str, **fields: Any) -> BatchRecord:
        """The batch moved to `status`, at its time (OpenAI's `{status}_at`); an end is
        recorded whatever the disk (`Store.end`)."""
        stamp = {} if status == "validating" else {f"{status}_at": now()}
        self.metrics.job_moved(self.record.status, status)
        record = self.store.end if status in FINAL else self.store.update
        return record(self.batch_id, status=status, **stamp, **fields)

    async def run(self) -> None:
        """The batch to its end (or until stopped), whatever status it was left in."""
        try:
            try:
                await self._phases()
            except OSError as exc:  # (the state itself, where no phase named what it wrote)
                raise JobFailed.unwritable("the batch's state", exc) from None
        except JobFailed as failed:
            log.warning("batch %s failed: %s", self.batch_id, failed)
            error = {"code": failed.code, "message": str(failed), "line": None}
            await asyncio.to_thread(self._finish, "failed", errors=_errors([error]))

    async def _phases(self) -> None:
        if self.record.status == "validating":
            await self._validate()
        if self.record.status == "in_progress":
            await self._answer()
        if self.record.status == "finalizing":
            await asyncio.to_thread(self._finish, "completed")
        elif self.record.status == "cancelling":
            await asyncio.to_thread(self._finish, "cancelled")

    # -- validating -----------------------------------------------------------------------

    async def _validate(self) -> None:
        record = self.record
        path = self.store.file_path(record.object["input_file_id"])
        read = await asyncio.to_thread(self._planned, path, record.object["endpoint"])
        if read.errors:
            self._status("failed", errors=_errors(read.errors))
            return
        counts = {"total": len(read), "completed": 0, "failed": 0}
        self.store.update(self.batch_id, request_counts=counts, model=read.model)
        self._status("cancelling" if self._cancel.is_set() else "in_progress")

    def _planned(self, path: Path, endpoint: str) -> lines.Read:
        """(In a thread.) The input read and checked and, unless it is refused, its plan
        written: the order by length, and where each request lies in the file."""
        try:
            read = lines.read(path, endpoint, self.engine)
            if read.errors:
                return read
            model = lines.the_model(self.engine, read.model)
            with lines.Requests(path, read.offsets, read.sizes) as requests:
                lengths = ordering.file_lengths(read, requests, model)
        except OSError as exc:
            raise JobFailed("file_unreadable", f"the input file: {exc.strerror}") from None
        finally:
            return_freed_memory()  # (what reading made, the tokenizer's included)
        plan = Plan(ordering.order(lengths), lengths, read.offsets, read.sizes)
        try:
            write_plan(self.folder, plan)
        except OSError as exc:
            raise JobFailed.unwritable("the batch's order", exc) from None
        return read

    # -- in progress ----------------------------------------------------------------------

    async def _answer(self) -> None:
        record = self.record
        path = self.store.file_path(record.object["input_file_id"])
        try:
            plan = await asyncio.to_thread(read_plan, self.folder, path)
        except OSError as exc:
            raise JobFailed("output_lost", f"the batch's order: {exc.strerror}") from None
        try:
            requests = lines.Requests(path, plan.offsets, plan.sizes)
        except OSError as exc:
            raise JobFailed("file_unreadable", f"the input file: {exc.strerror}") from None
        with requests, Writer(self.folder, record.progress) as writer:
            try:
                await self._send(record, requests, plan.order, plan.lengths, writer)
            finally:
                if not writer.broken:  # (what was answered, kept; a failed write says why)
                    await writer.checkpoint(self.store, self.batch_id)
            done = writer.progress.done
            if self._cancel.is_set():
                if self.record.status != "cancelling":
                    self._status("cancelling")
            elif done == len(plan.order):
                self._status("finalizing")
            elif self._expired(record):
                await asyncio.to_thread(self._expire, requests, plan.order, done)

    async def _send(
        self,
        record: BatchRecord,
        requests: lines.Requests,
        order: np.ndarray,
        lengths: np.ndarray,
        writer: Writer,
    ) -> None:
        endpoint = record.object["endpoint"]
        tenant = JOB_TENANT + self.batch_id
        room = asyncio.Semaphore(IN_FLIGHT)
        failed: list[JobFailed] = []
        sent: set[asyncio.Task[None]] = set()

        async def one(position: int) -> None:
            try:
                custom_id, body = _request(requests, int(order[position]))
                answer = await self._line(endpoint, custom_id, body, tenant)
                if answer is not None:
                    answer.tokens = int(lengths[order[position]])
                    writer.answered(position, answer)
                    self.metrics.job_line_done(answer.ok, answer.tokens)
            except JobFailed as exc:
                failed.append(exc)
            except OSError as exc:  # (the state, noting a fingerprint)
                failed.append(JobFailed.unwritable("the batch's state", exc))
            finally:
                room.release()

        try:
            await self._sent_in_order(record, order, one, room, failed, sent, writer)
        except JobFailed as exc:  # (a checkpoint that could not be written)
            failed.append(exc)
        if failed:  # (what is in flight has nowhere to go: stopped, not awaited)
            for task in sent:
                task.cancel()
        await asyncio.gather(*sent, return_exceptions=True)
        if failed:
            raise failed[0]

    async def _sent_in_order(
        self,
        record: BatchRecord,
        order: np.ndarray,
        one: Callable[[int], Coroutine[Any, Any, None]],
        room: asyncio.Semaphore,
        failed: list[JobFailed],
        sent: set[asyncio.Task[None]],
        writer: Writer,
    ) -> None:
        """Each line of the order from the checkpoint on, `IN_FLIGHT` at once, until the
        batch halts or a line fails it; a checkpoint at least every CHECKPOINT_S."""
        last = time.monotonic()
        for position in range(record.progress.done, len(order)):
            await room.acquire()
            if self._halted(record) or failed:
                room.release()
                break
            task = asyncio.create_task(one(position))
            sent.add(task)
            task.add_done_callback(sent.discard)
            if time.monotonic() - last >= CHECKPOINT_S:
                await writer.checkpoint(self.store, self.batch_id)
                last = time.monotonic()

    def _stopping(self) -> bool:
        return self._cancel.is_set() or self._stop.is_set()

    def _halted(self, record: BatchRecord) -> bool:
        return self._cancel.is_set() or self._stop.is_set() or self._expired(record)

    def _expired(self, record: BatchRecord) -> bool:
        return now() >= int(record.object["expires_at"])

    async def _line(
        self, endpoint: str, custom_id: str, body: bytes, tenant: str
    ) -> Answered | None:
        """The line's answer (None: stopped before the server had room for it)."""
        request_id = line_id(self.batch_id, custom_id)  # (the line's, in the log too)
        reply = await send(self.dispatch, endpoint, body, tenant, request_id, self._stopping)
        if reply is None:
            return None
        if reply.status == 404 and not self._model_served():
            name = self.record.object.get("model")
            raise JobFailed(
                "model_unavailable",
                f"{'the default model' if name is None else repr(name)} is no longer served; "
                "create the batch again once it is",
            )
        if reply.fingerprint is not None:
            self._answered_by(reply.fingerprint)
        line = output_line(custom_id, reply, request_id)
        return Answered(200 <= reply.status < 300, line, 0)

    def _answered_by(self, fingerprint: str) -> None:
        """The batch object lists every version's fingerprint that answered a line: one, or
        more where the content behind the model changed while it ran."""
        if not self._fingerprints:  # (resumed: those of the lines answered before)
            self._fingerprints = list(self.record.object.get("fingerprints") or [])
        if fingerprint not in self._fingerprints:
            self._fingerprints.append(fingerprint)
            self.store.update(self.batch_id, fingerprints=self._fingerprints)

    def _model_served(self) -> bool:
        return lines.served(self.engine, self.record.object.get("model"))

    def _expire(self, requests: lines.Requests, order: np.ndarray, done: int) -> None:
        """The lines not answered within the window, each an error line, as OpenAI's."""
        error = {
            "code": "batch_expired",
            "message": "This request could not be executed before the completion window expired.",
        }
        with Writer(self.folder, self.record.progress) as writer:
            for position in range(done, len(order)):
                custom_id = requests.custom_id(int(order[position]))
                line = error_line(self.batch_id, custom_id, error)
                writer.answered(position, Answered(False, line, 0))
            writer.durable(writer.snapshot(), self.store, self.batch_id)
        self._finish("expired")

    # -- the end --------------------------------------------------------------------------

    def _finish(self, status: str, **fields: Any) -> None:
        """The batch ended as `status`: what it answered, as files of its owner (the output,
        and the errors), named in it. A completion whose files cannot be kept is a failure;
        a failure is recorded whatever the disk."""
        try:
            ids = self._output_files()
        except OSError as exc:
            log.warning("batch %s: its output could not be kept: %s", self.batch_id, exc)
            if status != "failed":
                failed = JobFailed.unwritable("the output", exc)
                error = {"code": failed.code, "message": str(failed), "line": None}
                status, fields = "failed", {**fields, "errors": _errors([error])}
            ids = {}
        self._status(status, **ids, **fields)
        if self.store.recorded(self.batch_id):  # (else the next start resumes from it)
            shutil.rmtree(self.folder, ignore_errors=True)  # (its order, what was not kept)
        return_freed_memory()  # (what the batch held, back to the system)

    def _output_files(self) -> dict[str, str]:
        record = self.record
        progress = record.progress
        ids: dict[str, str] = {}
        for name, field, size in (
            ("output.jsonl", "output_file_id", progress.output_bytes),
            ("errors.jsonl", "error_file_id", progress.error_bytes),
        ):
            file_id = f"file-{self.batch_id.removeprefix('batch_')}-{name.split('.')[0]}"
            path = self.folder / name
            if size and path.is_file():
                with path.open("r+b") as file:
                    file.truncate(size)  # (past the last checkpoint: never counted)
                named = f"{self.batch_id}_{name}"
                self.store.add_file(
                    path, record.tenant, named, "batch_output", file_id, reserved=True
                )
            if size:  # (kept before a restart, or now)
                ids[field] = file_id
        return ids


def _request(requests: lines.Requests, i: int) -> tuple[str, bytes]:
    """Request `i` read from the input file (JobFailed: it cannot be)."""
    try:
        return requests.request(i)
    except OSError as exc:
        raise JobFailed("file_unreadable", f"the input file: {exc.strerror}") from None


def _errors(errors: list[dict[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": errors}


def line_id(batch_id: str, custom_id: str) -> str:
    digest = hashlib.blake2b(f"{batch_id}\0{custom_id}".encode(), digest_size=12).hexdigest()
    return f"batch_req_{digest}"


def output_line(custom_id: str, reply: Reply, request_id: str) -> bytes:
    """A line of the output (or error) file: the route's answer as it sent it (its id, the
    request's), with the fingerprint of the version that answered (its X-Model-Fingerprint
    online)."""
    head = {"id": request_id, "custom_id": custom_id}
    response = b'{"status_code":%d,"request_id":%s,"fingerprint":%s,"body":%s}' % (
        reply.status, orjson.dumps(request_id), orjson.dumps(reply.fingerprint),
        reply.body or b"null",
    )  # fmt: skip
    return orjson.dumps(head)[:-1] + b',"response":' + response + b',"error":null}\n'


def error_line(batch_id: str, custom_id: str, error: dict[str, str]) -> bytes:
    """A line of the error file for a request that got no answer (expired)."""
    head = {"id": line_id(batch_id, custom_id), "custom_id": custom_id, "response": None}
    return orjson.dumps(head | {"error": error}) + b"\n"

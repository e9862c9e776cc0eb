"""OpenAI's Files and Batch API, as the `openai` SDK calls them: files uploaded (multipart,
`purpose: "batch"`), listed, read and deleted; batches created over an input file, read,
listed and cancelled. Each tenant sees its own files and batches (`edges.auth` says whose a
request is); the work itself is the jobs' (`bucketserve.jobs`): every line of a batch goes
through the same routes as a client's request, at the bulk level.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse
from pydantic import Field, StrictStr
from starlette.datastructures import UploadFile

from bucketserve.edges.http.codec import post
from bucketserve.edges.http.common import json_response, read_json, request_tenant
from bucketserve.edges.http.dialects import HOSTED, errors
from bucketserve.edges.http.schemas import Strict, validate
from bucketserve.edges.limits import Budget
from bucketserve.errors import (
    InsufficientStorage,
    InvalidInput,
    MalformedRequest,
    PayloadTooLarge,
    Unavailable,
)
from bucketserve.jobs.jobs import Jobs
from bucketserve.jobs.store import BatchRecord, FileRecord

router = APIRouter(tags=["Batches"])

CHUNK = 1 << 20  # an upload copied in pieces of this many bytes
MAX_BATCHES = 100  # OpenAI's `limit` on batches: at most this many a page (default: 20)
MAX_FILES = 10_000  # and on files (default: all, up to this)


def jobs_of(request: Request) -> Jobs:
    jobs: Jobs | None = getattr(request.app.state, "jobs", None)
    if jobs is None:
        raise Unavailable("bulk jobs are off on this server", retry_after_s=3600)
    return jobs


# -- files --------------------------------------------------------------------------------


UPLOAD = {
    "type": "object",
    "required": ["file", "purpose"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "JSONL request lines"},
        "purpose": {"type": "string", "enum": ["batch"]},
    },
}
READ = errors(HOSTED, 404, 422, 503)  # (503: bulk jobs off, or their folder held)
BINARY = {
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
}


@router.post(
    "/v1/files",
    summary="Upload a file (a batch's input: JSONL, purpose batch)",
    responses=errors(HOSTED, 400, 413, 422, 429, 503, 507),
    openapi_extra={
        "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": UPLOAD}}}
    },
)
async def upload(request: Request) -> Response:
    jobs = jobs_of(request)
    declared = request.headers.get("content-length", "")
    if not (declared.isascii() and declared.isdigit()):
        raise MalformedRequest("send the upload with its Content-Length")
    if int(declared) > jobs.max_file_bytes + CHUNK:  # (the form's own fields around the file)
        raise PayloadTooLarge(f"a file may hold {jobs.max_file_bytes} bytes (--max-file-mb)")
    tenant = request_tenant(request)
    with jobs.upload_slot(tenant) as target:  # (its slot of the quota, held while it comes)
        async with request.form(max_files=1, max_fields=8) as form:
            purpose, given = form.get("purpose"), form.get("file")
            if purpose != "batch":  # (outputs are the server's to make)
                raise InvalidInput(
                    f"purpose {purpose!r}: files here are for 'batch'", param="purpose"
                )
            if not isinstance(given, UploadFile):
                raise InvalidInput("the form has no file", param="file")
            size = await asyncio.to_thread(_copied, given, target, jobs.max_file_bytes)
            name = Path(given.filename or "upload.jsonl").name
        if size == 0:
            raise InvalidInput("the file is empty", param="file")
        record = await asyncio.to_thread(jobs.add_file, target, tenant, name, str(purpose))
    return json_response(record.described())


def _copied(given: UploadFile, target: Path, limit: int) -> int:
    """The upload written to `target` (synced), its size; past `limit`, refused."""
    size = 0
    try:
        with target.open("wb") as out:
            while chunk := given.file.read(CHUNK):
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"a file may hold {limit} bytes (--max-file-mb)")
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        raise InsufficientStorage(f"the upload could not be kept: {exc.strerror}") from None
    return size


@router.get("/v1/files", summary="Files of this tenant, newest first", responses=READ)
async def files(
    request: Request,
    purpose: str | None = None,
    limit: int = MAX_FILES,
    after: str | None = None,
    order: Literal["asc", "desc"] = "desc",
) -> Response:
    kept = jobs_of(request).files(request_tenant(request), purpose)
    if order == "asc":
        kept.reverse()
    return json_response(_page([f.described() for f in kept], after, limit, MAX_FILES))


@router.get("/v1/files/{file_id}", summary="A file's object", responses=READ)
async def file(request: Request, file_id: str) -> Response:
    return json_response(jobs_of(request).file(file_id, request_tenant(request)).described())


@router.get(
    "/v1/files/{file_id}/content",
    summary="A file's bytes",
    response_class=FileResponse,
    responses={200: BINARY, **READ},
)
async def content(request: Request, file_id: str) -> Response:
    jobs = jobs_of(request)
    record: FileRecord = jobs.file(file_id, request_tenant(request))
    return FileResponse(jobs.store.file_path(record.id), media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}", summary="Delete a file", responses=READ)
async def delete(request: Request, file_id: str) -> Response:
    jobs = jobs_of(request)
    record = await asyncio.to_thread(jobs.delete_file, file_id, request_tenant(request))
    return json_response({"id": record.id, "object": "file", "deleted": True})


# -- batches ------------------------------------------------------------------------------


CREATE = (400, 404, 413, 415, 422, 429, 503)  # what creating a batch may answer


MetadataKey = Annotated[StrictStr, Field(max_length=64)]
MetadataValue = Annotated[StrictStr, Field(max_length=512)]


class BatchBody(Strict):
    input_file_id: StrictStr = Field(description="a file uploaded with purpose batch")
    endpoint: StrictStr = Field(description="the route every line runs: /v1/embeddings...")
    completion_window: Literal["24h"] = Field(description="24h, the one offered")
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)] | None = Field(
        None, description="OpenAI's: at most 16 pairs, keys of 64 characters, values of 512"
    )


@post(router, "/v1/batches", HOSTED, BatchBody, "Run a file of requests as a batch", CREATE)
async def create(request: Request) -> Response:
    jobs = jobs_of(request)
    body: BatchBody = validate(
        BatchBody, await read_json(request, Budget(1 << 16, 64, 256)), "body"
    )
    record = jobs.create(  # (on the loop: it starts the batch's runner)
        request_tenant(request),
        body.input_file_id,
        body.endpoint,
        body.completion_window,
        body.metadata,
    )
    return json_response(record.described())


@router.get("/v1/batches/{batch_id}", summary="A batch's object", responses=READ)
async def batch(request: Request, batch_id: str) -> Response:
    return json_response(jobs_of(request).batch(batch_id, request_tenant(request)).described())


@router.get("/v1/batches", summary="Batches of this tenant, newest first", responses=READ)
async def batches(request: Request, limit: int = 20, after: str | None = None) -> Response:
    kept: list[BatchRecord] = jobs_of(request).batches(request_tenant(request))
    return json_response(_page([b.described() for b in kept], after, limit, MAX_BATCHES))


@router.post("/v1/batches/{batch_id}/cancel", summary="Cancel a batch", responses=READ)
async def cancel(request: Request, batch_id: str) -> Response:
    jobs = jobs_of(request)
    record = jobs.cancel(batch_id, request_tenant(request))  # (on the loop: it tells the runner)
    return json_response(record.described())


def _page(items: list[dict[str, Any]], after: str | None, limit: int, most: int) -> dict[str, Any]:
    """A cursor page, as OpenAI's lists answer: the items after the one named."""
    if not 1 <= limit <= most:
        raise InvalidInput(f"limit {limit}: 1 to {most}", param="limit")
    ids = [item["id"] for item in items]
    start = ids.index(after) + 1 if after in ids else 0
    page = items[start : start + limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + limit < len(items),
    }

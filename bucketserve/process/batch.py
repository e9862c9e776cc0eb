"""`bucketserve batch run IN --out OUT`: a bulk job without a server. The repository is loaded
as `serve` loads it, the application built but bound to no port, and the file run as one
batch of the Batch API, by the same runner (`bucketserve.jobs`), its state kept beside the
output (`OUT.partial/`) so that a run cut short (Ctrl-C, a kill, a power cut) goes on where
its last checkpoint stands when started again with the same arguments.

IN is a Batch API file (`.jsonl`: OpenAI's request lines), a plain file of texts (one a line,
each embedded, its line number its `custom_id`), or a column of a parquet file (`--column`).
OUT gets the answers that succeeded, one line each, in OpenAI's output form; the others go to
`OUT.errors.jsonl`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import sys
import time
from pathlib import Path

import orjson
from tqdm import tqdm

from bucketserve.edges.http.app import create_app
from bucketserve.errors import BucketserveError, ConfigError
from bucketserve.jobs.runner import FINAL
from bucketserve.jobs.store import BatchRecord
from bucketserve.process.wiring import Wired, running, wire
from bucketserve.settings import Settings

TEXT_ENDPOINTS = ("/v1/embeddings", "/embeddings")  # (what a text alone is a request to)
POLL_S = 0.25


def run_batch(
    settings: Settings, source: Path, out: Path, endpoint: str, model: str | None, column: str
) -> int:
    """0: every line answered 2xx; 1: some were not (in OUT.errors.jsonl); 2: the file was
    refused (its errors printed)."""
    partial = out.with_name(out.name + ".partial")
    wired = wire(dataclasses.replace(settings, jobs_dir=partial))
    # (the application the lines run through, bound to no port: it attaches to the jobs)
    create_app(wired.engine, wired.control, wired.metrics, wired.keys, wired.limits, wired.jobs)
    try:
        record = asyncio.run(_run(wired, source, endpoint, model, column))
    except BucketserveError as exc:
        print(f"{source}: {exc}", file=sys.stderr)
        return 2
    if record.status == "failed":
        for error in (record.object.get("errors") or {}).get("data", []):
            where = f"line {error['line']}: " if error.get("line") else ""
            print(f"{source}: {where}{error['code']}: {error['message']}", file=sys.stderr)
        return 2
    if record.status not in FINAL:
        return 130  # (stopped: the next run goes on)
    store = wired.jobs.store
    errors = out.with_name(out.name.removesuffix(".jsonl") + ".errors.jsonl")
    for field, target in (("output_file_id", out), ("error_file_id", errors)):
        file_id = record.object.get(field)
        if file_id:
            shutil.copyfile(store.file_path(file_id), target)
        elif field == "output_file_id":
            target.write_bytes(b"")
    counts = record.described()["request_counts"]
    print(f"{counts['completed']} answered into {out}, {counts['failed']} failed"
          + (f" (in {errors})" if counts["failed"] else ""), file=sys.stderr)  # fmt: skip
    shutil.rmtree(partial)
    return 0 if not counts["failed"] else 1


async def _run(
    wired: Wired, source: Path, endpoint: str, model: str | None, column: str
) -> BatchRecord:
    """The batch run to its end, its progress shown; an earlier run's, if one was cut short."""
    jobs = wired.jobs
    async with running(wired.engine, wired.control, wired.metrics, jobs):
        kept = jobs.batches("") if jobs.store.has_state else []
        if kept:
            record = kept[0]  # (an earlier run's, resumed by `running`)
        else:
            written = jobs.upload_path("")
            lines = _requests(source, endpoint, model, column)
            written.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
            given = jobs.add_file(written, "", source.name, "batch")
            record = jobs.create("", given.id, endpoint, "24h", None)
        began, tokens = time.monotonic(), record.progress.tokens
        with tqdm(unit="line", dynamic_ncols=True, file=sys.stderr) as bar:
            while True:
                record = jobs.batch(record.id, "")
                bar.total = record.object["request_counts"]["total"] or None
                bar.n = record.progress.done
                rate = (record.progress.tokens - tokens) / max(time.monotonic() - began, 1e-3)
                bar.set_postfix_str(f"{record.status}, {rate:,.0f} tokens/s", refresh=True)
                if record.status in FINAL:
                    break
                await asyncio.sleep(POLL_S)
        await jobs.finished(record.id)
        return jobs.batch(record.id, "")


def _requests(
    source: Path, endpoint: str, model: str | None, column: str
) -> list[dict[str, object]]:
    """The file's requests, as the Batch API's lines."""
    if source.suffix == ".jsonl":
        return [orjson.loads(raw) for raw in source.read_bytes().splitlines() if raw.strip()]
    if endpoint not in TEXT_ENDPOINTS:
        raise ConfigError(
            f"{source}: texts alone are embedded ({' or '.join(TEXT_ENDPOINTS)}); for "
            f"{endpoint}, write the requests as JSONL"
        )
    texts = _column(source, column) if source.suffix == ".parquet" else _texts(source)
    named = {"model": model} if model is not None else {}
    return [
        {"custom_id": str(i), "method": "POST", "url": endpoint, "body": {"input": t, **named}}
        for i, t in enumerate(texts, 1)
        if t.strip()  # (blank lines and empty cells skipped; the others keep their numbers)
    ]


def _texts(source: Path) -> list[str]:
    return source.read_text(encoding="utf-8").splitlines()


def _column(source: Path, column: str) -> list[str]:
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        raise ConfigError(
            f"{source}: reading parquet needs pyarrow: pip install 'bucketserve[parquet]'"
        ) from None
    table = parquet.read_table(source, columns=[column])
    return [str(text or "") for text in table.column(column).to_pylist()]

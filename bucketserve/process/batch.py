"""`bucketserve batch run IN --out OUT`: a bulk job without a server. The repository is loaded
as `serve` loads it, and the file run as one batch of the Batch API by the same runner
(`bucketserve.jobs`), through the routes in process that the process wires (no application
is built), its state kept beside the output (`OUT.partial/`) so that a run cut short
(Ctrl-C, a kill, a power cut) goes on where its last checkpoint stands when started again
with the same arguments.

IN is a Batch API file (`.jsonl`: OpenAI's request lines), a plain file of texts (one a line,
each embedded, its line number its `custom_id`), or a column of a parquet file (`--column`).
OUT gets the answers that succeeded, one line each, in OpenAI's output form; the others go to
`OUT.errors.jsonl`.

Before any model loads, the input and the models it names are checked (`batch_input`), and a
kept state is resumed only if it is this run's (the same input's bytes, endpoint, model and
column, recorded in `OUT.partial/run.json`): another run's is refused naming it, or
discarded with `--restart`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import sys
import time
from pathlib import Path

from tqdm import tqdm

from bucketserve.errors import BucketserveError
from bucketserve.jobs.runner import FINAL
from bucketserve.jobs.store import BatchRecord
from bucketserve.process import batch_input
from bucketserve.process.batch_input import Refused, RunOf
from bucketserve.process.wiring import Wired, running, wire
from bucketserve.settings import Settings

POLL_S = 0.25
RUN_FILE = "run.json"  # in OUT.partial/: what the kept run is of (`RunOf`)


def run_batch(
    settings: Settings,
    source: Path,
    out: Path,
    endpoint: str,
    model: str | None,
    column: str,
    restart: bool = False,
) -> int:
    """0: every line answered 2xx; 1: some were not (in OUT.errors.jsonl); 2: the file or
    the command was refused (why, printed)."""
    partial = out.with_name(out.name + ".partial")
    errors = out.with_name(out.name.removesuffix(".jsonl") + ".errors.jsonl")
    try:
        batch_input.paths(source, out, errors, partial)
        this = batch_input.run_of(source, endpoint, model, column)
        _claim(partial, this, restart)
        lines = batch_input.read(source, endpoint, model, column)
        named = ({model} if model is not None else set()) | batch_input.line_models(lines)
        batch_input.check_models(settings, named)
    except Refused as exc:
        print(f"bucketserve batch run: {exc}", file=sys.stderr)
        return 2
    partial.mkdir(exist_ok=True)
    (partial / RUN_FILE).write_bytes(this.dumps())
    wired = wire(dataclasses.replace(settings, jobs_dir=partial))
    try:
        record = asyncio.run(_run(wired, source, endpoint, lines))
    except BucketserveError as exc:
        print(f"bucketserve batch run: {source}: {exc}", file=sys.stderr)
        return 2
    if record.status == "failed":
        for error in (record.object.get("errors") or {}).get("data", []):
            where = f"line {error['line']}: " if error.get("line") else ""
            print(f"{source}: {where}{error['code']}: {error['message']}", file=sys.stderr)
        if not record.progress.done:  # (refused whole: nothing of it to keep or resume)
            shutil.rmtree(partial)
        return 2
    if record.status not in FINAL:
        return 130  # (stopped: the next run goes on)
    store = wired.jobs.store
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


def _claim(partial: Path, this: RunOf, restart: bool) -> None:
    """`partial` left for this run: another run's kept state refused naming how it differs;
    with `restart`, whatever it holds discarded; a leftover of a run that never began
    removed."""
    if restart and partial.exists():
        shutil.rmtree(partial)
    if not partial.exists():
        return
    kept_file = partial / RUN_FILE
    kept = RunOf.loads(kept_file.read_bytes()) if kept_file.is_file() else None
    ran = (partial / "state.sqlite").is_file()
    why = "of an input it did not record" if kept is None else this.differs(kept)
    if why is None:
        return  # (this run's: resumed)
    if not ran:
        shutil.rmtree(partial)
        return
    raise Refused(
        f"{partial} holds an unfinished run {why}: rerun with --restart to discard it and "
        "start afresh, or give another --out"
    )


async def _run(wired: Wired, source: Path, endpoint: str, lines: list[bytes]) -> BatchRecord:
    """The batch run to its end, its progress shown; an earlier run's, if one was cut short."""
    jobs = wired.jobs
    async with running(wired.engine, wired.control, wired.metrics, jobs):
        kept = jobs.batches("") if jobs.store.has_state else []
        if kept:
            record = kept[0]  # (an earlier run's, resumed by `running`)
        else:
            written = jobs.upload_path("")
            written.write_bytes(b"".join(line + b"\n" for line in lines))
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

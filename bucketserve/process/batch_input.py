"""What `bucketserve batch run` is given, checked before any model loads: the input file, and
where its answers go (`paths`), the input read into the Batch API's request lines (`read`),
the models those lines and `--model` name (`check_models`, against the repository's configs:
nothing is built), and what a run is of (`RunOf`: the input's digest, the endpoint, the model,
the column), kept beside its state so that a later run never resumes another's.

Every refusal is a `Refused`: one line for the user, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from bucketserve.errors import ConfigError
from bucketserve.loading.loader import served_names
from bucketserve.loading.repository import load_repository
from bucketserve.settings import Settings

TEXT_ENDPOINTS = ("/v1/embeddings", "/embeddings")  # (what a text alone is a request to)
CHUNK = 1 << 20


class Refused(Exception):
    """The run refused before any work, with why (one line)."""


@dataclass(frozen=True)
class RunOf:
    """What a run answers: its state (`OUT.partial/`) is another run's unless all are equal."""

    digest: str  # the input file's bytes (sha256)
    endpoint: str
    model: str | None
    column: str | None  # (parquet only)

    def differs(self, other: RunOf) -> str | None:
        """How `other` (the kept run) differs, in words; None when it is this run."""
        if other.digest != self.digest:
            return "of another input (its bytes differ from this one's)"
        if other.model != self.model:
            return f"for another model ({_named(other.model)}, not {_named(self.model)})"
        if other.endpoint != self.endpoint:
            return f"of another endpoint ({other.endpoint}, not {self.endpoint})"
        if other.column != self.column:
            return f"of another column ({other.column!r}, not {self.column!r})"
        return None

    def dumps(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def loads(cls, raw: bytes) -> RunOf | None:
        try:
            return cls(**json.loads(raw))
        except (ValueError, TypeError):
            return None


def _named(model: str | None) -> str:
    return "the default model" if model is None else repr(model)


def paths(source: Path, out: Path, errors: Path, partial: Path) -> None:
    """The input a readable file, and none of the run's outputs the input itself."""
    if not source.exists():
        raise Refused(f"{source}: no such file")
    if source.is_dir():
        raise Refused(f"{source}: a directory; give the file of requests or texts")
    if not source.is_file():
        raise Refused(f"{source}: not a regular file")
    if out.is_dir():
        raise Refused(f"--out {out}: a directory; give the file the answers go to")
    if not out.parent.is_dir():
        raise Refused(f"--out {out}: no folder {out.parent} to write it in")
    real = source.resolve()
    for given, what in ((out, "--out"), (errors, "the errors file"), (partial, "the run's state")):
        if given.resolve() == real or real.is_relative_to(given.resolve()):
            raise Refused(
                f"{source}: it is also {what} ({given}), which the run writes: give another --out"
            )


def run_of(source: Path, endpoint: str, model: str | None, column: str) -> RunOf:
    digest = hashlib.sha256()
    try:
        with source.open("rb") as file:
            while chunk := file.read(CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise Refused(f"{source}: cannot be read: {exc.strerror}") from None
    parquet = source.suffix == ".parquet"
    return RunOf(digest.hexdigest(), endpoint, model, column if parquet else None)


def read(source: Path, endpoint: str, model: str | None, column: str) -> list[bytes]:
    """The file's requests, as the Batch API's lines (each JSON, without its newline)."""
    if source.suffix == ".jsonl":
        return list(_request_lines(source))
    if endpoint not in TEXT_ENDPOINTS:
        raise Refused(
            f"{source}: texts alone are embedded ({' or '.join(TEXT_ENDPOINTS)}); for "
            f"{endpoint}, write the requests as JSONL"
        )
    texts = _column(source, column) if source.suffix == ".parquet" else _texts(source)
    named = {"model": model} if model is not None else {}
    return [
        orjson.dumps({"custom_id": str(i), "method": "POST", "url": endpoint,
                      "body": {"input": text, **named}})
        for i, text in texts
    ]  # fmt: skip


def _request_lines(source: Path) -> Iterator[bytes]:
    """A JSONL file's non-blank lines, each JSON (else the first that is not, refused)."""
    bad: list[int] = []
    lines: list[bytes] = []
    with source.open("rb") as file:
        for number, raw in enumerate(file, 1):
            if not raw.strip():
                continue
            try:
                orjson.loads(raw)
            except orjson.JSONDecodeError:
                bad.append(number)
                continue
            lines.append(raw.rstrip(b"\r\n"))
    if bad:
        more = f" (and {len(bad) - 1} more lines)" if len(bad) > 1 else ""
        raise Refused(
            f"{source}: line {bad[0]} is not JSON{more}; a .jsonl input holds one request a "
            "line (a file of texts: name it other than .jsonl)"
        )
    yield from lines


def _texts(source: Path) -> list[tuple[int, str]]:
    """A text file's lines, numbered from 1 (blank ones skipped; the others keep their
    numbers): UTF-8, or refused naming where it is not."""
    raw = source.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise Refused(
            f"{source}: not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line}); a file of "
            "texts is read as UTF-8 (convert it, e.g. iconv -f latin1 -t utf-8)"
        ) from None
    if "\0" in text:
        raise Refused(f"{source}: holds NUL bytes: a binary file, not one text a line")
    return [(i, t) for i, t in enumerate(text.splitlines(), 1) if t.strip()]


def _column(source: Path, column: str) -> list[tuple[int, str]]:
    """A parquet file's column of texts, its rows numbered from 1 (empty and null cells
    skipped): refused when the file cannot be read, has no such column, or the column does
    not hold strings."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as parquet
    except ImportError:
        raise Refused(
            f"{source}: reading parquet needs pyarrow: pip install 'bucketserve[parquet]'"
        ) from None
    try:
        schema = parquet.read_schema(source)
    except (pa.ArrowException, OSError) as exc:
        raise Refused(f"{source}: not a readable parquet file: {_first_line(exc)}") from None
    if column not in schema.names:
        raise Refused(
            f"{source}: no column {column!r} (its columns: {', '.join(schema.names)}); name "
            "the texts' column with --column"
        )
    kind = schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        strings = [f.name for f in schema if pa.types.is_string(f.type) or
                   pa.types.is_large_string(f.type)]  # fmt: skip
        raise Refused(
            f"{source}: column {column!r} holds {kind}, not texts (its text columns: "
            f"{', '.join(strings) or 'none'})"
        )
    try:
        cells = parquet.read_table(source, columns=[column]).column(column).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise Refused(f"{source}: not a readable parquet file: {_first_line(exc)}") from None
    return [(i, text) for i, text in enumerate(cells, 1) if text and text.strip()]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def line_models(lines: list[bytes]) -> set[str]:
    """The models the request lines' bodies name."""
    found: set[str] = set()
    for raw in lines:
        request: Any = orjson.loads(raw)
        body = request.get("body") if isinstance(request, dict) else None
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            found.add(body["model"])
    return found


def check_models(settings: Settings, named: set[str]) -> None:
    """Each model `named` is one the repository serves (by name or alias), read from its
    configs alone; else refused naming the ones it serves."""
    if not named:
        return
    try:
        repository = load_repository(
            settings.models, settings.default_model, partial=True, name=settings.model_name
        )
        aliases = served_names(settings.served_model_name, repository.default_model)
    except ConfigError as exc:
        raise Refused(str(exc.message)) from None
    served = set(repository.models) | set(aliases)
    for specs in repository.models.values():
        served |= {alias for spec in specs for alias in spec.config.aliases}
    unknown = sorted(named - served)
    if not unknown:
        return
    unbuilt = next((name for name in unknown if name in repository.unbuilt), None)
    if unbuilt is not None:
        recipe = repository.unbuilt[unbuilt] or unbuilt
        raise Refused(f"model {unbuilt!r} is not built yet: bucketserve models build {recipe}")
    which = ", ".join(repr(name[:64]) for name in unknown[:3])
    raise Refused(f"no model {which} in {settings.models}; it serves {', '.join(sorted(served))}")

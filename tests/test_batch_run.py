"""`bucketserve batch run` refuses before any model loads (fast tier: the command in process,
its loading replaced by a tripwire): every bad input, an `--out` that is its input, a model
the repository does not serve, a kept state of another run; each with one line on stderr and
exit 2, never a traceback. Its `--help` lists its own flags. (Real runs: `test_batches` on
texts and parquet, `test_batch_durable` killed, resumed and restarted.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from bucketserve.process import batch, cli
from bucketserve.process.batch_input import RunOf, run_of


class Loaded(Exception):
    """The run got as far as loading the repository."""


@pytest.fixture(autouse=True)
def tripwire(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the repository raises `Loaded`: a refusal must come before it."""

    def wire(*_: object, **__: object) -> None:
        raise Loaded

    monkeypatch.setattr(batch, "wire", wire)


@pytest.fixture
def models(repository: Callable[..., Path]) -> Path:
    return repository("tiny-encoder", "tiny-lstm")


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """`batch run argv` exits 2 before loading, saying why in one line (returned)."""
    assert cli.main(["batch", "run", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("bucketserve batch run: ")
    assert "Traceback" not in err
    return err


def write_parquet(path: Path, **columns: list[object]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
    return path


@pytest.mark.parametrize(
    ("name", "make", "said"),
    [
        ("missing.txt", None, "no such file"),
        ("folder", lambda p: p.mkdir(), "a directory"),
        ("binary.txt", lambda p: p.write_bytes(bytes(range(256)) * 4), "not UTF-8 text"),
        ("binary.jsonl", lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\0\0"), "line 1 is not JSON"),
        ("zeros.txt", lambda p: p.write_bytes(b"a\0b\n"), "NUL bytes"),
        ("latin1.txt", lambda p: p.write_bytes("café\nthé\n".encode("latin-1")),
         "not UTF-8 text (byte 0xe9 on line 1)"),
        ("lines.jsonl", lambda p: p.write_text('{"custom_id": "a"}\n\nnot json\n{x}\n'),
         "line 3 is not JSON (and 1 more lines)"),
    ],
    ids=["missing", "directory", "binary", "binary-jsonl", "nul", "latin-1", "not-json"],
)  # fmt: skip
def test_a_bad_input_is_one_line_and_exit_2(
    models: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    make: Callable[[Path], object] | None,
    said: str,
) -> None:
    source = tmp_path / name
    if make is not None:
        make(source)
    err = refused(capsys, str(source), "--out", str(tmp_path / "out.jsonl"), "--models",
                  str(models))  # fmt: skip
    assert said in err
    assert str(source) in err
    assert not (tmp_path / "out.jsonl.partial").exists()


def test_a_bad_parquet_input_is_one_line_and_exit_2(
    models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = write_parquet(tmp_path / "t.parquet", body=["a text", "another"], n=[1, 2])
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(table.read_bytes()[: table.stat().st_size // 2])
    out = ("--out", str(tmp_path / "out.jsonl"), "--models", str(models))
    for argv, said in (
        ((str(cut), "--column", "body"), "not a readable parquet file"),
        ((str(table), "--column", "nope"), "no column 'nope' (its columns: body, n)"),
        ((str(table), "--column", "n"), "column 'n' holds int64, not texts (its text columns: "
                                        "body)"),
    ):  # fmt: skip
        assert said in refused(capsys, *argv, *out)


def test_out_that_is_the_input_is_refused_and_the_input_kept(
    models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "texts.jsonl"
    source.write_text('{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", '
                      '"body": {"input": "a"}}\n')  # fmt: skip
    errors = tmp_path / "answers.errors.jsonl"
    errors.write_bytes(source.read_bytes())
    for given, out in (
        (source, source),
        (source, tmp_path / "." / "texts.jsonl"),
        (errors, tmp_path / "answers.jsonl"),  # (OUT.errors.jsonl would be the input)
    ):
        before = given.read_bytes()
        err = refused(capsys, str(given), "--out", str(out), "--models", str(models))
        assert "give another --out" in err
        assert given.read_bytes() == before
    err = refused(capsys, str(source), "--out", str(tmp_path / "no" / "o.jsonl"))
    assert "no folder" in err


def test_a_model_not_served_is_named_with_those_served_before_loading(
    models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("a text\n")
    out = ("--out", str(tmp_path / "out.jsonl"), "--models", str(models))
    err = refused(capsys, str(texts), "--model", "tiny-encodr", *out)
    assert "no model 'tiny-encodr'" in err
    assert "it serves tiny-encoder, tiny-lstm" in err
    lines = tmp_path / "requests.jsonl"
    lines.write_bytes(
        orjson.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
                      "body": {"model": "gpt-embed", "input": "a"}}) + b"\n"
    )  # fmt: skip
    assert "no model 'gpt-embed'" in refused(capsys, str(lines), *out)
    with pytest.raises(Loaded):  # (an alias is a name it serves)
        cli.main(["batch", "run", str(texts), "--model", "enc", *out,
                  "--served-model-name", "enc=tiny-encoder"])  # fmt: skip


def kept_state(partial: Path, of: RunOf | None) -> None:
    """A run's state cut short, as a kill leaves it: recorded as `of` (None: not recorded)."""
    partial.mkdir()
    (partial / "state.sqlite").write_bytes(b"")
    if of is not None:
        (partial / batch.RUN_FILE).write_bytes(of.dumps())


def test_a_kept_state_of_another_run_is_refused_naming_it_or_discarded_with_restart(
    models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "texts.txt"
    source.write_text("one\ntwo\n")
    out, partial = tmp_path / "out.jsonl", tmp_path / "out.jsonl.partial"
    argv = (str(source), "--out", str(out), "--models", str(models), "--model", "tiny-encoder")
    this = run_of(source, "/v1/embeddings", "tiny-encoder", "text")
    others = {
        "of another input": RunOf("0" * 64, this.endpoint, this.model, this.column),
        "for another model ('tiny-lstm', not 'tiny-encoder')": RunOf(
            this.digest, this.endpoint, "tiny-lstm", None
        ),
        "of an input it did not record": None,
    }
    for why, other in others.items():
        kept_state(partial, other)
        err = refused(capsys, *argv)
        assert f"{partial} holds an unfinished run {why}" in err
        assert "--restart" in err
        assert (partial / "state.sqlite").is_file()  # (refused: kept as it was)
        with pytest.raises(Loaded):
            cli.main(["batch", "run", *argv, "--restart"])
        assert not (partial / "state.sqlite").exists()  # (discarded; this run's begun)
        assert RunOf.loads((partial / batch.RUN_FILE).read_bytes()) == this
        for left in partial.iterdir():
            left.unlink()
        partial.rmdir()
    kept_state(partial, this)  # (this run's own: resumed, not refused)
    with pytest.raises(Loaded):
        cli.main(["batch", "run", *argv])
    assert (partial / "state.sqlite").is_file()


def test_batch_run_help_lists_its_own_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["batch", "run", "--help"])
    shown = capsys.readouterr().out
    for flag in ("--out", "--endpoint", "--model ", "--column", "--restart", "--models",
                 "--default-model", "--served-model-name", "--intra-op-threads"):  # fmt: skip
        assert flag in shown
    for flag in ("--port", "--grpc-port", "--api-key", "--max-connections", "--model-control",
                 "--jobs-dir", "--tenant-header", "--docs"):  # fmt: skip
        assert flag not in shown
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    assert "--max-connections" in capsys.readouterr().out

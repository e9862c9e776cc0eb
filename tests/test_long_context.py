"""Long contexts in a memory budget, end to end: a ModernBERT embedder at its real 8,192 tokens
and a Qwen3-Embedding-shaped decoder at its real 32,768, tiny and made here, saved by
sentence-transformers as their releases are laid out and imported by the command as a user
runs it; then served by a server process under a memory budget several times smaller than
the worst batch, 16 clients sending texts from 1 token to past the longest: nothing lost,
every answer the reference library's on that text alone, the long ones that cannot fit
refused (413) before they run, the short ones answered while long ones run, the server alive
and its memory under the budget throughout. Once more with an address-space limit as the
hard wall (a batch the budget let through that did not fit would fail there, not pass), and
once in a memory cgroup, as a container runs it: the budget read from its limit, which the
kernel enforces by killing."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from loadtest.long_context import (
    SHORT,
    Answered,
    beside_long,
    counted_tokens,
    imported,
    mixed_lengths,
    mixed_load,
    pss,
    pss_sampled,
    texts_of,
)
from loadtest.process import running_server
from loadtest.scheduling_bench import metric, scrape
from modelgen.long_context import MODERNBERT_CONTEXT, QWEN3_CONTEXT, reference

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

MIB = 2**20
BUDGET = 600 * MIB  # the worst batch (one sequence of 8,192 tokens) needs ~2.4 GiB: 4x more
TOLERANCE = 1e-5
CLIENTS = 16
WALL_SLACK = 256 * MIB  # the address space past idle + budget: the request path's own


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The ModernBERT saved by sentence-transformers, imported whole (8,192 tokens: the
    machine's memory holds its worst batch), and the reference."""
    pytest.importorskip("torch")
    from modelgen.long_context import modernbert as made

    root = tmp_path_factory.mktemp("long")
    embedder = made(root)
    models = root / "models"
    said = imported(root / "modernbert", models)
    assert f"max_length = {MODERNBERT_CONTEXT}" in said
    return {"root": root, "models": models, "embedder": embedder}


def load(seed: int = 0) -> tuple[list[str], list[int]]:
    """100 texts: half short (queries), half spread to past the context, and the ends."""
    lengths = [1, 2, MODERNBERT_CONTEXT, MODERNBERT_CONTEXT + 900]
    lengths += mixed_lengths(96, MODERNBERT_CONTEXT, seed)
    return texts_of(lengths, seed), lengths


def warm(url: str, models: Path) -> None:
    """Every thread the load will use started (16 clients of middling texts at once), so that
    the idle figures read after it hold them."""
    texts = texts_of([500 + 100 * i for i in range(16)], 99)
    tokens = counted_tokens(models / "modernbert" / "1" / "tokenizer.json", texts, 8192)
    answered = mixed_load(url, "modernbert", texts, tokens, CLIENTS)
    assert {a.status for a in answered} <= {200, 413}


def checked(
    answered: list[Answered], texts: list[str], longest: int, embedder: Any
) -> dict[str, int]:
    """Every request answered 200 or 413; a 413 exactly where one sequence would not fit, and
    saying so; every 200 the reference's vector of its text alone. The counts."""
    assert len(answered) == len(texts)
    statuses = {a.status for a in answered}
    assert statuses <= {200, 413}, [a.error for a in answered if a.status not in (200, 413)]
    for a in answered:
        if a.status == 413:
            assert a.tokens > longest, a
            assert f"the longest model modernbert runs here is {longest}" in str(a.error)
        else:
            assert a.tokens <= longest
            want = reference(embedder, texts[a.index])
            assert np.abs(np.asarray(a.vector) - want).max() <= TOLERANCE, a.index
    return {
        "answered": sum(a.status == 200 for a in answered),
        "refused": sum(a.status == 413 for a in answered),
        "long_answered": sum(a.status == 200 and a.tokens > 2048 for a in answered),
    }


def vm_size(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize")


def test_a_long_context_model_under_a_small_budget_loses_nothing(
    modernbert: dict[str, Any],
) -> None:
    models, embedder = modernbert["models"], modernbert["embedder"]
    texts, _ = load()
    tokens = counted_tokens(models / "modernbert" / "1" / "tokenizer.json", texts, 8192)
    flags = ("--memory-budget", f"{BUDGET}", "--request-timeout-ms", "600000")
    log = modernbert["root"] / "server-budget.log"
    with running_server(models, *flags, log_path=log) as (process, url):
        memory = httpx.get(f"{url}/v2/models/modernbert/config", timeout=30).json()["memory"]
        longest = memory["longest"]
        assert 2048 < longest < MODERNBERT_CONTEXT  # (cut where one sequence stops fitting)
        assert memory["cut_from"] == MODERNBERT_CONTEXT
        assert memory["budget_bytes"] == BUDGET
        warm(url, models)
        idle = pss(process.pid)
        with pss_sampled(process.pid) as samples:
            answered = mixed_load(url, "modernbert", texts, tokens, CLIENTS)
        counts = checked(answered, texts, longest, embedder)
        assert counts["refused"] > 0
        assert counts["long_answered"] > 0
        beside = beside_long(answered)
        assert beside, "no short text was answered while a long one ran"
        assert max(samples) - idle <= BUDGET
        page = scrape(url)
        assert metric(page, "bucketserve_memory_running_peak_bytes") <= BUDGET
        assert metric(page, "bucketserve_memory_budget_bytes") == BUDGET
        assert process.poll() is None
        assert httpx.get(f"{url}/v2/health/ready", timeout=30).status_code == 200


def test_the_same_load_behind_an_address_space_wall(modernbert: dict[str, Any]) -> None:
    """RLIMIT_AS at the server's idle address space (read from a first run) plus the budget
    and a little for the request path: two long batches at once would not fit in it."""
    models, embedder = modernbert["models"], modernbert["embedder"]
    texts, _ = load(seed=1)
    tokens = counted_tokens(models / "modernbert" / "1" / "tokenizer.json", texts, 8192)
    flags = ("--memory-budget", f"{BUDGET}", "--request-timeout-ms", "600000")
    env = {"MALLOC_ARENA_MAX": "2"}  # (glibc's arenas each reserve 64 MiB of address space)
    root = modernbert["root"]
    with running_server(models, *flags, log_path=root / "idle.log", env=env) as (process, url):
        warm(url, models)
        wall = vm_size(process.pid) + BUDGET + WALL_SLACK
    log = root / "server-wall.log"
    with running_server(models, *flags, log_path=log, env=env, address_space=wall) as (
        process,
        url,
    ):
        longest = httpx.get(f"{url}/v2/models/modernbert/config", timeout=30).json()["memory"][
            "longest"
        ]
        warm(url, models)
        answered = mixed_load(url, "modernbert", texts, tokens, CLIENTS)
        counts = checked(answered, texts, longest, embedder)
        assert counts["refused"] > 0
        assert counts["long_answered"] > 0
        assert vm_size(process.pid) <= wall
        assert process.poll() is None
        assert httpx.get(f"{url}/v2/health/ready", timeout=30).status_code == 200


def test_a_decoder_at_its_real_context_is_imported_at_what_the_budget_allows(
    tmp_path: Path,
) -> None:
    """Qwen3-Embedding's 32,768 tokens, as released (no length written by hand): one text
    that long needs tens of GiB; imported in 1 GiB at the longest that fits, said with the
    fix, then served there, each answer the reference's at that length."""
    pytest.importorskip("torch")
    from modelgen.long_context import qwen3_embedding

    embedder = qwen3_embedding(tmp_path)
    models = tmp_path / "models"
    said = imported(tmp_path / "qwen3", models, "--memory-budget", "1GiB")
    found = said.split("imported at ", 1)[1].split(" tokens", 1)[0]
    longest = int(found)
    assert 2048 < longest < QWEN3_CONTEXT
    assert f"the model takes {QWEN3_CONTEXT} tokens" in said
    assert "--memory-budget" in said
    assert f"max_length = {longest}" in said
    embedder.max_seq_length = longest  # (the reference, at the length served)
    lengths = [1, 5, SHORT, 1500, longest - 10, longest + 500, QWEN3_CONTEXT + 100]
    texts = texts_of(lengths, 5)
    with running_server(models, "--memory-budget", "1GiB", log_path=tmp_path / "server.log") as (
        _,
        url,
    ):
        memory = httpx.get(f"{url}/v2/models/qwen3/config", timeout=30).json()["memory"]
        assert memory["longest"] == longest
        for text in texts:
            answer = httpx.post(
                f"{url}/v1/embeddings", json={"model": "qwen3", "input": text}, timeout=300
            )
            assert answer.status_code == 200, answer.text
            got = np.asarray(answer.json()["data"][0]["embedding"])
            assert np.abs(got - reference(embedder, text)).max() <= TOLERANCE
            assert answer.json()["usage"]["prompt_tokens"] <= longest


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[Path]:
    """A cgroup of this process's own under its memory controller (v1's
    `memory.limit_in_bytes`, or v2's `memory.max`), limited to `limit` bytes: what a
    container's memory limit is. Skipped where it cannot be made (not root, no writable
    controller); removed afterwards."""
    from bucketserve.runtime.memory import CGROUP

    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            parent, limit_file = CGROUP / "memory" / path.lstrip("/"), "memory.limit_in_bytes"
            break
    else:
        parent, limit_file = CGROUP / path.lstrip("/"), "memory.max"
    folder = parent / f"bucketserve-test-{os.getpid()}"
    try:
        folder.mkdir()
        (folder / limit_file).write_text(str(limit))
    except OSError as exc:
        pytest.skip(f"no memory cgroup can be made here ({exc.strerror}): {folder}")
    try:
        yield folder
    finally:
        for _ in range(50):  # (its processes gone, it can be removed)
            with contextlib.suppress(OSError):
                folder.rmdir()
                break
            time.sleep(0.1)


def test_a_containers_memory_limit_is_the_budget(modernbert: dict[str, Any]) -> None:
    """No --memory-budget: in a cgroup limited to 2 GiB (a container's limit, which the
    kernel enforces by killing), the budget is read from it, the model's buckets cut to
    what fits, and the mixed load answered with nothing lost and no kill."""
    models, embedder = modernbert["models"], modernbert["embedder"]
    texts, _ = load(seed=2)
    tokens = counted_tokens(models / "modernbert" / "1" / "tokenizer.json", texts, 8192)
    limit = 2 * 2**30
    log = modernbert["root"] / "server-cgroup.log"
    with (
        memory_cgroup(limit) as cgroup,
        running_server(models, "--request-timeout-ms", "600000", log_path=log, cgroup=cgroup) as (
            process,
            url,
        ),
    ):
        memory = httpx.get(f"{url}/v2/models/modernbert/config", timeout=30).json()["memory"]
        assert 0 < memory["budget_bytes"] < limit
        assert memory["longest"] < MODERNBERT_CONTEXT
        said = log.read_text()
        assert "memory.limit_in_bytes" in said or "memory.max" in said
        warm(url, models)
        answered = mixed_load(url, "modernbert", texts, tokens, CLIENTS)
        counts = checked(answered, texts, memory["longest"], embedder)
        assert counts["refused"] > 0
        assert counts["long_answered"] > 0
        assert process.poll() is None
        assert httpx.get(f"{url}/v2/health/ready", timeout=30).status_code == 200

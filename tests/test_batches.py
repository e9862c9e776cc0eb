"""OpenAI's Files and Batch API through the `openai` SDK unchanged (in process; the kill test
over a real process is in `test_batch_durable`): upload, create, poll, the output read back
line by line against the same requests sent online, every refusal of a file as OpenAI
refuses it, cancel, list, quotas per key, a stopped batch resumed exactly once, a job that
cannot go on failed with its reason; and `bucketserve batch run` on texts and a parquet
column. (That bulk work waits behind every level: `test_queues`.)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest

from bucketserve.loading import load_engine
from bucketserve.settings import Settings
from tests.engines import serving
from tests.exports import texts

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.timeout(300)

FINAL = ("completed", "failed", "cancelled", "expired")
KEYS = {"alice": "sk-alice-0123456789", "bob": "sk-bob-0123456789"}


@pytest.fixture
def models(repository: Callable[..., Path]) -> Path:
    return repository("st")


def settings_of(models: Path, jobs: Path, **more: Any) -> Settings:
    return Settings(models=models, jobs_dir=jobs, result_cache_mb=0, **more)


@pytest.fixture
async def served(models: Path, tmp_path: Path) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    async with serving(load_engine(settings_of(models, tmp_path / "jobs"))) as client:
        yield sdk_of(client), client


def sdk_of(client: httpx.AsyncClient, key: str = "unused") -> Any:
    return openai.AsyncOpenAI(
        base_url="http://test/v1", api_key=key, http_client=client, max_retries=0
    )


def request_line(custom_id: str, body: dict[str, Any], url: str = "/v1/embeddings") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


async def ran(sdk: Any, lines: list[str], endpoint: str = "/v1/embeddings") -> Any:
    """The batch of `lines`, uploaded, created and polled to its end."""
    given = await sdk.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
    batch = await sdk.batches.create(
        input_file_id=given.id, endpoint=endpoint, completion_window="24h"
    )
    return await ended(sdk, batch.id)


async def ended(sdk: Any, batch_id: str) -> Any:
    for _ in range(6000):
        batch = await sdk.batches.retrieve(batch_id)
        if batch.status in FINAL:
            return batch
        await asyncio.sleep(0.02)
    raise AssertionError(f"batch {batch_id} never ended")


async def lines_of(sdk: Any, file_id: str | None) -> dict[str, dict[str, Any]]:
    """A result file's lines by custom_id (each exactly once)."""
    if file_id is None:
        return {}
    raw = (await sdk.files.content(file_id)).text.splitlines()
    found = [json.loads(line) for line in raw]
    by_id = {line["custom_id"]: line for line in found}
    assert len(by_id) == len(found), "a custom_id answered twice"
    return by_id


def vector(item: dict[str, Any]) -> np.ndarray:
    embedding = item["embedding"]
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), "<f4")
    return np.asarray(embedding, np.float32)


def assert_same_answer(got: dict[str, Any], online: dict[str, Any]) -> None:
    """A batch line's body against the same request's online answer: the same fields, the
    vectors within float noise (their batches were composed otherwise)."""
    assert got.keys() == online.keys()
    for key, value in online.items():
        if key == "data":
            for a, b in zip(got[key], value, strict=True):
                assert {k: v for k, v in a.items() if k != "embedding"} == {
                    k: v for k, v in b.items() if k != "embedding"
                }
                np.testing.assert_allclose(vector(a), vector(b), atol=1e-6)
        else:
            assert got[key] == value, key


async def test_a_batch_through_the_sdk_answers_each_line_as_online(served: Any) -> None:
    sdk, client = served
    batch = texts(300, seed=21)
    bodies = {f"t{i}": {"model": "st", "input": text} for i, text in enumerate(batch)}
    bodies |= {f"list{i}": {"model": "st", "input": batch[i : i + 5]} for i in range(0, 60, 5)}
    bodies["ids"] = {"model": "st", "input": "a", "encoding_format": "base64"}
    done = await ran(sdk, [request_line(k, v) for k, v in bodies.items()])
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed) == (len(bodies), len(bodies))
    assert done.request_counts.failed == 0
    assert done.error_file_id is None
    assert None not in (done.in_progress_at, done.finalizing_at, done.completed_at)
    answers = await lines_of(sdk, done.output_file_id)
    assert answers.keys() == bodies.keys()
    for custom_id, body in bodies.items():
        line = answers[custom_id]
        assert line["id"].startswith("batch_req_")
        assert line["error"] is None
        assert line["response"]["status_code"] == 200
        online = (await client.post("/v1/embeddings", json=body)).json()
        assert_same_answer(line["response"]["body"], online)
    listed = [f.id for f in (await sdk.files.list()).data]
    assert {done.output_file_id, done.input_file_id} <= set(listed)
    output = await sdk.files.retrieve(done.output_file_id)
    assert (output.purpose, output.filename) == ("batch_output", f"{done.id}_output.jsonl")
    assert [b.id for b in (await sdk.batches.list()).data] == [done.id]
    metrics = (await client.get("/metrics")).text
    assert 'bucketserve_jobs{status="completed"} 1.0' in metrics
    assert f'bucketserve_job_lines_total{{outcome="completed"}} {len(bodies)}.0' in metrics
    assert 'bucketserve_requests_total{route="/v1/embeddings",status="200"}' in metrics
    assert f'route="/v1/embeddings",status="200"}} {len(bodies)}.0' in metrics  # (online only)


async def test_each_line_and_the_batch_say_which_content_answered(served: Any) -> None:
    """A kept answer needs its fingerprint (`docs/versions.md`): each answered line carries
    the one the route sent online in X-Model-Fingerprint, and the batch object lists every
    one that answered its lines; a line refused before any model ran carries none."""
    sdk, client = served
    online = await client.post("/v1/embeddings", json={"model": "st", "input": "a"})
    want = online.headers["X-Model-Fingerprint"]
    lines = [request_line(f"f{i}", {"model": "st", "input": t}) for i, t in enumerate(texts(40))]
    done = await ran(sdk, [*lines, request_line("empty", {"model": "st", "input": ""})])
    assert done.status == "completed", done
    assert done.to_dict()["fingerprints"] == [want]
    answered = await lines_of(sdk, done.output_file_id)
    assert {line["response"]["fingerprint"] for line in answered.values()} == {want}
    refused = (await lines_of(sdk, done.error_file_id))["empty"]["response"]
    assert refused["status_code"] == 422
    assert refused["fingerprint"] is None


async def test_a_task_route_batch_answers_as_its_route(served: Any) -> None:
    """TEI's /embed, with its own body, line by line as online."""
    sdk, client = served
    bodies = {f"e{i}": {"inputs": text} for i, text in enumerate(texts(40, seed=5))}
    done = await ran(sdk, [request_line(k, v, "/embed") for k, v in bodies.items()], "/embed")
    assert done.status == "completed"
    answers = await lines_of(sdk, done.output_file_id)
    for custom_id, body in bodies.items():
        online = (await client.post("/embed", json=body)).json()
        got = answers[custom_id]["response"]["body"]
        np.testing.assert_allclose(got, online, atol=1e-6)


async def test_a_line_its_route_refuses_is_in_the_error_file(served: Any) -> None:
    sdk, client = served
    bad = {"model": "st", "input": ""}
    lines = [request_line("good", {"model": "st", "input": "fine"}), request_line("bad", bad)]
    done = await ran(sdk, lines)
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    errors = await lines_of(sdk, done.error_file_id)
    online = await client.post("/v1/embeddings", json=bad)
    assert errors["bad"]["response"]["status_code"] == online.status_code == 422
    assert errors["bad"]["response"]["body"] == online.json()
    assert (await lines_of(sdk, done.output_file_id)).keys() == {"good"}


async def test_a_file_openai_refuses_fails_the_batch_naming_each_line(served: Any) -> None:
    sdk, _ = served
    good = {"model": "st", "input": "fine"}
    lines = [
        request_line("1", good),
        "{not json",
        json.dumps({"method": "POST", "url": "/v1/embeddings", "body": good}),
        request_line("4", good),
        request_line("4", good),
        request_line("6", good, "/v1/chat/completions"),
        request_line("7", {"model": "gpt-9", "input": "x"}),
        json.dumps({"custom_id": "8", "method": "GET", "url": "/v1/embeddings", "body": good}),
        json.dumps({"custom_id": "9", "method": "POST", "url": "/v1/embeddings", "body": "x"}),
    ]
    done = await ran(sdk, lines)
    assert done.status == "failed"
    assert done.failed_at is not None
    assert (done.output_file_id, done.error_file_id) == (None, None)
    found = [(e.code, e.line, e.param) for e in done.errors.data]
    assert found == [
        ("invalid_json_line", 2, None),
        ("missing_required_parameter", 3, "custom_id"),
        ("duplicate_custom_id", 5, "custom_id"),
        ("url_mismatch", 6, "url"),
        ("model_not_found", 7, "body.model"),
        ("invalid_method", 8, "method"),
        ("missing_required_parameter", 9, "body"),
    ]
    assert "'4'" in done.errors.data[2].message
    two = await ran(sdk, [request_line("a", good), request_line("b", {"input": "no model"})])
    assert [e.code for e in two.errors.data] == ["model_mismatch"]


async def test_creating_or_reading_is_refused_in_openais_form(served: Any) -> None:
    sdk, _ = served
    with pytest.raises(openai.NotFoundError, match="No such File object"):
        await sdk.batches.create(
            input_file_id="file-nope", endpoint="/v1/embeddings", completion_window="24h"
        )
    given = await sdk.files.create(file=("in.jsonl", b"{}\n"), purpose="batch")
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        await sdk.batches.create(
            input_file_id=given.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert refused.value.body["param"] == "endpoint"
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        await sdk.batches.create(
            input_file_id=given.id, endpoint="/v1/embeddings", completion_window="1h"
        )
    with pytest.raises(openai.UnprocessableEntityError, match="purpose"):
        await sdk.files.create(file=("in.jsonl", b"{}\n"), purpose="fine-tune")
    create = {"input_file_id": given.id, "endpoint": "/v1/embeddings", "completion_window": "24h"}
    for metadata, said in (  # (OpenAI's limits: 16 pairs, keys of 64 characters, values of 512)
        ({f"k{i}": "v" for i in range(17)}, "metadata: Dictionary should have at most 16"),
        ({"k" * 65: "v"}, "String should have at most 64 characters"),
        ({"k": "v" * 513}, "String should have at most 512 characters"),
    ):
        with pytest.raises(openai.BadRequestError, match=said):
            await sdk.batches.create(**create, metadata=metadata)
    most = {"k" * 64 if i == 0 else f"k{i}": "v" * 512 for i in range(16)}
    kept = await sdk.batches.create(**create, metadata=most)
    assert kept.metadata == most
    await sdk.batches.cancel(kept.id)
    await ended(sdk, kept.id)  # (its file is deleted below: not while a batch reads it)
    with pytest.raises(openai.NotFoundError):
        await sdk.batches.retrieve("batch_nope")
    deleted = await sdk.files.delete(given.id)
    assert (deleted.id, deleted.deleted) == (given.id, True)
    with pytest.raises(openai.NotFoundError):
        await sdk.files.retrieve(given.id)


async def test_cancel_stops_sending_and_keeps_what_was_answered(served: Any) -> None:
    sdk, _ = served
    batch = texts(3000, seed=8)
    lines = [request_line(f"c{i}", {"model": "st", "input": t}) for i, t in enumerate(batch)]
    given = await sdk.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
    batch = await sdk.batches.create(
        input_file_id=given.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    while (await sdk.batches.retrieve(batch.id)).status == "validating":
        await asyncio.sleep(0.01)
    cancelling = await sdk.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    assert cancelling.cancelling_at is not None
    done = await ended(sdk, batch.id)
    assert done.status == "cancelled"
    assert done.cancelled_at is not None
    answered = await lines_of(sdk, done.output_file_id)
    assert len(answered) == done.request_counts.completed < 3000
    assert (await sdk.batches.cancel(batch.id)).status == "cancelled"  # (ended: as it is)


async def test_each_key_sees_its_own_files_and_keeps_its_quota(
    models: Path, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("".join(f"{name} {key}\n" for name, key in KEYS.items()))
    settings = settings_of(models, tmp_path / "jobs", api_key_file=keys, max_files=2, max_jobs=1)
    async with serving(load_engine(settings)) as client:
        alice, bob = sdk_of(client, KEYS["alice"]), sdk_of(client, KEYS["bob"])
        lines = "\n".join(request_line(str(i), {"input": t}) for i, t in enumerate(texts(3000, 3)))
        mine = await alice.files.create(file=("in.jsonl", lines.encode()), purpose="batch")
        with pytest.raises(openai.NotFoundError):
            await bob.files.retrieve(mine.id)
        assert [f.id for f in (await bob.files.list()).data] == []
        first = await alice.batches.create(
            input_file_id=mine.id, endpoint="/v1/embeddings", completion_window="24h"
        )
        with pytest.raises(openai.RateLimitError, match="unfinished batches"):
            await alice.batches.create(
                input_file_id=mine.id, endpoint="/v1/embeddings", completion_window="24h"
            )
        with pytest.raises(openai.NotFoundError):
            await bob.batches.retrieve(first.id)
        await alice.files.create(file=("b.jsonl", lines.encode()), purpose="batch")
        with pytest.raises(openai.RateLimitError, match="keeps 2 files"):
            await alice.files.create(file=("c.jsonl", lines.encode()), purpose="batch")
        done = await ended(alice, first.id)
        assert (done.status, done.request_counts.completed) == ("completed", 3000)
        anonymous = await client.get("/v1/batches")
        assert anonymous.status_code == 401


OLD_KEY, NEW_KEY = "sk-old-0123456789", "sk-new-0123456789"


@pytest.mark.parametrize("name", ["", "search"])
async def test_a_rotated_key_keeps_its_tenants_files_and_batches(
    models: Path, tmp_path: Path, name: str
) -> None:
    """The rotation the docs describe (the new key added to the key file, then the old one
    removed): what the old key made is its tenant's, so the new key has it; a named key or
    an unnamed one."""
    keys, jobs = tmp_path / "keys", tmp_path / "jobs"
    named = f"{name} " if name else ""
    made = {}
    for lines, key in (([OLD_KEY], OLD_KEY), ([NEW_KEY, OLD_KEY], NEW_KEY), ([NEW_KEY], NEW_KEY)):
        keys.write_text("".join(f"{named}{line}\n" for line in lines))
        settings = settings_of(models, jobs, api_key_file=keys)
        async with serving(load_engine(settings)) as client:
            sdk = sdk_of(client, key)
            if not made:
                made["batch"] = await ran(sdk, [request_line("1", {"input": "a"})])
            batch = made["batch"]
            assert (await sdk.batches.retrieve(batch.id)).status == "completed"
            assert [b.id for b in (await sdk.batches.list()).data] == [batch.id]
            listed = {f.id for f in (await sdk.files.list()).data}
            assert {batch.input_file_id, batch.output_file_id} <= listed
            assert (await sdk.files.content(batch.output_file_id)).text.count("\n") == 1


def as_tenant(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS['alice']}", "X-Tenant": tenant}


async def test_tenants_a_gateway_names_are_compared_whole(models: Path, tmp_path: Path) -> None:
    """Two tenants behind a gateway whose names share their first 128 characters are two
    tenants; a name past the longest taken is refused, never cut to another's."""
    settings = settings_of(
        models, tmp_path / "jobs", api_key=KEYS["alice"], tenant_header="X-Tenant"
    )
    first, second = "t" * 128 + "-first", "t" * 128 + "-second"
    upload = {"file": ("in.jsonl", request_line("1", {"input": "a"}).encode())}
    async with serving(load_engine(settings)) as client:
        made = await client.post(
            "/v1/files", files=upload, data={"purpose": "batch"}, headers=as_tenant(first)
        )
        assert made.status_code == 200, made.text
        file_id = made.json()["id"]
        assert (await client.get(f"/v1/files/{file_id}", headers=as_tenant(first))).is_success
        other = await client.get(f"/v1/files/{file_id}", headers=as_tenant(second))
        assert other.status_code == 404
        listed = await client.get("/v1/files", headers=as_tenant(second))
        assert listed.json()["data"] == []
        too_long = await client.get("/v1/files", headers=as_tenant("t" * 1000))
        assert too_long.status_code == 400
        assert "X-Tenant" in too_long.json()["error"]["message"]


async def test_a_key_cannot_reach_another_keys_tenant_by_naming_it(
    models: Path, tmp_path: Path
) -> None:
    """Behind --tenant-header, a key names a tenant only where its line says it is a
    gateway's; and no key, a gateway's included, names the tenant of another key."""
    keys = tmp_path / "keys"
    keys.write_text(
        "".join(f"{name} {key}\n" for name, key in KEYS.items())
        + "edge sk-edge-0123456789 gateway\n"
    )
    settings = settings_of(models, tmp_path / "jobs", api_key_file=keys, tenant_header="X-Tenant")
    async with serving(load_engine(settings)) as client:
        alice = sdk_of(client, KEYS["alice"])
        mine = await alice.files.create(file=("in.jsonl", b"{}\n"), purpose="batch")
        batch = await alice.batches.create(
            input_file_id=mine.id, endpoint="/v1/embeddings", completion_window="24h"
        )
        bob = {"Authorization": f"Bearer {KEYS['bob']}", "X-Tenant": "alice"}
        edge = {"Authorization": "Bearer sk-edge-0123456789", "X-Tenant": "alice"}
        for headers in (bob, edge):
            for method, path in (
                ("GET", f"/v1/files/{mine.id}"),
                ("GET", f"/v1/files/{mine.id}/content"),
                ("GET", f"/v1/batches/{batch.id}"),
                ("POST", f"/v1/batches/{batch.id}/cancel"),
                ("DELETE", f"/v1/files/{mine.id}"),
            ):
                refused = await client.request(method, path, headers=headers)
                assert refused.status_code == 403, (headers, path, refused.text)
            answer = await client.post("/v1/embeddings", json={"input": "a"}, headers=headers)
            assert answer.status_code == 403
        # the gateway names tenants of its own; a key may name its own tenant
        carol = {"Authorization": "Bearer sk-edge-0123456789", "X-Tenant": "carol"}
        assert (await client.get(f"/v1/batches/{batch.id}", headers=carol)).status_code == 404
        assert (await client.get("/v1/files", headers=carol)).json()["data"] == []
        own = {"Authorization": f"Bearer {KEYS['alice']}", "X-Tenant": "alice"}
        assert (await client.get(f"/v1/batches/{batch.id}", headers=own)).status_code == 200
        assert (await ended(alice, batch.id)).status in FINAL


async def test_uploads_at_once_keep_the_quota_exact(models: Path, tmp_path: Path) -> None:
    """Ten uploads sent together with two slots left under --max-files: two kept, eight
    refused with 429, and the tenant keeps exactly its quota."""
    settings = settings_of(models, tmp_path / "jobs", api_key=KEYS["alice"], max_files=12)
    line = request_line("1", {"input": "a"}).encode()
    async with serving(load_engine(settings)) as client:
        sdk = sdk_of(client, KEYS["alice"])
        for i in range(10):
            await sdk.files.create(file=(f"{i}.jsonl", line), purpose="batch")
        answers = await asyncio.gather(
            *(
                sdk.files.create(file=(f"more-{i}.jsonl", line * 2000), purpose="batch")
                for i in range(10)
            ),
            return_exceptions=True,
        )
        refused = [a for a in answers if isinstance(a, openai.RateLimitError)]
        assert (len(answers) - len(refused), len(refused)) == (2, 8), answers
        assert len((await sdk.files.list()).data) == 12


async def test_a_stopped_batch_goes_on_from_its_checkpoint_exactly_once(
    models: Path, tmp_path: Path
) -> None:
    """The server stops (the drain) mid-batch; started again on the same jobs directory, the
    batch goes on where its last checkpoint stands: every line answered once, as online."""
    bodies = {f"s{i}": {"model": "st", "input": t} for i, t in enumerate(texts(4000, seed=9))}
    lines = [request_line(k, v) for k, v in bodies.items()]
    jobs = tmp_path / "jobs"
    async with serving(load_engine(settings_of(models, jobs))) as client:
        sdk = sdk_of(client)
        given = await sdk.files.create(
            file=("in.jsonl", "\n".join(lines).encode()), purpose="batch"
        )
        batch = await sdk.batches.create(
            input_file_id=given.id, endpoint="/v1/embeddings", completion_window="24h"
        )
        while (await sdk.batches.retrieve(batch.id)).request_counts.completed < 500:
            await asyncio.sleep(0.01)
    async with serving(load_engine(settings_of(models, jobs))) as client:
        sdk = sdk_of(client)
        stopped = await sdk.batches.retrieve(batch.id)
        assert stopped.status == "in_progress"
        assert 500 <= stopped.request_counts.completed < 4000
        done = await ended(sdk, batch.id)
        assert (done.status, done.request_counts.completed) == ("completed", 4000)
        answers = await lines_of(sdk, done.output_file_id)
        assert answers.keys() == bodies.keys()
        for custom_id in list(bodies)[::97]:
            online = (await client.post("/v1/embeddings", json=bodies[custom_id])).json()
            assert_same_answer(answers[custom_id]["response"]["body"], online)


def test_batch_run_embeds_texts_and_a_parquet_column(
    models: Path, tmp_path: Path, repository: Callable[..., Path]
) -> None:
    """`bucketserve batch run` as a user runs it: a file of texts, a parquet column; every
    line answered once, equal to the same text embedded by the server."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    given = texts(500, seed=17)
    plain = tmp_path / "texts.txt"
    plain.write_text("\n".join(given[:250]) + "\n\n" + "\n".join(given[250:]))
    table = tmp_path / "texts.parquet"
    pq.write_table(pa.table({"body": given}), table)
    outputs = {}
    for source, extra in ((plain, []), (table, ["--column", "body"])):
        out = tmp_path / f"{source.suffix[1:]}.jsonl"
        command = [sys.executable, "-m", "bucketserve", "batch", "run", str(source), "--out",
                   str(out), "--models", str(models), "--model", "st", *extra]  # fmt: skip
        finished = subprocess.run(command, capture_output=True, text=True, timeout=240)
        assert finished.returncode == 0, finished.stderr[-2000:]
        assert "500 answered" in finished.stderr
        assert not out.with_name(out.name + ".partial").exists()
        outputs[source.suffix] = {
            line["custom_id"]: line for line in map(json.loads, out.read_text().splitlines())
        }
    assert len(outputs[".txt"]) == len(outputs[".parquet"]) == 500
    assert {"250", "252", "501"} <= outputs[".txt"].keys()  # (its line numbers)
    assert "251" not in outputs[".txt"]
    engine = load_engine(Settings(models=models))
    model = engine.model("st")
    for n, text in list(enumerate(given, 1))[::50]:
        row = outputs[".parquet"][str(n)]["response"]["body"]["data"][0]["embedding"]
        alone = model.predict(model.encode([text]))[0]["last_hidden_state"]
        want = alone.mean(axis=0) / np.linalg.norm(alone.mean(axis=0))
        np.testing.assert_allclose(row, want, atol=1e-5)


async def test_a_job_that_cannot_go_on_fails_and_the_server_keeps_serving(
    models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its writes refused (a full disk, at its first sync: its plan's), its model unloaded:
    each job fails saying why, what it answered is kept, and requests are still answered."""
    from bucketserve.process.wiring import wire

    batch = texts(12_000, seed=4)
    lines = [request_line(str(i), {"model": "st", "input": t}) for i, t in enumerate(batch)]
    data = "\n".join(lines).encode()
    wired = wire(settings_of(models, tmp_path / "jobs", model_control="explicit"))
    async with serving(wired.engine, wired.control) as client:
        sdk = sdk_of(client)
        given = await sdk.files.create(file=("in.jsonl", data), purpose="batch")

        def full(_: int) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "fsync", full)
        with pytest.raises(openai.InternalServerError, match="could not be kept") as refused:
            await sdk.files.create(file=("more.jsonl", data), purpose="batch")
        assert refused.value.status_code == 507
        created = await sdk.batches.create(
            input_file_id=given.id, endpoint="/v1/embeddings", completion_window="24h"
        )
        done = await ended(sdk, created.id)
        assert done.status == "failed"
        assert [(e.code, e.message) for e in done.errors.data] == [
            ("output_unwritable", "writing the batch's order: No space left on device")
        ]  # (the first write a batch syncs)
        monkeypatch.undo()
        answer = await client.post("/v1/embeddings", json={"model": "st", "input": "still"})
        assert answer.status_code == 200
        created = await sdk.batches.create(
            input_file_id=given.id, endpoint="/v1/embeddings", completion_window="24h"
        )
        while (await sdk.batches.retrieve(created.id)).request_counts.completed < 1:
            await asyncio.sleep(0.01)
        assert (await client.post("/v2/repository/models/st/unload")).status_code == 200
        gone = await ended(sdk, created.id)
        assert gone.status == "failed"
        assert [e.code for e in gone.errors.data] == ["model_unavailable"]
        kept = await lines_of(sdk, gone.output_file_id)
        assert 0 < len(kept) == gone.request_counts.completed < 12_000


@contextlib.contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` at `path`, made for the test and gone after it: a disk that fills.
    Skipped, saying why, where one cannot be mounted (not root, no mount, a container
    without the right)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a small filesystem needs root and mount(8) to be made")
    path.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"a small filesystem could not be mounted: {made.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False)


@pytest.mark.parametrize("checkpoint_s", [1.0, 0.05], ids=["before-a-checkpoint", "after"])
async def test_a_batch_that_fills_its_disk_ends_failed_its_answers_and_verdict_kept(
    models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checkpoint_s: float
) -> None:
    """Its output fills the jobs directory's disk (a 2 MiB filesystem), before its first
    checkpoint (the disk still full when it ends) or after some: the batch ends `failed`
    with `output_unwritable`, never left in progress; the answers of its last checkpoint are
    its output; and the verdict is on disk, as a server started again on the disk finds it."""
    from bucketserve.jobs import runner

    monkeypatch.setattr(runner, "CHECKPOINT_S", checkpoint_s)
    bodies = [{"model": "st", "input": t} for t in texts(6000, seed=5)]
    lines = [request_line(f"d{i}", body) for i, body in enumerate(bodies)]
    with small_filesystem(tmp_path / "small", "2m") as jobs:
        settings = settings_of(models, jobs)
        async with serving(load_engine(settings)) as client:
            sdk = sdk_of(client)
            done = await ran(sdk, lines)
            assert done.status == "failed", done
            assert [e.code for e in done.errors.data] == ["output_unwritable"]
            assert "No space left on device" in done.errors.data[0].message
            kept = await lines_of(sdk, done.output_file_id)
            assert len(kept) == done.request_counts.completed < len(lines)
            assert len(kept) > 0 or checkpoint_s == 1.0
            answer = await client.post("/v1/embeddings", json=bodies[0])
            assert answer.status_code == 200
        async with serving(load_engine(settings)) as client:
            again = await sdk_of(client).batches.retrieve(done.id)
            assert (again.status, again.request_counts.completed) == ("failed", len(kept))


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS, errno.EDQUOT])
@pytest.mark.parametrize("where", ["order", "output"])
async def test_every_write_failure_ends_the_batch_failed(
    served: Any, monkeypatch: pytest.MonkeyPatch, where: str, error: int
) -> None:
    """A full disk, a read-only one, a quota: writing its order (validating) or its output
    (in progress), the batch ends `failed` saying which, and the server goes on."""
    from bucketserve.jobs import plan, writer

    sdk, client = served
    lines = [request_line(f"w{i}", {"input": t}) for i, t in enumerate(texts(50))]
    given = await sdk.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")

    def refused(*_: Any, **__: Any) -> None:
        raise OSError(error, os.strerror(error))

    if where == "order":
        monkeypatch.setattr(plan.np, "savez", refused)
    else:  # (the writer's syncs alone: the plan's, before it, go through)
        monkeypatch.setattr(writer, "os", SimpleNamespace(**{**vars(os), "fsync": refused}))
    created = await sdk.batches.create(
        input_file_id=given.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    done = await ended(sdk, created.id)
    assert done.status == "failed"
    assert [e.code for e in done.errors.data] == ["output_unwritable"]
    what = "the batch's order" if where == "order" else "the output"
    assert done.errors.data[0].message == f"writing {what}: {os.strerror(error)}"
    monkeypatch.undo()
    assert (await client.post("/v1/embeddings", json={"input": "on"})).status_code == 200


def test_a_batchs_end_is_recorded_on_a_full_disk_and_said_on_a_read_only_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jobs state keeps room for ends: on a full disk, where another write fails, a
    batch's end is committed (the reserve given back for it); where nothing can be written
    (a read-only disk: SQLite's answer, since a busy mount cannot be made read-only) it is
    said from memory, and committed once the disk can be written again."""
    from bucketserve.jobs.store import Store

    with small_filesystem(tmp_path / "small", "1m") as root:
        store = Store(root)
        store.open()
        for batch_id in ("batch_full", "batch_read_only"):
            store.add_batch("t", {"id": batch_id, "created_at": 1, "status": "in_progress"})
        with contextlib.suppress(OSError), (root / "filler").open("wb", buffering=0) as filler:
            while True:
                filler.write(b"x" * 4096)
        with pytest.raises(OSError, match="disk is full"):
            store.update("batch_full", status="finalizing", note="x" * 8192)
        store.end("batch_full", status="failed", errors={"data": ["x" * 8192]})
        assert not store.reserve.path.exists()
        assert store.recorded("batch_full")
        (root / "filler").unlink()
        committed = Store._committed

        def read_only(self: Store, sql: str, args: tuple[Any, ...]) -> Any:
            if sql.startswith("SELECT"):
                return committed(self, sql, args)
            raise OSError(errno.EROFS, "the jobs state: attempt to write a readonly database")

        monkeypatch.setattr(Store, "_committed", read_only)
        store.end("batch_read_only", status="failed")
        assert store.batch("batch_read_only").status == "failed"  # type: ignore[union-attr]
        assert not store.recorded("batch_read_only")
        monkeypatch.undo()
        assert [b.status for b in store.batches()] == ["failed", "failed"]  # (and committed)
        assert store.recorded("batch_read_only")
        store.close()
        again = Store(root)
        assert [b.status for b in again.batches()] == ["failed", "failed"]
        again.close()


async def test_lines_not_run_within_the_window_are_expired_in_the_error_file(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bucketserve.jobs import jobs

    sdk, _ = served
    monkeypatch.setitem(jobs.WINDOW_S, "24h", 0)  # (a window that has passed once it starts)
    done = await ran(sdk, [request_line(f"x{i}", {"input": t}) for i, t in enumerate(texts(20))])
    assert done.status == "expired"
    assert done.expired_at is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (0, 20)
    expired = await lines_of(sdk, done.error_file_id)
    assert len(expired) == 20
    assert {line["error"]["code"] for line in expired.values()} == {"batch_expired"}
    assert {line["response"] for line in expired.values()} == {None}


def test_a_files_lines_are_ordered_by_their_longest_text_in_tokens(models: Path) -> None:
    """The order a batch runs in: each line's longest text, in its model's tokens (ids
    counted as they are), shortest first, the file's order among equals."""
    from bucketserve.jobs.ordering import body_lengths, order

    model = load_engine(Settings(models=models)).model("st")
    assert model.tokenizer is not None
    bodies = [
        {"input": ["a b c d e f g h", "a"]},
        {"input": "a"},
        {"inputs": "a b c"},
        {"input": [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]},
        {"query": "a", "documents": [{"text": "a b c d"}, "a b"]},
        {"model": "st"},
    ]
    found = body_lengths([json.dumps(b).encode() for b in bodies], model)
    tokens = [len(model.tokenizer.encode(t).ids) for t in ("a b c d e f g h", "a", "a b c")]
    four = len(model.tokenizer.encode("a b c d").ids)
    assert found.tolist() == [tokens[0], tokens[1], tokens[2], 16, four, 0]
    assert order(found).tolist() == sorted(range(6), key=lambda i: (found[i], i))
    # a text past the tokenizer's limit: counted from its start, as long as the limit
    limit = model.tokenizer.truncation["max_length"]
    assert body_lengths([json.dumps({"input": "word " * 10**6}).encode()], model) == [limit]


def test_a_plan_of_an_earlier_version_is_read_by_its_line_numbers(tmp_path: Path) -> None:
    """A batch left running by a version whose plan named line numbers goes on: its
    requests are found in the file again."""
    from bucketserve.jobs.plan import PLAN, read_plan

    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"a": 1}\n\n{"b": 22}\n{"c": 333}\n')
    order, lengths = np.array([2, 0, 1]), np.array([3, 1, 2])
    np.savez(tmp_path / PLAN, order=order, lengths=lengths, numbers=np.array([1, 3, 4]))
    plan = read_plan(tmp_path, source)
    assert plan.order.tolist() == [2, 0, 1]
    assert plan.offsets.tolist() == [0, 10, 20]
    assert plan.sizes.tolist() == [9, 10, 11]


def test_every_endpoint_a_batch_may_run_is_a_route_that_takes_a_post(models: Path) -> None:
    from bucketserve.edges.http.app import create_app
    from bucketserve.edges.http.routes import ENDPOINTS

    paths = create_app(load_engine(Settings(models=models))).openapi()["paths"]
    assert [e for e in ENDPOINTS if "post" not in paths.get(e, {})] == []


async def test_a_runner_that_breaks_fails_its_batch_not_leaves_it_running(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bucketserve.jobs.runner import Runner

    async def broken(self: Runner) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(Runner, "_answer", broken)
    sdk, client = served
    done = await ran(sdk, [request_line("1", {"input": "x"})])
    assert done.status == "failed"
    assert [e.code for e in done.errors.data] == ["internal_error"]
    assert (await client.post("/v1/embeddings", json={"input": "x"})).status_code == 200


async def test_a_second_server_on_the_same_jobs_directory_serves_but_runs_no_jobs(
    models: Path, tmp_path: Path
) -> None:
    """One server holds a jobs directory (two would each resume its batches): a second on the
    same directory still answers requests, and its Batch API says why it runs no jobs."""
    jobs = tmp_path / "jobs"
    async with serving(load_engine(settings_of(models, jobs))) as first:
        await sdk_of(first).files.create(file=("in.jsonl", b"{}\n"), purpose="batch")
        async with serving(load_engine(settings_of(models, jobs))) as second:
            with pytest.raises(openai.InternalServerError, match="another server holds") as held:
                await sdk_of(second).files.list()
            assert held.value.status_code == 503
            assert str(tmp_path) not in str(held.value.body)  # (a host's path: not a client's)
            answer = await second.post("/v1/embeddings", json={"input": "still served"})
            assert answer.status_code == 200

"""A batch that runs alone (no other running or waiting) gets every core: a second session
with threads of its own, made where each batch runs on one thread. The model sends it there
and nowhere else; a real server reports it, answers on it as the model alone, and turns it
off with `--lone-batch-threads 1`."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from bucketserve.core.bucketing import BucketKey
from bucketserve.loading import load_model_spec
from bucketserve.loading.check import random_sequences
from bucketserve.loading.layouts import sequence_rules
from bucketserve.runtime.sessions import lone_threads, usable_cores
from tests.engines import Reference
from tests.fakes import FakeExecutor, fake_model
from tests.helpers import copy_bundled, server_process

TOLERANCE = 1e-5  # as tests/test_exactness.py


def test_only_a_batch_that_runs_alone_goes_to_the_lone_runner() -> None:
    model, executor = fake_model()
    lone = model.lone = FakeExecutor()
    key = BucketKey(8, 8)
    together = model.run_batch(key, [np.arange(1, 4), np.arange(1, 6)])
    alone = model.run_batch(key, [np.arange(1, 4), np.arange(1, 6)], lone=True)
    assert executor.batches == [(key, [3, 5])]
    assert lone.batches == [(key, [3, 5])]
    for a, b in zip(together, alone, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    model.prepare(BucketKey(8, 16))  # keys are bound and warmed on both
    assert executor.bound_key_count() == lone.bound_key_count() == 2


def test_lone_threads_only_where_batches_share_the_cores() -> None:
    every_core = usable_cores() if usable_cores() > 1 else None
    assert lone_threads(None, instances=2, threads=1) == every_core
    assert lone_threads(4, instances=4, threads=1) == 4
    assert lone_threads(1, instances=2, threads=1) is None  # turned off
    assert lone_threads(None, instances=1, threads=usable_cores()) is None  # one batch has all
    assert lone_threads(2, instances=2, threads=2) is None  # no more than a batch has


def _served(url: str, log: Path) -> tuple[object, list[str]]:
    config = httpx.get(f"{url}/v2/models/tiny-encoder/config").json()
    messages = [json.loads(line)["message"] for line in log.read_text().splitlines()]
    return config.get("lone_batch_threads"), messages  # (absent when there is none)


@pytest.mark.skipif(usable_cores() < 2, reason="one core: no wider layout for a lone batch")
@pytest.mark.slow
def test_a_server_runs_lone_batches_on_every_core_and_answers_as_the_model_alone(
    tmp_path: Path,
) -> None:
    root = tmp_path / "models"
    root.mkdir()
    copy_bundled(root, "tiny-encoder")
    spec = load_model_spec(root / "tiny-encoder")
    assert spec is not None
    sequences = random_sequences(sequence_rules(spec), [1, 5, 22, 60, 130], seed=3)
    reference = Reference(spec)
    with server_process(root, "--default-model", "tiny-encoder") as (_, url, log):
        threads, messages = _served(url, log)
        assert threads == usable_cores()
        assert any("a batch that runs alone gets" in m for m in messages)
        for seq in sequences:  # one at a time: each batch runs alone
            response = httpx.post(f"{url}/predict", json={"sequences": [seq.tolist()]})
            assert response.status_code == 200
            (answer,) = response.json()["outputs"]
            for name, value in reference(seq).items():
                np.testing.assert_allclose(
                    np.asarray(answer[name]), value, rtol=TOLERANCE, atol=TOLERANCE
                )
    with server_process(root, "--default-model", "tiny-encoder", "--lone-batch-threads", "1") as (
        _,
        url,
        log,
    ):
        threads, messages = _served(url, log)
        assert threads is None
        assert not any("a batch that runs alone gets" in m for m in messages)

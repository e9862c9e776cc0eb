"""Executors: lazy binding, binding once under concurrency, pad rows, concurrent batches."""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bucketserve.core.bucketing import BucketKey
from bucketserve.core.model import Model
from bucketserve.errors import ConfigError
from bucketserve.loading import build_model, load_model_spec
from bucketserve.loading.check import random_sequences
from bucketserve.runtime.binding import BufferBinding
from bucketserve.runtime.sessions import GraphFile, runs_on_cpu, thread_layout, usable_cores
from bucketserve.settings import Settings
from tests.engines import Reference, spec_of
from tests.helpers import MODELS, copy_bundled


def tiny_encoder(
    tmp_models: Path, binding: str = "shared-session", mode: str = "bucketing"
) -> Model:
    config = (MODELS / "tiny-encoder" / "config.toml").read_text()
    config = config.replace('binding = "shared-session"', f'binding = "{binding}"')
    config = config.replace('mode = "bucketing"', f'mode = "{mode}"')
    spec = load_model_spec(copy_bundled(tmp_models, "tiny-encoder", config))
    assert spec is not None
    return build_model(spec)


@pytest.mark.parametrize("binding", ["shared-session", "session-per-key"])
def test_keys_bind_lazily_on_first_batch_or_prepare(tmp_models: Path, binding: str) -> None:
    model = tiny_encoder(tmp_models, binding)
    default = model.plan.default_key
    assert model.executor.bound_keys == {default}  # only the default key at load

    binds = counted_binds(model)
    key16 = model.plan.key_for(10)
    assert key16 == BucketKey(32, 16)
    model.predict([[1] * 10])  # first batch of that key binds it
    assert model.executor.bound_keys == {default, key16}

    key32 = model.plan.key_for(30)
    model.prepare(key32)  # ahead of its first batch
    assert key32 in model.executor.bound_keys
    model.predict([[1] * 30, [2] * 25])
    assert binds == {key16: 1, key32: 1}  # (and the default's, once, at load)


def counted_binds(model: Model) -> Counter[BucketKey]:
    """How often each key is bound from now on: each `prepare` of the executor that bound."""
    binds: Counter[BucketKey] = Counter()
    prepare = model.executor.prepare

    def counting(key: BucketKey) -> bool:
        bound = prepare(key)
        binds[key] += bound
        return bound

    model.executor.prepare = counting  # type: ignore[method-assign]
    return binds


@pytest.mark.parametrize("binding", ["shared-session", "session-per-key"])
def test_concurrent_first_use_binds_once(tmp_models: Path, binding: str) -> None:
    model = tiny_encoder(tmp_models, binding)
    binds = counted_binds(model)
    key = model.plan.key_for(40)
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def first_use(i: int) -> None:
        try:
            start.wait()
            model.predict([[i + 1] * 40])
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=first_use, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert binds == {key: 1}


def test_shared_session_holds_one_session_for_all_keys(tmp_models: Path) -> None:
    model = tiny_encoder(tmp_models, "shared-session")
    for key in model.plan.all_keys():
        model.prepare(key)
    assert len(model.executor.bound_keys) == len(model.plan.all_keys()) == 10
    assert len(model.executor.sessions) == 1


def test_session_per_key_holds_one_session_per_key(tmp_models: Path) -> None:
    model = tiny_encoder(tmp_models, "session-per-key")
    for key in model.plan.all_keys()[:4]:
        model.prepare(key)
    assert len(model.executor.sessions) == len(model.executor.bound_keys) == 5


@pytest.mark.parametrize(
    ("binding", "mode", "shape"),
    [
        ("shared-session", "bucketing", (3, 20)),
        ("session-per-key", "bucketing", (32, 24)),
        ("shared-session", "mutable", (3, 20)),
    ],
)
def test_batch_shapes(tmp_models: Path, binding: str, mode: str, shape: tuple[int, int]) -> None:
    """Static keys pad to the key's shape; the others run real rows at their own longest."""
    model = tiny_encoder(tmp_models, binding, mode)
    key = model.plan.key_for(20)
    assert key == BucketKey(32, 24)
    assert model.executor.batch_shape(key, [17, 20, 18]) == shape


def test_partial_static_batch_returns_its_real_rows_in_order(tmp_models: Path) -> None:
    model = tiny_encoder(tmp_models, "session-per-key")
    spec = spec_of(tmp_models, "tiny-encoder")
    key = model.plan.key_for(20)
    sequences = random_sequences(model.info.rules, [20, 17, 24, 19, 21], seed=3)
    assert model.executor.batch_shape(key, [len(s) for s in sequences]) == (key.rows, 24)
    assert key.rows > len(sequences)  # the batch is padded with rows

    answers = model.run_batch(key, sequences)

    reference = Reference(spec)
    assert len(answers) == len(sequences)
    for seq, answer in zip(sequences, answers, strict=True):
        expected = reference(seq)
        assert answer["last_hidden_state"].shape == (len(seq), 64)
        np.testing.assert_allclose(
            answer["sentence_embedding"], expected["sentence_embedding"], rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(
            answer["last_hidden_state"], expected["last_hidden_state"], rtol=1e-5, atol=1e-5
        )


def test_outputs_do_not_alias_reused_buffers(tmp_models: Path) -> None:
    model = tiny_encoder(tmp_models)
    first = model.predict([[5, 6, 7]])[0]["sentence_embedding"].copy()
    kept = model.predict([[5, 6, 7]])[0]
    model.predict([[9, 9, 9]])  # same key, same buffers
    np.testing.assert_array_equal(kept["sentence_embedding"], first)


@pytest.mark.parametrize(
    ("binding", "mode"),
    [
        ("shared-session", "bucketing"),
        ("session-per-key", "bucketing"),
        ("shared-session", "mutable"),
    ],
)
def test_concurrent_batches_of_one_key_stay_exact(
    tmp_models: Path, binding: str, mode: str
) -> None:
    """Several instances running the same key at once each get a binding of their own (its
    buffers are reused between runs), on the key's one session."""
    model = tiny_encoder(tmp_models, binding, mode)
    reference = Reference(spec_of(tmp_models, "tiny-encoder"))
    inputs = [
        random_sequences(model.info.rules, [17 + i, 32 - i, 20 + i], seed=i) for i in range(8)
    ]
    start = threading.Barrier(8)
    results: dict[int, list[dict[str, np.ndarray]]] = {}

    def run(i: int) -> None:
        start.wait()
        for _ in range(20):
            results[i] = model.predict(inputs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, sequences in enumerate(inputs):
        for sequence, out in zip(sequences, results[i], strict=True):
            for name, value in reference(sequence).items():
                np.testing.assert_allclose(out[name], value, rtol=1e-5, atol=1e-5)
    keys = {model.plan.key_for(len(s)) for seqs in inputs for s in seqs} | {model.plan.default_key}
    per_key = binding == "session-per-key"
    assert len(model.executor.sessions) == (len(keys) if per_key else 1)  # none per instance


def test_thread_layout_gives_a_cpu_one_instance_per_core() -> None:
    cores = usable_cores()
    assert 1 <= cores <= (os.cpu_count() or 1)
    assert thread_layout(None, None, all_on_cpu=True) == (cores, 1)
    assert thread_layout(None, None, all_on_cpu=False) == (1, cores)  # a GPU: one batch at once
    assert thread_layout(1, None, all_on_cpu=True) == (1, cores)
    assert thread_layout(3, 2, all_on_cpu=True) == (3, 2)  # what is asked for wins
    assert runs_on_cpu(["CPUExecutionProvider"])
    assert runs_on_cpu(["NoSuchExecutionProvider", "CPUExecutionProvider"])
    assert Settings.from_env({"BUCKETSERVE_INSTANCES": "2"}).instances == 2
    with pytest.raises(ConfigError, match="instances: must be at least 1"):
        Settings(instances=0)


def test_a_binding_on_a_device_binds_each_runs_inputs_again(tmp_models: Path) -> None:
    """On a GPU a bound host input is copied when it is bound, so each run binds its inputs
    again (an H100 answered the feeds of the run that first bound them, off by 2). The path
    is taken here on the CPU, made to believe it runs on a device: runs of one shape in turn
    answer their own feeds, as a session's plain run does."""
    model = tiny_encoder(tmp_models)
    session = model.executor.sessions[0]  # type: ignore[attr-defined]
    binding = BufferBinding(session, model.info.layout, [(2, 8)])
    binding._on_device = True
    reference = Reference(spec_of(tmp_models, "tiny-encoder"))
    for seed in range(3):
        sequences = random_sequences(model.info.rules, [5, 8], seed=seed)
        feeds = model.info.layout.collate(sequences, 2, 8)
        got = binding.run(feeds, 2, 8)["sentence_embedding"]
        for row, seq in enumerate(sequences):
            want = reference(seq)["sentence_embedding"]
            np.testing.assert_allclose(got[row], want, atol=1e-5)


def test_cuda_asks_for_full_fp32_unless_the_config_says_otherwise() -> None:
    """TF32 matrix products move answers with a batch's shape: the server's default for CUDA
    turns them off; a model's config may set any option, that one included."""
    plain = GraphFile(Path("m.onnx"), ("CUDAExecutionProvider", "CPUExecutionProvider"))
    assert plain.provider_options("CUDAExecutionProvider") == {"use_tf32": "0"}
    assert plain.provider_options("CPUExecutionProvider") == {}
    given = (("CUDAExecutionProvider", (("use_tf32", "1"), ("device_id", "1"))),)
    told = GraphFile(Path("m.onnx"), ("CUDAExecutionProvider",), options=given)
    assert told.provider_options("CUDAExecutionProvider") == {"use_tf32": "1", "device_id": "1"}

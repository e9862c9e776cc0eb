"""Pure bucketing: keys, capacities, batch grouping, collate with pad rows, split."""

from __future__ import annotations

import numpy as np
import pytest

from serve.bucketing import BucketKey, BucketPlan, Layout, split
from serve.errors import InvalidInput
from serve.repository import load_model_spec
from tests.helpers import MODELS

PLAN = BucketPlan(edges=(8, 16, 32, 64), max_batch_size=8, max_batch_tokens=256)


@pytest.mark.parametrize(
    ("length", "key"),
    [
        (1, BucketKey(8, 8)),
        (8, BucketKey(8, 8)),
        (9, BucketKey(8, 16)),
        (16, BucketKey(8, 16)),
        (17, BucketKey(8, 32)),
        (33, BucketKey(4, 64)),
        (64, BucketKey(4, 64)),
    ],
)
def test_key_for_length(length: int, key: BucketKey) -> None:
    assert PLAN.key_for(length) == key


@pytest.mark.parametrize("length", [0, 65, -1])
def test_length_outside_the_buckets(length: int) -> None:
    with pytest.raises(InvalidInput, match=r"outside 1\.\.64"):
        PLAN.key_for(length)


def test_capacity_is_min_of_batch_size_and_token_budget() -> None:
    assert [PLAN.capacity(e) for e in PLAN.edges] == [8, 8, 8, 4]
    assert PLAN.default_key == BucketKey(4, 64)
    assert PLAN.all_keys() == [
        BucketKey(8, 8),
        BucketKey(8, 16),
        BucketKey(8, 32),
        BucketKey(4, 64),
    ]


def test_exact_lengths_plan_keys_every_length() -> None:
    exact = BucketPlan(edges=(4, 8), max_batch_size=4, max_batch_tokens=64, exact_lengths=True)
    assert exact.key_for(3) == BucketKey(4, 3)
    assert [k.length for k in exact.all_keys()] == list(range(1, 9))


def test_batches_group_by_key_in_order_and_cut_at_capacity() -> None:
    lengths = [3, 40, 9, 5, 50, 2, 60, 1, 4, 6, 7, 8, 33, 12, 64]
    batches = list(PLAN.batches(lengths))
    assert batches == [
        (BucketKey(8, 8), [0, 3, 5, 7, 8, 9, 10, 11]),
        (BucketKey(8, 16), [2, 13]),
        (BucketKey(4, 64), [1, 4, 6, 12]),
        (BucketKey(4, 64), [14]),
    ]


@pytest.fixture(scope="module")
def encoder_layout() -> Layout:
    spec = load_model_spec(MODELS / "tiny-encoder")
    assert spec is not None
    return Layout.from_spec(spec)


@pytest.fixture(scope="module")
def lstm_layout() -> Layout:
    spec = load_model_spec(MODELS / "tiny-lstm")
    assert spec is not None
    return Layout.from_spec(spec)


def test_collate_tokens_pads_positions_and_rows(encoder_layout: Layout) -> None:
    seqs = [np.array([5, 6, 7]), np.array([9])]
    feeds = encoder_layout.collate(seqs, rows=4, length=5)
    np.testing.assert_array_equal(
        feeds["input_ids"], [[5, 6, 7, 0, 0], [9, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]
    )
    # pad rows are one step long: a fully masked row is not something every model can run
    np.testing.assert_array_equal(
        feeds["attention_mask"],
        [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0]],
    )
    assert feeds["token_type_ids"].shape == (4, 5)
    assert not feeds["token_type_ids"].any()
    assert {a.dtype for a in feeds.values()} == {np.dtype(np.int64)}


def test_collate_features_lengths_and_state(lstm_layout: Layout) -> None:
    seqs = [np.ones((2, 16), np.float32), np.full((4, 16), 2.0, np.float32)]
    feeds = lstm_layout.collate(seqs, rows=3, length=4)
    assert feeds["features"].shape == (3, 4, 16)
    assert feeds["features"][0, 2:].sum() == 0
    assert feeds["features"][1].min() == 2.0
    np.testing.assert_array_equal(feeds["lengths"], [2, 4, 1])
    assert feeds["lengths"].dtype == np.int32
    assert feeds["h0"].shape == feeds["c0"].shape == (1, 3, 32)  # batch on axis 1, by its name
    assert not feeds["h0"].any()


def test_split_drops_pad_rows_and_cuts_per_step_outputs() -> None:
    outputs = {"steps": np.arange(4 * 5 * 2).reshape(4, 5, 2), "pooled": np.arange(8).reshape(4, 2)}
    parts = split(outputs, [3, 5], {"steps": True, "pooled": False})
    assert len(parts) == 2
    np.testing.assert_array_equal(parts[0]["steps"], outputs["steps"][0, :3])
    np.testing.assert_array_equal(parts[1]["steps"], outputs["steps"][1])
    np.testing.assert_array_equal(parts[1]["pooled"], [2, 3])

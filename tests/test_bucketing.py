"""Pure bucketing: keys, capacities, batch grouping."""

from __future__ import annotations

import pytest

from bucketserve.core.bucketing import BucketKey, BucketPlan, Invariance, Policy
from bucketserve.errors import InvalidInput

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


def test_exact_length_plan_keys_every_length() -> None:
    exact = BucketPlan((4, 8), max_batch_size=4, max_batch_tokens=64, policy=Policy.EXACT_LENGTH)
    assert exact.key_for(3) == BucketKey(4, 3)
    assert [k.length for k in exact.all_keys()] == list(range(1, 9))
    assert exact.bucket_of(3) == 4  # what metrics label its batches with
    assert exact.bucket_of(5) == 8


def test_a_plan_at_a_multiple_runs_each_length_rounded_up_to_one() -> None:
    """A model that runs only at multiples of 32: exact lengths share the multiple they round
    up to, buckets are multiples, and a batch runs at its longest rounded up."""
    exact = BucketPlan((64, 128), 8, 1024, Policy.EXACT_LENGTH, multiple=32)
    assert [exact.key_for(n).length for n in (1, 32, 33, 64, 100)] == [32, 32, 64, 64, 128]
    assert [k.length for k in exact.all_keys()] == [32, 64, 96, 128]
    assert exact.run_length(33) == 64
    buckets = BucketPlan((64, 128), 8, 1024, Policy.BUCKETS, multiple=32)
    assert buckets.key_for(65) == BucketKey(8, 128)
    with pytest.raises(ValueError, match="not all multiples of 32"):
        BucketPlan((50, 128), 8, 1024, multiple=32)


def test_single_plan_runs_one_sequence_per_key() -> None:
    single = BucketPlan((4, 8), max_batch_size=4, max_batch_tokens=64, policy=Policy.SINGLE)
    assert single.key_for(3) == BucketKey(1, 4)
    assert single.all_keys() == [BucketKey(1, 4), BucketKey(1, 8)]
    assert list(single.batches([3, 2, 7])) == [
        (BucketKey(1, 4), [0]),
        (BucketKey(1, 4), [1]),
        (BucketKey(1, 8), [2]),
    ]


@pytest.mark.parametrize(
    ("padding", "batching", "policy"),
    [
        (0.0, 0.0, Policy.BUCKETS),
        (1e-4, 1e-4, Policy.BUCKETS),  # within the tolerance
        (0.03, 0.0, Policy.EXACT_LENGTH),
        (0.0, 0.49, Policy.SINGLE),
        (0.5, 0.49, Policy.SINGLE),
        (float("nan"), 0.0, Policy.EXACT_LENGTH),  # a NaN is within no tolerance
        (0.0, float("inf"), Policy.SINGLE),  # a batch the model cannot run
    ],
)
def test_policy_from_the_measured_invariance(
    padding: float, batching: float, policy: Policy
) -> None:
    assert Invariance(padding, batching, tolerance=1e-4).policy is policy


def test_batches_group_by_key_in_order_and_cut_at_capacity() -> None:
    lengths = [3, 40, 9, 5, 50, 2, 60, 1, 4, 6, 7, 8, 33, 12, 64]
    batches = list(PLAN.batches(lengths))
    assert batches == [
        (BucketKey(8, 8), [0, 3, 5, 7, 8, 9, 10, 11]),
        (BucketKey(8, 16), [2, 13]),
        (BucketKey(4, 64), [1, 4, 6, 12]),
        (BucketKey(4, 64), [14]),
    ]

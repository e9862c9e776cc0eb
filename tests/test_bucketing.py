"""Pure bucketing: keys, capacities, batch grouping."""

from __future__ import annotations

import pytest

from serve.bucketing import BucketKey, BucketPlan
from serve.errors import InvalidInput

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

"""Layouts: collate with pad rows, masks, lengths and states; split back per sequence."""

from __future__ import annotations

import numpy as np
import pytest

from bucketserve.core.layout import Layout, Tensor
from bucketserve.loading import load_model_spec
from bucketserve.loading.layouts import layout_alone
from tests.helpers import MODELS


@pytest.fixture(scope="module")
def encoder_layout() -> Layout:
    spec = load_model_spec(MODELS / "tiny-encoder")
    assert spec is not None
    return layout_alone(spec).layout


@pytest.fixture(scope="module")
def lstm_layout() -> Layout:
    spec = load_model_spec(MODELS / "tiny-lstm")
    assert spec is not None
    return layout_alone(spec).layout


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
    layout = Layout(
        (),
        (
            Tensor("steps", np.dtype(np.int64), (None, None, 2), batch_axis=0, time_axis=1),
            Tensor("pooled", np.dtype(np.int64), (None, 2), batch_axis=0),
        ),
    )
    parts = layout.split(outputs, [3, 5])
    assert len(parts) == 2
    np.testing.assert_array_equal(parts[0]["steps"], outputs["steps"][0, :3])
    np.testing.assert_array_equal(parts[1]["steps"], outputs["steps"][1])
    np.testing.assert_array_equal(parts[1]["pooled"], [2, 3])


def test_split_keeps_a_scalar_per_sequence_a_scalar_and_copies_moved_axes() -> None:
    layout = Layout(
        (),
        (
            Tensor("score", np.dtype(np.float32), (None,), batch_axis=0),
            Tensor("frames", np.dtype(np.float32), (None, None, 2), batch_axis=1, time_axis=0),
        ),
    )
    outputs = {
        "score": np.array([0.5, 1.5, 2.5], np.float32),
        "frames": np.arange(4 * 3 * 2, dtype=np.float32).reshape(4, 3, 2),  # [T, B, 2]
    }
    parts = layout.split(outputs, [4, 2])
    assert parts[1]["score"].shape == ()
    assert float(parts[1]["score"]) == 1.5
    np.testing.assert_array_equal(parts[1]["frames"], outputs["frames"][:2, 1])
    assert parts[1]["frames"].flags.c_contiguous

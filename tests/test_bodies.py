"""Bodies parsed within bounds, whatever their shape: a body of millions of small lists is
refused before a list is made; brackets inside texts are text; the largest bodies the
server's limits allow are parsed; and `/v1/embeddings`' input is checked by hand, stopping at
the first element out of place, before the schema's union (which would describe every
element against every form) sees it. The costs are measured by `loadtest.costly_bodies`."""

from __future__ import annotations

import re
import tracemalloc
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketserve.edges import kserve
from bucketserve.edges.http import common
from bucketserve.edges.http.apis.openai import check_input, read_embeddings
from bucketserve.edges.http.common import outside_strings, parse_json
from bucketserve.edges.limits import Limits
from bucketserve.errors import MalformedRequest
from tests.engines import make_engine, serving
from tests.helpers import error_of

STEPS = 65_536  # the default --max-request-tokens
BUDGET = Limits(8 * 2**20, 256, STEPS).json()  # a JSON body's, at the default limits


def test_millions_of_small_lists_are_refused_before_they_are_made() -> None:
    body = orjson.dumps({"sequences": [[[[1]]] * 200_000]})  # 1 MB, 400,000 lists
    with pytest.raises(MalformedRequest, match=r"holds 400002 lists, more than the 132096 that"):
        parse_json(body, STEPS)


def test_more_values_than_a_request_holds_are_refused_before_they_are_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """/v1/embeddings' values are token ids or texts: a megabyte of floats where ids go is
    refused by its count of values, never parsed into a quarter of a million floats."""
    body = orjson.dumps({"model": "m", "input": [[0.5] * 100] * 2_500})  # 1 MB, 250,000 floats
    monkeypatch.setattr(common.orjson, "loads", None)  # (parsing it would raise TypeError)
    with pytest.raises(MalformedRequest, match=r"holds 250000 values, more than the 67136 that"):
        read_embeddings(parse_json(body, BUDGET.steps, BUDGET.values))


def test_a_body_of_short_strings_is_refused_in_a_few_times_its_size() -> None:
    """8 MiB of one-letter texts (two million strings) is counted without an object made per
    string: refused with its count, in under four times the body's size of memory."""
    body = orjson.dumps({"inputs": ["a"] * (8 * 2**20 // 4 - 8)})
    tracemalloc.start()
    try:
        with pytest.raises(MalformedRequest, match=r"holds 2097143 values, more than"):
            parse_json(body, 0, 66_112)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(body)


JSON_TEXT = st.text(st.sampled_from([*'ab,[]"\\{}: ', "\u00e9", "\u2028", "\U0001f600"]))
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | JSON_TEXT,
    lambda inner: st.lists(inner) | st.dictionaries(JSON_TEXT, inner),
    max_leaves=30,
)
STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')  # (the count's reference: every string cut out)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(value=JSON_VALUES)
def test_marks_outside_strings_are_counted_as_json_reads_them(value: object) -> None:
    body = orjson.dumps(value)
    for mark in (b",", b"["):
        assert outside_strings(body, mark) == STRING.sub(b"", body).count(mark)


def test_the_most_token_ids_and_texts_a_request_holds_are_parsed() -> None:
    ids = orjson.dumps({"model": "m", "input": [[7] * 256] * 256})  # STEPS ids in all
    assert len(read_embeddings(parse_json(ids, BUDGET.steps, BUDGET.values)).input) == 256
    texts = orjson.dumps({"model": "m", "input": ["a, b, c, " * 5_000] * 256})  # commas: text
    assert len(read_embeddings(parse_json(texts, BUDGET.steps, BUDGET.values)).input) == 256


def test_brackets_inside_texts_are_text() -> None:
    body = orjson.dumps({"text": ["[[[[" * 50_000, "x[]" * 30_000]})
    assert len(parse_json(body, STEPS)["text"][0]) == 200_000


def test_the_largest_bodies_the_limits_allow_are_parsed() -> None:
    steps = orjson.dumps({"sequences": [[[0.25]] * STEPS]})  # a [T, 1] feature sequence
    assert len(parse_json(steps, STEPS)["sequences"][0]) == STEPS
    frames = orjson.dumps({"sequences": [[[0.5] * 80] * 1000] * 8})  # [T, 80] frames
    assert len(parse_json(frames, STEPS)["sequences"]) == 8


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ([None] * 200_000, "input[0]: expected a string, a list of strings"),
        ([[1, 2], [3], None], "input[2]: expected a non-empty list of token ids (as input[0]"),
        ([[1, 2], []], "input[1]: expected a non-empty list of token ids"),
        ([1, 2, 2.5], "input[2]: expected a token id (as input[0] is a token id)"),
        (["a", 1], "input[1]: expected a string (as input[0] is a string)"),
        ([True], "input[0]: expected a string, a list of strings"),
        ([], "input: expected a string"),
        ({"a": 1}, "input: expected a string"),
    ],
)
def test_openai_input_is_checked_by_hand(given: object, says: str) -> None:
    with pytest.raises(MalformedRequest) as refused:
        check_input(given)
    assert says in refused.value.message
    assert refused.value.param == "input"


@pytest.mark.parametrize("given", ["text", ["a", "b"], [1, 2, 3.0], [[1], [2, 3]]])
def test_every_form_openai_documents_passes(given: object) -> None:
    check_input(given)


async def test_a_body_with_more_values_than_its_model_takes_is_refused_unparsed(
    tmp_models: Path,
) -> None:
    """/predict and v2 bound a large body's values by what a request may carry (v2: the path's
    model, every input a client sends at its longest; /predict: every step at the widest
    model's step): a megabyte of floats for a token model is refused by its count."""
    engine = make_engine(tmp_models, "tiny-encoder")
    model = engine.model("tiny-encoder")
    most = kserve.most_values(model, engine.settings.max_sequences)
    ids, mask, types = 1, 1, 1  # per step, the inputs a client sends
    assert most == 256 * model.plan.max_length * (ids + mask + types) + 256
    floats = [0.5] * 250_000
    v2 = {"inputs": [{"name": "input_ids", "shape": [1, len(floats)], "datatype": "FP32",
                      "data": floats}]}  # fmt: skip
    async with serving(engine) as client:
        over_v2 = await client.post("/v2/models/tiny-encoder/infer", json=v2)
        over_predict = await client.post("/predict", json={"sequences": [floats] * 2})
    assert over_v2.status_code == 400
    assert "values, more than the" in error_of(over_v2)[1]
    assert over_predict.status_code == 400
    assert "values, more than the" in error_of(over_predict)[1]

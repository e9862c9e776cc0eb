"""The OpenAPI document, fuzzed against a real server: schemathesis writes requests from every
route's schema, and requests that break it. No answer may be a 5xx other than the documented
503s and 504s, every answer must match the status, content type and schema the document gives
for it, and a request the schema allows is never refused as malformed. The repository holds a
model that did not load, so its 503s are reached too.

(schemathesis is driven through its Python API and hypothesis: its lazy pytest fixture reads a
pytest internal that pytest 9 no longer has.)
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from prometheus_client.parser import text_string_to_metric_families
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers import MODELS, copy_bundled, error_of, server_process
from tests.zoo import add_to

pytestmark = pytest.mark.slow  # the full tier: real server processes

JSON = "application/json"
EXAMPLES = 100  # at most, per operation and mode (23 runs); well under a minute here
OPERATIONS = [
    "POST /predict",
    "GET /v2/health/live",
    "GET /v2/health/ready",
    "GET /v2",
    "GET /v2/models/{name}",
    "GET /v2/models/{name}/versions/{version}",
    "GET /v2/models/{name}/config",
    "GET /v2/models/{name}/versions/{version}/config",
    "GET /v2/models/{name}/ready",
    "GET /v2/models/{name}/versions/{version}/ready",
    "POST /v2/repository/index",
    "POST /v2/repository/models/{name}/load",
    "POST /v2/repository/models/{name}/unload",
    "POST /v2/models/{name}/infer",
    "POST /v2/models/{name}/versions/{version}/infer",
    "GET /metrics",
    "POST /v1/embeddings",
    "GET /v1/models",
    "GET /v1/models/{name}",
    "POST /rerank",
    "POST /v1/rerank",
    "POST /v2/rerank",
    "POST /classify",
    "POST /classify_tokens",
    "POST /fill_mask",
    "POST /embed_sparse",
    "POST /embed_all",
    "POST /tokenize",
    "POST /decode",
    "POST /v1/embed",
    "POST /v2/embed",
    "POST /embed",
    "POST /similarity",
    "GET /info",
    "GET /health",
    "GET /ping",
    "GET /",
    "POST /",
    "POST /invocations",
    "POST /score",
    "POST /v1/score",
    "POST /embeddings",
    "GET /models",
    "GET /models/{name}",
    "POST /v1/files",
    "GET /v1/files",
    "GET /v1/files/{file_id}",
    "GET /v1/files/{file_id}/content",
    "DELETE /v1/files/{file_id}",
    "POST /v1/batches",
    "GET /v1/batches",
    "GET /v1/batches/{batch_id}",
    "POST /v1/batches/{batch_id}/cancel",
]
# A file's or a batch's id is one the server made: any other is a 404 (the SDK's tests in
# tests/test_batches.py read those), which would drown the fuzzing's reach in 404s.
MADE_IDS = [o for o in OPERATIONS if "_id}" in o]
# the routes with a body of their own to break (the repository's index has none)
BODIES = [
    o
    for o in OPERATIONS
    if o.startswith("POST /") and "{name}" not in o and "index" not in o and o not in MADE_IDS
]
# Requests that break the schema exist only where there is something to break: a parameter
# or a body.
RUNS = [(op, GenerationMode.POSITIVE) for op in OPERATIONS if op not in MADE_IDS] + [
    (op, GenerationMode.NEGATIVE) for op in OPERATIONS if "{name}" in op or op in BODIES
]
SEEN: dict[GenerationMode, Counter[int]] = {mode: Counter() for mode in GenerationMode}
CHECKS = [
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("fuzz") / "models"
    root.mkdir()
    copy_bundled(root, "tiny-encoder")
    copy_bundled(root, "tiny-lstm")
    add_to(root, "keras-bilstm")
    shutil.copytree(MODELS / "tiny-encoder", root / "broken")  # will not load: no vocab_size
    config = (root / "broken" / "config.toml").read_text()
    (root / "broken" / "config.toml").write_text(config.replace("vocab_size = 2000", ""))
    flags = ("--allow-partial", "--default-model", "tiny-encoder", "--max-sequences", "16")
    with server_process(root, *flags) as (_, url, _log):
        yield url


@pytest.fixture(scope="module")
def api(server: str) -> Any:
    return schemathesis.openapi.from_url(f"{server}/openapi.json")


def test_the_document_lists_every_operation(api: Any) -> None:
    labels = [result.ok().label for result in api.get_all_operations()]
    assert sorted(labels) == sorted(OPERATIONS)


@pytest.mark.parametrize(("label", "mode"), RUNS, ids=[f"{op} {m.value}" for op, m in RUNS])
def test_every_answer_keeps_the_documented_contract(api: Any, label: str, mode: Any) -> None:
    operation = next(r.ok() for r in api.get_all_operations() if r.ok().label == label)

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: Any) -> None:
        response = case.call()
        SEEN[mode][response.status_code] += 1
        assert response.status_code < 500 or response.status_code in (503, 504), response.text
        case.validate_response(response, checks=CHECKS)
        if mode is GenerationMode.POSITIVE and case.media_type in (None, JSON):
            # A request the schema allows is never refused for its form: what only the model
            # can judge (a token id past its vocabulary, data that do not fill their shape)
            # is a 422, and a task the model named does not serve a 400 that says so. (A
            # binary v2 body's framing is more than a schema can say.)
            refused = response.status_code in (400, 413, 415)
            assert not refused or task_not_served(response), (case.body, response.text)

    fuzz()


def task_not_served(response: Any) -> bool:
    """A 400 that says the model named does not do the route's task (it names what it does)."""
    if response.status_code != 400:
        return False
    return error_of(response.json())[0] == "task_not_served"


def test_the_fuzzing_reached_the_routes_and_never_a_500(server: str) -> None:
    """Run last: what the runs above sent, as they saw it and as the server counted it."""
    positive, negative = SEEN[GenerationMode.POSITIVE], SEEN[GenerationMode.NEGATIVE]
    assert positive.total() + negative.total() >= 1000, SEEN
    # Requests that keep the schema reach the routes: the model and version names are the
    # document's enums, so a 404 is rare (it was 26,882 of 27,649 with free strings).
    assert positive[404] < 0.05 * positive.total(), positive
    assert {200, 422, 503} <= set(positive), positive
    assert {400, 404, 415, 422} & set(negative), negative
    statuses = {}
    for family in text_string_to_metric_families(httpx.get(f"{server}/metrics").text):
        for sample in family.samples:
            if sample.name == "bucketserve_requests_total":
                statuses[sample.labels["status"]] = sample.value
    assert "500" not in statuses

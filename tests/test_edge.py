"""The edge under clients that misbehave or overreach: a disconnect mid-upload is not an
error, one text cannot make the tokenizer work for seconds, and what repeats under overload
is logged at a bounded rate."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bucketserve.core.engine import Engine
from bucketserve.core.registry import Registry
from bucketserve.edges.http.app import create_app
from bucketserve.loading import ModelSpec, build_model
from bucketserve.logs import Throttled
from bucketserve.settings import Settings
from tests.engines import serving
from tests.fakes import fake_model
from tests.helpers import error_of


async def test_a_client_that_leaves_mid_upload_is_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`Content-Length: 100`, five bytes, then gone: answered with nothing, counted as 499."""
    model, _ = fake_model()
    engine = Engine(Registry({model.name: model}, model.name), Settings())
    app = create_app(engine)
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"seq', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/predict",
        "raw_path": b"/predict",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"100")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }
    with caplog.at_level(logging.INFO):
        async with engine.running(app.state.metrics):
            await app(scope, receive, send)
            metrics = app.state.metrics.render().decode()
    assert sent[0]["status"] == 499  # (nobody is there to read it)
    assert 'status="500"' not in metrics
    assert 'bucketserve_requests_total{route="/predict",status="499"} 1.0' in metrics
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert sum("left before its answer" in r.message for r in caplog.records) == 1


async def test_a_long_text_is_cut_by_characters_before_it_is_tokenised(
    minilm_spec: ModelSpec, tmp_path: Path
) -> None:
    model = build_model(minilm_spec)
    chars = model.info.text_chars
    assert chars == 32 * 256
    engine = Engine(Registry({"minilm": model}, "minilm"), Settings())
    words = "the quick brown fox jumps over the lazy dog " * 20_000  # 880,000 characters
    async with serving(engine) as client:
        whole = await client.post("/predict", json={"text": [words]})
        cut = await client.post("/predict", json={"text": [words[:chars]]})
    assert whole.status_code == cut.status_code == 200
    embedding = np.asarray(whole.json()["outputs"][0]["sentence_embedding"])
    np.testing.assert_array_equal(embedding, cut.json()["outputs"][0]["sentence_embedding"])
    assert len(whole.json()["outputs"][0]["last_hidden_state"]) == 256  # then cut by tokens


def test_a_repeated_warning_is_said_once_per_interval_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    throttled = Throttled(logging.getLogger("test.throttle"), every=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.throttle"):
        for second in range(25):
            now[0] = float(second)
            for _ in range(100):  # 100 refusals a second
                throttled.log(logging.WARNING, "unavailable", "queue full")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "queue full",
        "queue full (and 999 more like it in the last 10 s)",
        "queue full (and 999 more like it in the last 10 s)",
    ]


@pytest.mark.parametrize(("padding", "off_loop"), [(0, False), (1_500_000, True)])
async def test_a_large_body_is_decoded_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch, padding: int, off_loop: bool
) -> None:
    """8 MB of JSON takes ~150 ms to parse: on the event loop it would stall everyone else."""
    from bucketserve.edges.http.apis import predict

    threads: list[threading.Thread] = []
    read = predict.read_predict

    def recording(*args: Any) -> Any:
        threads.append(threading.current_thread())
        return read(*args)

    monkeypatch.setattr(predict, "read_predict", recording)
    model, _ = fake_model()
    engine = Engine(Registry({model.name: model}, model.name), Settings())
    raw = b'{"sequences": [[7, 7, 7]]' + b" " * padding + b"}"  # whitespace: large, cheap
    async with serving(engine) as client:
        response = await client.post(
            "/predict", content=raw, headers={"content-type": "application/json"}
        )
    assert response.status_code == 200
    assert response.json()["outputs"][0]["total"] == 21
    assert (threads[0] is not threading.main_thread()) == off_loop


async def test_docs_are_off_unless_asked_for_and_then_need_no_cdn() -> None:
    model, _ = fake_model()
    for docs in (False, True):
        engine = Engine(Registry({model.name: model}, model.name), Settings(docs=docs))
        async with serving(engine) as client:
            page = await client.get("/docs")
            document = await client.get("/openapi.json")
            if docs:
                script = await client.get("/docs/swagger-ui-bundle.js")
                style = await client.get("/docs/swagger-ui.css")
        assert document.status_code == 200  # the contract is always there
        if not docs:
            assert page.status_code == 404
            continue
        assert page.status_code == 200
        assert "https://" not in page.text  # every asset from this server
        assert "/docs/swagger-ui-bundle.js" in page.text
        assert script.status_code == style.status_code == 200
        assert script.headers["content-type"].startswith("text/javascript")
        assert len(script.content) > 100_000
        assert "if (false)" in page.text  # no key: no prompt for one


async def test_with_a_key_the_docs_page_opens_and_asks_for_it() -> None:
    """A browser opens /docs without headers: the page and its assets are open, the page asks
    for the key and adds it to every call it makes; the document itself, which names the
    repository's models, still needs it."""
    model, _ = fake_model()
    settings = Settings(docs=True, api_key="s3cret")
    engine = Engine(Registry({model.name: model}, model.name), settings)
    async with serving(engine) as client:
        page = await client.get("/docs")
        script = await client.get("/docs/swagger-ui-bundle.js")
        unknown = await client.get("/docs/secrets.txt")
        bare = await client.get("/openapi.json")
        keyed = await client.get("/openapi.json", headers={"Authorization": "Bearer s3cret"})
    assert page.status_code == script.status_code == 200
    assert unknown.status_code == 404
    assert "if (true)" in page.text  # the prompt for the key is shown
    assert 'request.headers.Authorization = "Bearer " + key' in page.text
    assert "s3cret" not in page.text
    assert bare.status_code == 401
    assert keyed.status_code == 200
    assert model.name in keyed.text


RUNTIME_TEXT = "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: mask"


async def test_a_failing_batch_is_logged_once_and_its_clients_see_no_runtime_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model, executor = fake_model()
    executor.failure = RuntimeError(RUNTIME_TEXT)
    engine = Engine(Registry({model.name: model}, model.name), Settings())
    with caplog.at_level(logging.INFO):
        async with serving(engine) as client:
            failed = await client.post(
                "/predict", json={"sequences": [[1, 2]]}, headers={"X-Request-Id": "req-7"}
            )
            again = await client.post(
                "/predict", json={"sequences": [[3]]}, headers={"X-Request-Id": "req-8"}
            )
            executor.failure = None
            fine = await client.post("/predict", json={"sequences": [[4, 5]]})
    assert failed.status_code == again.status_code == 500
    code, message = error_of(failed)
    assert code == "inference_failed"
    assert "req-7" in message
    assert "ONNXRuntime" not in failed.text
    assert "INVALID_ARGUMENT" not in failed.text
    assert fine.status_code == 200  # the model serves on
    # the traceback, with the runtime's words and the request it failed, logged once
    said = [r for r in caplog.records if r.name == "bucketserve.core.scheduler"]
    assert len(said) == 1
    assert said[0].levelno == logging.ERROR
    assert "req-7" in said[0].getMessage()
    assert said[0].exc_info is not None
    assert RUNTIME_TEXT in str(said[0].exc_info[1])

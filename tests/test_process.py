"""The real thing: `bucketserve serve` in its own process, on a free port, then SIGTERM under
load: readiness drops, admitted requests all complete, the process exits 0."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest

from bucketserve.process.cli import lengths_from_metrics
from tests.helpers import copy_bundled, server_process, until

pytestmark = pytest.mark.slow  # the full tier: real server processes


@pytest.fixture
def models(tmp_models: Path) -> Path:
    copy_bundled(tmp_models, "tiny-encoder")
    return tmp_models


def test_serves_predict_metrics_and_readiness(models: Path) -> None:
    with server_process(models) as (process, url, log_path):
        assert httpx.get(f"{url}/v2/health/live").status_code == 200
        response = httpx.post(f"{url}/predict", json={"sequences": [[1, 2, 3], [4] * 20]})
        assert response.status_code == 200
        assert [len(o["last_hidden_state"]) for o in response.json()["outputs"]] == [3, 20]
        metrics = httpx.get(f"{url}/metrics").text
        assert 'bucketserve_requests_total{route="/predict",status="200"} 1.0' in metrics
        # the planner can read the live traffic's lengths (as histogram bucket bounds)
        assert lengths_from_metrics(f"{url}/metrics", "tiny-encoder") == [4, 20]
        assert httpx.get(f"{url}/docs").status_code == 404  # a setting, off by default
        assert "/predict" in httpx.get(f"{url}/openapi.json").json()["paths"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    lines = log_path.read_text().splitlines()
    assert any('"message": "model tiny-encoder v1: shared-session' in line for line in lines)


def test_sigterm_under_load_loses_no_admitted_request(models: Path) -> None:
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    rng = np.random.default_rng(0)
    bodies = [
        {"sequences": [[int(t) for t in rng.integers(1, 2000, n)]]}
        for n in rng.integers(1, 200, 64)
    ]

    def client(url: str, index: int) -> None:
        i = index
        while not stop.is_set():
            i += 1
            try:
                # a fresh connection per request: a refused connection is then unambiguous
                with httpx.Client(timeout=30) as http:
                    status = http.post(f"{url}/predict", json=bodies[i % len(bodies)]).status_code
                outcome = str(status)
            except httpx.ConnectError:
                outcome = "refused-connection"
                stop.wait(0.01)
            except httpx.TransportError as exc:  # a request dropped after it was sent
                outcome = f"lost: {type(exc).__name__}"
            with lock:
                outcomes[outcome] += 1

    with server_process(models, "--max-queue-delay-ms", "40") as (process, url, log_path):
        threads = [threading.Thread(target=client, args=(url, i * 7)) for i in range(8)]
        for t in threads:
            t.start()
        until(lambda: outcomes["200"] > 20, "20 answers before the drain")  # (however busy)
        served_before = outcomes["200"]
        process.send_signal(signal.SIGTERM)
        exit_code = process.wait(30)
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join(30)

    log = log_path.read_text()
    assert exit_code == 0, log
    assert served_before > 20
    # Every request the server admitted was answered and its answer reached the client. (A
    # connection accepted in the last instant but never read is closed at exit: the client
    # sees it dropped, but the server never admitted it.)
    summary = re.search(r"drained: (\d+) requests admitted since start, (\d+) answered", log)
    assert summary is not None, log
    admitted, answered = map(int, summary.groups())
    assert admitted == answered == outcomes["200"], (outcomes, admitted, answered)
    # The listener closes at SIGTERM: a new connect is refused, and every connection the server
    # accepted is answered. These clients open a connection per request, so one may complete its
    # handshake in the very instant the listener closes: the kernel resets it from its accept
    # queue, unseen by the server (seen once in ~14 runs). Keep-alive clients never meet that
    # (test_connections asserts zero resets for them).
    assert sum(n for o, n in outcomes.items() if o.startswith("lost")) <= 1, outcomes
    dropped = {"lost: ReadError", "lost: RemoteProtocolError"}
    assert set(outcomes) <= {"200", "503", "refused-connection", *dropped}, outcomes
    assert log.count('"message": "drained: ') == 1  # said once, not once per caller


def test_a_model_that_fails_to_load_stops_the_server_unless_partial(models: Path) -> None:
    broken = models / "broken"
    shutil.copytree(models / "tiny-encoder", broken)
    config = (broken / "config.toml").read_text()
    (broken / "config.toml").write_text(config.replace('role = "mask"', 'role = "maks"'))

    stopped = subprocess.run(
        [
            sys.executable,
            "-m",
            "bucketserve",
            "serve",
            "--models",
            str(models),
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert stopped.returncode == 2
    assert f"{broken / 'config.toml'}: inputs.attention_mask.role:" in stopped.stderr
    assert "--allow-partial" in stopped.stderr

    with server_process(models, "--allow-partial", "--default-model", "tiny-encoder") as (
        _,
        url,
        _log,
    ):
        assert httpx.post(f"{url}/predict", json={"sequences": [[1, 2]]}).status_code == 200
        ready = httpx.get(f"{url}/v2/models/broken/ready")
        assert ready.status_code == 503
        assert "inputs.attention_mask.role" in ready.json()["error"]


def test_ctrl_c_stops_cleanly_while_loading_and_while_serving(models: Path) -> None:
    """Ctrl-C (SIGINT) while serving ends the server at once and cleanly (exit 0); while the
    models are loading it ends it with 130, as a shell expects, and no traceback either way."""
    with server_process(models) as (process, _url, log_path):
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
    assert "Traceback" not in log_path.read_text()
    assert "ERROR" not in log_path.read_text()
    # As from a terminal: SIGINT at Python's default, whatever the suite's own process was
    # started with (a background job's children ignore SIGINT, and keep ignoring it).
    command = [
        sys.executable,
        "-c",
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from bucketserve.process.cli import main; sys.exit(main(sys.argv[1:]))",
        *("serve", "--models", str(models), "--port", "0"),
    ]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as loading:
        try:
            assert loading.stderr is not None
            for line in loading.stderr:  # (interrupted once loading has begun)
                if "bucketserve.loading" in line:
                    break
            loading.send_signal(signal.SIGINT)
            _, rest = loading.communicate(timeout=120)  # (read all: a full pipe would block it)
        finally:
            if loading.poll() is None:
                loading.kill()
                loading.wait()
    assert loading.returncode in (0, 130)  # (0: it had started serving when the signal came)
    assert "Traceback" not in rest

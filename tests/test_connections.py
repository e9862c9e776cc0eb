"""Connections to a real server process, over raw sockets: slow and silent clients are cut off
by the timeouts; HTTP/1.1 as its RFCs say (an upgrade ignored, pipelined requests answered in
order whatever follows them, exactly one valid Host, a head past its limit 431 and a request
line 414 however split, a body past the limit answered 413 that a plain client reads); the
connection cap answers 503, a malformed request gets the JSON error form, and SIGTERM under 32
keep-alive clients drains without a single reset and exits 0, however slow an upload or
however many times the signal comes."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from bucketserve.edges.http.connections import MAX_HEAD_BYTES
from loadtest import framing
from tests.helpers import error_of, server_process, until

pytestmark = pytest.mark.slow  # the full tier: real server processes

TIMEOUTS = ("--header-timeout-s", "1", "--body-timeout-s", "2")


@pytest.fixture
def models(repository: Callable[..., Path]) -> Path:
    return repository("tiny-encoder")


# A guard against a hang, not a wall-clock bound: on a loaded machine an answer may take
# seconds (a read that timed out at 10 s failed a test that passes alone), and the suite's
# own timeout stays above it.
SOCKET_TIMEOUT_S = 60


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=SOCKET_TIMEOUT_S)


def closed_at(sock: socket.socket) -> tuple[float, bytes]:
    """When the server closed the connection (monotonic clock), and what it sent before;
    ours is closed then too."""
    received = b""
    with sock:
        while chunk := sock.recv(65536):
            received += chunk
    return time.monotonic(), received


def test_slow_and_silent_clients_are_cut_off(models: Path) -> None:
    with server_process(models, *TIMEOUTS) as (_, url, log_path):
        opened = time.monotonic()
        silent = connect(url)  # says nothing at all
        slow_headers = connect(url)
        slow_headers.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n")  # and no more
        slow_body = connect(url)
        slow_body.sendall(
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"seq'
        )
        waits = [closed_at(s)[0] - opened for s in (silent, slow_headers, slow_body)]
        # the server is still answering the patient ones
        good = httpx.post(f"{url}/predict", json={"sequences": [[1, 2, 3]]})
        metrics = httpx.get(f"{url}/metrics").text
    silent_s, slow_headers_s, slow_body_s = waits  # not held forever: closed at their deadlines
    assert 0.9 < silent_s < 5, waits  # the header timeout, from the connect
    assert 0.9 < slow_headers_s < 5, waits  # the header timeout, from the first byte
    assert 1.9 < slow_body_s < 6, waits  # the body timeout, from the headers
    assert good.status_code == 200
    assert 'status="500"' not in metrics
    assert 'bucketserve_requests_total{route="/predict",status="499"} 1.0' in metrics
    assert "ERROR" not in log_path.read_text()


def test_a_request_uvicorn_cannot_parse_gets_its_routes_error_form(models: Path) -> None:
    """A refusal by the connection layer comes in the error form of the route the request
    named: TEI's on our own paths (`error` a string, `error_type`), OpenAI's on /v1 (its SDKs
    read `type`), KServe v2's on /v2 (a string)."""
    forms = {}
    bodies = {}
    with server_process(models) as (_, url, _log):
        for path in ("/predict", "/v1/embeddings", "/v2/models/tiny-encoder/infer"):
            sock = connect(url)
            sock.sendall(
                b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n\r\n"
            )
            _, answer = closed_at(sock)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400")
            assert b"content-type: application/json" in head.lower()
            assert error_of(json.loads(body))[0] == "malformed"
            bodies[path] = json.loads(body)
            forms[path] = bodies[path]["error"]
    assert isinstance(forms["/predict"], str)
    assert bodies["/predict"]["error_type"] == "Validation"
    assert forms["/v1/embeddings"]["type"] == "invalid_request_error"
    assert isinstance(forms["/v2/models/tiny-encoder/infer"], str)


def test_a_head_past_the_limit_gets_431_and_one_within_it_is_served(models: Path) -> None:
    body = b'{"sequences": [[1, 2]]}'

    def request(header_bytes: int) -> bytes:
        return (
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + b"X-Pad: "
            + b"a" * header_bytes
            + b"\r\n"
            + b"Content-Length: "
            + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n"
            + body
        )

    with server_process(models) as (_, url, _log):
        within = connect(url)
        within.sendall(request(MAX_HEAD_BYTES // 2))
        _, served = closed_at(within)
        past = connect(url)
        # Past the limit and never ending its head; one write, that the server reads whole
        # (data left unread when it closes would make its close a reset).
        past.sendall(request(2 * MAX_HEAD_BYTES)[: MAX_HEAD_BYTES + 1024])
        _, refused = closed_at(past)
        metrics = httpx.get(f"{url}/metrics").text
    assert served.startswith(b"HTTP/1.1 200"), served[:200]
    head, _, error = refused.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431")
    assert error_of(json.loads(error))[0] == "headers_too_large"
    assert 'status="500"' not in metrics


def predict_request(tokens: list[int], head: bytes = b"Host: x\r\n") -> bytes:
    """A raw POST /predict of one sequence; `head`: the header lines besides the body's."""
    body = json.dumps({"sequences": [tokens]}).encode()
    return (
        b"POST /predict HTTP/1.1\r\n"
        + head
        + b"Content-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def answers(sock: socket.socket, count: int) -> list[tuple[int, dict[str, Any]]]:
    """The next `count` answers on the connection: (status, JSON body)."""
    read = []
    with sock.makefile("rb") as stream:
        for _ in range(count):
            status = int(stream.readline().split()[1])
            length = 0
            while (line := stream.readline()) != b"\r\n":
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            read.append((status, json.loads(stream.read(length))))
    return read


def test_pipelined_requests_are_answered_in_order(models: Path) -> None:
    sequences = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    with server_process(models) as (_, url, _log):
        alone = [httpx.post(f"{url}/predict", json={"sequences": [s]}).json() for s in sequences]
        with connect(url) as sock:
            sock.sendall(b"".join(predict_request(s) for s in sequences))  # one write, three
            answered = answers(sock, 3)
    assert [status for status, _ in answered] == [200] * 3
    assert [a["outputs"] for _, a in answered] == [a["outputs"] for a in alone]


def test_an_upgrade_is_ignored_and_the_request_served_with_its_body(models: Path) -> None:
    """Java's HttpClient asks for h2c on every request: RFC 9110 lets a server ignore it, so the
    POST is served with its body, and a request pipelined behind it too."""
    h2c = b"Host: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    h2c += b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
    with server_process(models) as (_, url, _log):
        alone = [
            httpx.post(f"{url}/predict", json={"sequences": [s]}).json() for s in ([3, 4], [5])
        ]
        with connect(url) as sock:
            sock.sendall(predict_request([3, 4], h2c) + predict_request([5]))
            answered = answers(sock, 2)
    assert [status for status, _ in answered] == [200, 200]
    assert [a["outputs"] for _, a in answered] == [a["outputs"] for a in alone]


def test_garbage_after_a_good_request_is_answered_after_it_then_closed(models: Path) -> None:
    """Good, garbage and good in one write: 200 for the first, 400 for the garbage, and a
    clean close (no reset) that leaves the third unanswered."""
    with server_process(models) as (_, url, _log):
        sock = connect(url)
        sock.sendall(predict_request([1, 2]) + b"GARBAGE\r\n\r\n" + predict_request([3]))
        _, received = closed_at(sock)  # (a reset would raise)
    statuses = re.findall(rb"HTTP/1.1 (\d{3})", received)
    assert statuses == [b"200", b"400"], received[:300]
    assert b'"code":"malformed"' in received


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"", 400),  # no Host
        (b"Host: a\r\nHost: b\r\n", 400),  # two
        (b"Host: a b\r\n", 400),  # not a host
        (b"Host: [::1]:8000\r\n", 200),
        (b"Host: \r\n", 200),  # empty: a target without an authority (RFC 9112 3.2)
    ],
    ids=["missing", "twice", "invalid", "ip-literal", "empty"],
)
def test_a_request_needs_exactly_one_valid_host(models: Path, head: bytes, status: int) -> None:
    with server_process(models) as (_, url, _log), connect(url) as sock:
        sock.sendall(predict_request([1, 2], head))
        ((answered, body),) = answers(sock, 1)
    assert answered == status, body
    if status == 400:
        assert error_of(body)[0] == "malformed"


def test_an_http_1_0_request_may_have_no_host(models: Path) -> None:
    with server_process(models) as (_, url, _log), connect(url) as sock:
        sock.sendall(predict_request([1, 2], b"").replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        ((status, _),) = answers(sock, 1)
    assert status == 200


@pytest.mark.parametrize("reads", [1, 3, 40], ids=["one-read", "three-reads", "forty-reads"])
@pytest.mark.parametrize(
    ("where", "status", "code"),
    [("headers", 431, "headers_too_large"), ("url", 414, "uri_too_long")],
)
def test_a_head_past_its_limit_is_refused_however_it_is_split(
    models: Path, reads: int, where: str, status: int, code: str
) -> None:
    big = b"a" * (MAX_HEAD_BYTES + 100)
    if where == "url":
        request = b"GET /v2/health/live?" + big + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    else:
        request = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Pad: " + big + b"\r\n\r\n"
    with server_process(models) as (_, url, _log):
        sock = connect(url)
        size = -(-len(request) // reads)
        for start in range(0, len(request), size):
            try:
                sock.sendall(request[start : start + size])
            except OSError:
                break  # refused before the client was done: the answer is still there
            time.sleep(0.01)
        _, received = closed_at(sock)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status}".encode()), head
    assert error_of(json.loads(body))[0] == code


def test_zero_next_to_huge_sizes_over_v2_are_a_422(models: Path) -> None:
    """`[4294967296, 4294967296, 0]` holds no values, and was once a 500."""
    body = json.dumps(
        {
            "inputs": [
                {"name": "input_ids", "shape": [2**32, 2**32, 0], "datatype": "INT64", "data": []}
            ]
        }
    ).encode()
    head = (
        b"POST /v2/models/tiny-encoder/infer HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    with server_process(models) as (_, url, _log), connect(url) as sock:
        sock.sendall(head + body)
        ((status, answer),) = answers(sock, 1)
    assert status == 422
    assert error_of(answer)[0] == "invalid_input"


def test_a_plain_client_sending_a_body_past_the_limit_reads_its_413(models: Path) -> None:
    """urllib sends all 9 MiB (and Connection: close) before it reads: the server answers
    413 at the first bytes, then reads and drops the rest (a lingering close) instead of
    resetting the connection under the client."""
    body = b'{"sequences": [[' + b"1," * (9 * 2**19) + b"1]]}"
    with server_process(models) as (_, url, _log):
        request = urllib.request.Request(
            f"{url}/predict", data=body, headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 413
    assert error_of(json.loads(refused.value.read()))[0] == "payload_too_large"


def test_past_the_connection_cap_a_request_gets_503(models: Path) -> None:
    with server_process(models, "--max-connections", "3", "--header-timeout-s", "30") as (
        _,
        url,
        _log,
    ):
        held = [connect(url) for _ in range(3)]  # open, idle
        time.sleep(0.2)
        over = httpx.post(f"{url}/predict", json={"sequences": [[1]]})
        for sock in held:
            sock.close()
        time.sleep(0.2)
        after = httpx.post(f"{url}/predict", json={"sequences": [[1]]})
    assert over.status_code == 503
    assert error_of(over)[0] == "unavailable"
    assert over.headers["retry-after"] == "1"
    assert after.status_code == 200


def test_a_drain_under_keep_alive_clients_resets_nothing(models: Path) -> None:
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def client(url: str, index: int) -> None:
        body = {"sequences": [[(index % 50) + 1] * (5 + index % 40)]}
        with httpx.Client(timeout=30) as http:  # a keep-alive pool, reused request to request
            while not stop.is_set():
                try:
                    outcome = str(http.post(f"{url}/predict", json=body).status_code)
                except httpx.ConnectError:
                    outcome = "refused"
                    stop.wait(0.02)
                except httpx.TransportError as exc:  # reset, or closed under the request
                    outcome = f"lost: {type(exc).__name__}"
                with lock:
                    outcomes[outcome] += 1

    flags = ("--max-queue-delay-ms", "20", "--drain-timeout-s", "5")
    with server_process(models, *flags) as (process, url, log_path):
        threads = [threading.Thread(target=client, args=(url, i)) for i in range(32)]
        for t in threads:
            t.start()
        until(lambda: outcomes["200"] > 20, "20 answers before the drain")  # (however busy)
        served_before = outcomes["200"]
        process.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # clients keep posting into the drain
        stop.set()
        for t in threads:
            t.join(30)
        exit_code = process.wait(30)

    log = log_path.read_text()
    assert exit_code == 0, log
    assert served_before > 20
    assert {o for o in outcomes if o.startswith("lost")} == set(), outcomes
    assert set(outcomes) <= {"200", "503", "refused"}, outcomes
    summary = re.search(r"drained: (\d+) requests admitted since start, (\d+) answered", log)
    assert summary is not None, log
    admitted, answered = map(int, summary.groups())
    assert admitted == answered == outcomes["200"], (outcomes, admitted, answered)


def test_a_slow_upload_does_not_hold_the_exit(models: Path) -> None:
    with (
        server_process(models, *TIMEOUTS, "--drain-timeout-s", "30") as (process, url, _log),
        connect(url) as upload,
    ):
        upload.sendall(
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n{"
        )
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        for _ in range(10):  # a trickle: one byte every 0.3 s, for as long as it is let
            try:
                upload.sendall(b" ")
            except OSError:
                break
            time.sleep(0.3)
        assert process.wait(20) == 0
        took = time.monotonic() - started
    assert took < 8, took  # the body timeout (2 s), not the drain timeout (30 s)


def test_a_second_sigterm_ends_the_drain_and_still_exits_0(models: Path) -> None:
    with (
        server_process(models, "--drain-timeout-s", "60") as (process, url, _log),
        httpx.Client() as http,  # an idle keep-alive connection would hold the drain
    ):
        assert http.post(f"{url}/predict", json={"sequences": [[1]]}).status_code == 200
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert process.poll() is None  # draining, waiting on that idle connection
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
        assert time.monotonic() - started < 5


def test_every_framing_class_is_answered_as_the_rfc_says(models: Path) -> None:
    """Each class of `loadtest.framing`: valid chunked bodies (extensions and trailers
    included) answered; a malformed chunk or trailer refused 400 in the error form and the
    connection closed, at once (the server's own timeouts are minutes away here: a class that
    waited for them would be held past the test's wait); a half-closing client answered what
    it is owed, a request it cut short refused. A refused body the application had begun is
    counted as the 400 it got, never as a client that left."""
    slow = ("--header-timeout-s", "600", "--body-timeout-s", "600")
    with server_process(models, *slow) as (_, url, log_path):
        got = {case.name: framing.answers(url, case, wait_s=60) for case in framing.CASES}
        metrics = httpx.get(f"{url}/metrics").text
    assert got == {case.name: case.answers for case in framing.CASES}
    begun = [
        c for c in framing.CASES if c.answers == (400,) and c.name != "half-close within the head"
    ]
    counted = f'bucketserve_requests_total{{route="/predict",status="400"}} {len(begun)}.0'
    assert counted in metrics
    assert 'status="499"' not in metrics
    assert 'status="500"' not in metrics
    assert "ERROR" not in log_path.read_text()


def test_a_refusal_names_what_broke_in_the_routes_error_form(models: Path) -> None:
    with server_process(models) as (_, url, _log):
        sock = connect(url)
        sock.sendall(framing.chunked(b"1g\r\n"))
        _, received = closed_at(sock)
        sock = connect(url)
        sock.sendall(framing.chunked(b"5\r\n{"))
        sock.shutdown(socket.SHUT_WR)
        _, cut_short = closed_at(sock)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert b"connection: close" in head.lower()
    assert error_of(json.loads(body)) == (
        "malformed",
        "not a valid HTTP/1.1 request (Invalid character in chunk size)",
    )
    message = error_of(json.loads(cut_short.partition(b"\r\n\r\n")[2]))[1]
    assert message == "the client closed its sending side within a request's body"


def test_the_framing_comparison_runs_each_layer(models: Path, capsys: Any) -> None:
    """`python -m loadtest.framing`, briefly: every layer installed started over the same
    application, the classes sent and throughput measured; the server's own holds all."""
    assert framing.main(["--models", str(models), "--rounds", "1", "--seconds", "0.5"]) == 0
    table = capsys.readouterr().out
    held = f"| bucketserve (httptools, guarded) | {len(framing.CASES)} |"
    assert held in table
    assert "| uvicorn httptools |" in table
    assert "| uvicorn h11 |" in table

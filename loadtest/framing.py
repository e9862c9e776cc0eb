"""`python -m loadtest.framing`: HTTP/1.1 framing by the RFC, and what it costs, per connection
layer.

Each class of request a client may send about a body's framing (RFC 9112 7.1: chunks and their
sizes, extensions and trailers; a client that half-closes its side) is sent over a raw socket
and its answers read; then throughput is measured on the traffic users send (one minilm text
per `/v1/embeddings` request, base64, 16 clients in a closed loop; tiny-encoder token ids to
`/predict` where minilm is not built). The layers: the server's own (uvicorn's httptools
protocol under `bucketserve.edges.http.connections`), and, over the same application
(`loadtest.asgi_app`), uvicorn's own httptools and h11 protocols and granian (Rust, hyper),
those not installed skipped. Throughput takes turns in rounds (the machine is shared and
noisy); prints a markdown table, each layer's median against the server's own.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import re
import socket
import statistics
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from bucketserve.loading.repository import load_model_spec
from loadtest.bench import workload
from loadtest.loadgen import Connect, closed_loop, http
from loadtest.process import ROOT, running_process

BODY = b'{"sequences": [[1, 2, 3]]}'  # a valid /predict body for a model of token ids
SIZE = b"%x" % len(BODY)


def _head(framing: bytes, target: bytes = b"/predict") -> bytes:
    return (
        b"POST "
        + target
        + b" HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        + framing
        + b"\r\n"
    )


def chunked(*body: bytes) -> bytes:
    """A request whose body is sent as `body` after a chunked head."""
    return _head(b"Transfer-Encoding: chunked\r\n") + b"".join(body)


def sized(body: bytes = BODY) -> bytes:
    return _head(b"Content-Length: %d\r\n" % len(body)) + body


@dataclass(frozen=True)
class Case:
    name: str
    request: bytes  # what the client sends
    answers: tuple[int, ...]  # the statuses it must get, in order
    half_close: bool = False  # the client shuts its sending side after the request


WHOLE = (SIZE + b"\r\n", BODY, b"\r\n0\r\n\r\n")
CASES = [
    Case("chunked", chunked(*WHOLE), (200,)),
    Case("chunk extension", chunked(SIZE + b';name="v"\r\n', BODY, b"\r\n0\r\n\r\n"), (200,)),
    Case("trailer", chunked(*WHOLE[:2], b"\r\n0\r\nX-Checksum: 1\r\n\r\n"), (200,)),
    Case("size: bad character", chunked(b"1g\r\n", BODY, b"\r\n0\r\n\r\n"), (400,)),
    Case("size: a sign", chunked(b"+" + WHOLE[0], *WHOLE[1:]), (400,)),
    Case("size: 0x prefix", chunked(b"0x" + WHOLE[0], *WHOLE[1:]), (400,)),
    Case("size: space before", chunked(b" " + WHOLE[0], *WHOLE[1:]), (400,)),
    Case("size: space after", chunked(SIZE + b" \r\n", *WHOLE[1:]), (400,)),
    Case("size: overflow", chunked(b"f" * 20 + b"\r\n", *WHOLE[1:]), (400,)),
    Case("size: empty", chunked(b"\r\n", *WHOLE[1:]), (400,)),
    Case("data longer than size", chunked(b"%x\r\n" % (len(BODY) - 2), *WHOLE[1:]), (400,)),
    Case("data without CRLF", chunked(WHOLE[0], BODY, b"XX0\r\n\r\n"), (400,)),
    Case("bare LF", chunked(SIZE + b"\n", BODY, b"\n0\n\n"), (400,)),
    Case("CR in an extension", chunked(SIZE + b";a=\rb\r\n", *WHOLE[1:]), (400,)),
    Case(
        "trailer: Content-Length",
        chunked(*WHOLE[:2], b"\r\n0\r\nContent-Length: 5\r\n\r\n"),
        (400,),
    ),
    Case(
        "trailer: Transfer-Encoding",
        chunked(*WHOLE[:2], b"\r\n0\r\nTransfer-Encoding: chunked\r\n\r\n"),
        (400,),
    ),
    Case("trailer: obs-fold", chunked(*WHOLE[:2], b"\r\n0\r\nX-A: 1\r\n  2\r\n\r\n"), (400,)),
    Case(
        "trailer: a request line", chunked(*WHOLE[:2], b"\r\n0\r\nGET / HTTP/1.1\r\n\r\n"), (400,)
    ),
    Case("valid, then a malformed chunk", sized() + chunked(b"zz\r\n"), (200, 400)),
    Case("half-close after a request", sized(), (200,), half_close=True),
    Case("half-close after two", sized() + chunked(*WHOLE), (200, 200), half_close=True),
    Case("half-close within a body", sized()[:-4], (400,), half_close=True),
    Case("half-close within a chunk", chunked(WHOLE[0], BODY[:5]), (400,), half_close=True),
    Case("half-close within the head", _head(b"")[:-2], (400,), half_close=True),
]


def statuses(received: bytes) -> tuple[int, ...]:
    return tuple(int(s) for s in re.findall(rb"(?:^|\n|\})HTTP/1\.[01] (\d{3}) ", received))


def answers(url: str, case: Case, wait_s: float) -> tuple[int, ...] | str:
    """The statuses `case` gets from the server at `url`. Read until the server closes the
    connection, as it must after a refusal or a half-close; else until every answer the case
    must get is in. What a server holds open past `wait_s` instead is said in words."""
    host, port = url.removeprefix("http://").split(":")
    closes = case.half_close or case.answers[-1] >= 400
    with socket.create_connection((host, int(port)), timeout=wait_s) as sock:
        sock.sendall(case.request)
        if case.half_close:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
                if not closes and len(statuses(received)) == len(case.answers) and _whole(received):
                    break
        except TimeoutError:
            got = statuses(received)
            return f"{got or 'no answer'}, then held open past {wait_s:.0f} s"
    return statuses(received)


def _whole(received: bytes) -> bool:
    """Whether the last response in `received` is complete (by its Content-Length)."""
    head, _, body = received.rpartition(b"HTTP/1.")[2].partition(b"\r\n\r\n")
    length = re.search(rb"(?i)content-length: *(\d+)", head)
    return length is not None and len(body) >= int(length.group(1))


# -- the comparison -----------------------------------------------------------------------------


def layers(models: Path) -> dict[str, list[str]]:
    """Each connection layer's command (the port is added), those installed."""
    python = sys.executable
    app = "loadtest.asgi_app:app"
    quiet = ["--log-level", "warning"]
    found = {
        "bucketserve (httptools, guarded)": [
            python,
            "-m",
            "bucketserve",
            "serve",
            "--models",
            str(models),
        ],
        "uvicorn httptools": [
            python,
            "-m",
            "uvicorn",
            app,
            "--http",
            "httptools",
            "--no-access-log",
            *quiet,
        ],
        "uvicorn h11": [python, "-m", "uvicorn", app, "--http", "h11", "--no-access-log", *quiet],
        "granian (hyper)": [python, "-m", "granian", "--interface", "asgi", "--no-ws", *quiet, app],
    }
    modules = {"uvicorn httptools": "uvicorn", "uvicorn h11": "h11", "granian (hyper)": "granian"}
    return {
        name: command
        for name, command in found.items()
        if name not in modules or importlib.util.find_spec(modules[name]) is not None
    }


def traffic(models: Path, count: int) -> list[bytes]:
    """Requests of the traffic users send, encoded ahead: minilm texts where it is built, else
    tiny-encoder token ids."""
    if (models / "minilm" / "1" / "model.onnx").is_file():
        spec = load_model_spec(models / "minilm")
        assert spec is not None
        return workload(spec, count, "text", seed=1).embeddings
    spec = load_model_spec(models / "tiny-encoder")
    assert spec is not None
    return workload(spec, count, "tokens", seed=1).bodies


def _connect(url: str) -> Connect:
    host, port = url.removeprefix("http://").split(":")
    return http(host, int(port))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.framing", description=__doc__)
    parser.add_argument("--models", type=Path, default=ROOT / "models")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="per layer and round")
    args = parser.parse_args(argv)
    env = {"BUCKETSERVE_MODELS": str(args.models)}
    commands = layers(args.models)
    requests = traffic(args.models, 2000)
    with ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="framing-")))
        urls = {}
        for i, (name, command) in enumerate(commands.items()):
            _, urls[name] = stack.enter_context(
                running_process(command, log_path=logs / f"{i}.log", env=env)
            )
        held = {name: [_held(url, case) for case in CASES] for name, url in urls.items()}
        rates: dict[str, list[float]] = {name: [] for name in urls}
        for turn in range(args.rounds):
            names = list(urls)
            for name in names[turn % len(names) :] + names[: turn % len(names)]:
                result = asyncio.run(closed_loop(_connect(urls[name]), requests, 16, args.seconds))
                rates[name].append(result.throughput)
    ours = statistics.median(rates[next(iter(rates))])
    print(
        f"| layer | framing classes held (of {len(CASES)}) "
        f"| requests/s (median of {args.rounds}) | against ours |"
    )
    print("|---|---|---|---|")
    for name in urls:
        rate = statistics.median(rates[name])
        print(f"| {name} | {sum(held[name])} | {rate:.1f} | {rate / ours:.2f} |")
    for name in urls:
        missed = [case.name for case, ok in zip(CASES, held[name], strict=True) if not ok]
        print(f"\n{name}: misses {', '.join(missed) or 'none'}")
    return 0


def _held(url: str, case: Case) -> bool:
    return answers(url, case, wait_s=3.0) == case.answers


if __name__ == "__main__":
    raise SystemExit(main())

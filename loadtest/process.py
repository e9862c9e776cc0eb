"""`bucketserve serve` as a process of its own: started on a free port, waited on until ready,
stopped with SIGTERM. Shared by the benchmark and the end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def running_server(
    models: Path,
    *flags: str,
    log_path: Path,
    env: dict[str, str] | None = None,
    ready_within_s: float = 120,
    result_cache: bool = False,
    address_space: int | None = None,
    cgroup: Path | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`bucketserve serve` on the repository `models`: the process and its base URL, once
    /v2/health/ready answers 200, its bulk jobs kept beside the log. `result_cache`: as the
    server's default; off unless asked
    for (or `flags` give its size), since a load test replays a fixed set of requests and
    would otherwise measure the cache, not the model's path. `address_space`: the process's
    RLIMIT_AS in bytes (a hard wall: past it, an allocation fails), set before it starts;
    `cgroup`: a cgroup's folder the process runs in from its start (as a container's)."""
    command = [sys.executable, "-m", "bucketserve", "serve", "--models", str(models)]
    if address_space is not None:  # (set in the process itself, then Python again in it)
        limit = f"resource.setrlimit(resource.RLIMIT_AS, ({address_space}, {address_space}))"
        execute = "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
        wrapper = f"import os, resource, sys; {limit}; {execute}"
        command = [sys.executable, "-c", wrapper, *command[1:]]
    if cgroup is not None:  # (the shell joins it, then becomes the server: no moment outside)
        joined = f'echo $$ > {cgroup / "cgroup.procs"} && exec "$@"'
        command = ["sh", "-c", joined, "sh", *command]
    off = [] if result_cache else ["--result-cache-mb", "0"]
    jobs = ["--jobs-dir", str(log_path.parent / "jobs")]  # (never the user's own)
    command += [*off, *jobs, *flags]  # (a flag given again wins)
    with running_process(command, log_path=log_path, env=env, ready_within_s=ready_within_s) as up:
        yield up


@contextlib.contextmanager
def running_process(
    command: list[str],
    *,
    log_path: Path,
    env: dict[str, str] | None = None,
    ready_within_s: float = 120,
    cwd: Path = ROOT,
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`command --port N` on a free port N, in `cwd`: the process and its base URL, once
    /v2/health/ready answers 200. On exit a process still running gets SIGTERM (a graceful
    drain), then is killed if it does not stop."""
    port = free_port()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*command, "--port", str(port)],
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_within_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited: {log_path.read_text()[-3000:]}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{url}/v2/health/ready", timeout=1),
            ):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready after {ready_within_s:.0f} s")
            time.sleep(0.1)
        yield process, url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)

"""A small asyncio load generator for the benchmark: closed and open loops over connections
that send requests encoded ahead of time (HTTP/1.1 keep-alive here; gRPC in `grpc_loadgen`).

Requests are bytes made before the run, so that the client spends as little CPU as possible on
a machine whose cores the server needs. Its own CPU time is measured and reported with every
result. Latency in open-loop runs counts from each request's scheduled arrival, so a client
that falls behind shows up as latency, not as a lower offered load.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


def encode_post(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)  # seconds, answered with 200
    errors: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0
    client_cpu_s: float = 0.0

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.wall_s if self.wall_s else 0.0

    def percentile_ms(self, p: float) -> float | None:
        return float(np.percentile(self.latencies, p) * 1000) if self.latencies else None

    @property
    def client_cores(self) -> float:
        return self.client_cpu_s / self.wall_s if self.wall_s else 0.0


class Connection(Protocol):
    async def send(self, raw: bytes) -> str | None:
        """One request, its whole answer read: None when it succeeded, else what it got
        instead (an HTTP status, a gRPC code)."""

    async def close(self) -> None: ...


Connect = Callable[[], Awaitable[Connection]]


class HttpConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send(self, raw: bytes) -> str | None:
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = lines[0].split(" ", 2)[1]
        length = next(
            int(line.split(":", 1)[1])
            for line in lines
            if line.lower().startswith("content-length:")
        )
        await self.reader.readexactly(length)
        return None if status == "200" else status

    async def close(self) -> None:
        self.writer.close()


def http(host: str, port: int) -> Connect:
    """Opens keep-alive HTTP/1.1 connections to host:port (requests from `encode_post`)."""

    async def connect() -> Connection:
        return HttpConnection(*await asyncio.open_connection(host, port))

    return connect


async def closed_loop(
    connect: Connect, requests: list[bytes], concurrency: int, duration_s: float
) -> Result:
    """`concurrency` clients, each sending its next request as soon as the last is answered."""
    result = Result()
    stop_at = time.perf_counter() + duration_s

    async def client(offset: int) -> None:
        conn = await connect()
        i = offset
        try:
            while time.perf_counter() < stop_at:
                start = time.perf_counter()
                failure = await conn.send(requests[i % len(requests)])
                if failure is None:
                    result.latencies.append(time.perf_counter() - start)
                else:
                    result.errors[failure] += 1
                i += concurrency
        finally:
            await conn.close()

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(concurrency)))
    result.wall_s = time.perf_counter() - wall
    result.client_cpu_s = time.process_time() - cpu
    return result


async def open_loop(
    connect: Connect,
    requests: list[bytes],
    rate: float,
    duration_s: float,
    seed: int = 0,
    max_connections: int = 512,
) -> Result:
    """Poisson arrivals at `rate` per second, whatever the server's speed."""
    result = Result()
    rng = random.Random(seed)
    idle: list[Connection] = []
    opened = 0
    tasks: set[asyncio.Task[None]] = set()

    async def one(raw: bytes, scheduled: float) -> None:
        nonlocal opened
        reused = bool(idle)
        if idle:
            conn = idle.pop()
        elif opened < max_connections:
            opened += 1
            conn = await connect()
        else:
            result.errors["client: out of connections"] += 1
            return
        try:
            try:
                failure = await conn.send(raw)
            except (ConnectionError, asyncio.IncompleteReadError):
                if not reused:
                    raise
                # The server closed this idle keep-alive connection (its keep-alive timeout)
                # before the request reached it: what any HTTP client does, reconnect and resend.
                await conn.close()
                conn = await connect()
                failure = await conn.send(raw)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            result.errors[f"client: {type(exc).__name__}"] += 1
            await conn.close()
            return
        if failure is None:
            result.latencies.append(time.perf_counter() - scheduled)
        else:
            result.errors[failure] += 1
        idle.append(conn)

    cpu, start = time.process_time(), time.perf_counter()
    arrival, i = start, 0
    while arrival < start + duration_s:
        delay = arrival - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(requests[i % len(requests)], arrival))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        i += 1
        arrival += rng.expovariate(rate)
    await asyncio.gather(*tasks)
    result.wall_s = time.perf_counter() - start
    result.client_cpu_s = time.process_time() - cpu
    for conn in idle:
        await conn.close()
    return result

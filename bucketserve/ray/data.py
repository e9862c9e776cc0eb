"""A corpus embedded over a Ray cluster: `Embed`, a callable class for Ray Data's
`Dataset.map_batches`, so that a parquet or JSONL corpus runs on every node with Ray's own
progress, retries and output writers:

    ds = ray.data.read_parquet("corpus.parquet")
    ds.map_batches(Embed, fn_constructor_kwargs={"models": "/shared/models"},
                   concurrency=4, num_cpus=2, batch_size=1024).write_parquet("embedded/")

Each actor is one engine over the repository, as a replica is (`process.wiring`), running on
its own event loop thread. Each block's texts are tokenised once, sorted by length, and sent
in that order, 64 at a time, as a bulk job's lines are (`bucketserve.jobs.sender`): each is
a `/v1/embeddings` request given to that route's own function by the process's in-process
dispatch, at the bulk level, so every vector equals the server's answer for that text. A
text the route refuses (empty, or too long where auto_truncate is off) gets NaNs and its
error in the `error` column; the others are unaffected.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import orjson
import ray

from bucketserve.core.task import Task
from bucketserve.jobs import ordering
from bucketserve.jobs.sender import IN_FLIGHT, send
from bucketserve.process.wiring import running, wire
from bucketserve.ray.options import read_settings

T = TypeVar("T")
ROUTE = "/v1/embeddings"
TENANT = "ray-data"  # (a job's tenant: its lines wait at the bulk level, after live traffic)


class Embed:
    def __init__(
        self,
        models: str | Path = "models",
        model: str | None = None,
        column: str = "text",
        output: str = "embedding",
        **settings: Any,
    ) -> None:
        """`models`: the repository (on every node); `model`: the embedding model (default:
        the repository's); `column`: the texts; `output`: the vectors' column; `settings`:
        any `serve` setting, as `bucketserve.ray:app` takes them."""
        self.column, self.output, self.model = column, output, model
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")  # type: ignore[no-untyped-call]
        self.wired = wire(read_settings({"models": str(models), **settings}, cpus))
        engine = self.wired.engine
        self.dispatch = self.wired.dispatch  # (the routes in process, as a batch's lines go)
        self.embedder = engine.model(model, task=Task.EMBED)
        rule = self.embedder.info.rule(Task.EMBED)
        self.width = rule.width if rule is not None else 0
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="bucketserve", daemon=True).start()
        self._running = running(engine, self.wired.control, self.wired.metrics)
        self._on_loop(self._running.__aenter__())

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The block with its vectors (`output`, float32, one row a text) and `error`
        (empty where the text was answered)."""
        texts = [str(text) for text in batch[self.column]]
        answers = self._on_loop(self._embedded(texts))
        vectors = np.full((len(texts), self.width), np.nan, np.float32)
        errors = np.full(len(texts), "", dtype=object)
        for i, (status, body) in enumerate(answers):
            if 200 <= status < 300:
                vectors[i] = orjson.loads(body)["data"][0]["embedding"]
            else:
                errors[i] = f"{status}: {body.decode(errors='replace')}"
        return {**batch, self.output: vectors, "error": errors}

    async def _embedded(self, texts: list[str]) -> list[tuple[int, bytes]]:
        """Each text's answer from the route, sent longest-last, `IN_FLIGHT` at a time."""
        named = {"model": self.model} if self.model is not None else {}
        bodies = [orjson.dumps({"input": text, **named}) for text in texts]
        room = asyncio.Semaphore(IN_FLIGHT)
        answers: list[tuple[int, bytes]] = [(0, b"")] * len(texts)

        async def one(i: int) -> None:
            async with room:
                answers[i] = await self._answer(bodies[i], i)

        order = ordering.order(ordering.body_lengths(bodies, self.embedder))
        await asyncio.gather(*(one(int(i)) for i in order))
        return answers

    async def _answer(self, body: bytes, i: int) -> tuple[int, bytes]:
        """The route's answer; sent again while the engine has no room for it (`send`)."""
        reply = await send(self.dispatch, ROUTE, body, TENANT, f"embed-{i}")
        assert reply is not None  # (never halted)
        return reply.status, reply.body

    def _on_loop(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def __del__(self) -> None:
        """The engine drained and stopped when Ray lets the actor go."""
        if hasattr(self, "_running") and self._loop.is_running():
            self._on_loop(self._running.__aexit__(None, None, None))
            self._loop.call_soon_threadsafe(self._loop.stop)

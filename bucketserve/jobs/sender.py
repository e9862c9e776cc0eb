"""A bulk request sent through the one request path, in process: a `Dispatch` (the HTTP
edge's routes' own functions, which the process makes and hands to the jobs, `batch run` and
Ray Data) and the one rule of sending bulk work (`send`): a request the server has no room
for now (503: a queue full; or 504) is sent again later, each wait twice the last, up to
RETRY_S[1]. Bulk work waits for room; it is never refused for the lack of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, Protocol

IN_FLIGHT = 64  # requests sent at once: two of a long bucket's batches, in order of length
RETRY_S = (0.05, 2.0)  # a request the server had no room for: first wait, longest wait
RETRIED = (503, 504)


class Reply(NamedTuple):
    """A route's answer to one request: its status and body, and the fingerprint of the
    model version that answered (None where none ran: a body refused before the model)."""

    status: int
    body: bytes
    fingerprint: str | None = None


class Dispatch(Protocol):
    """POST a JSON body to a route, in process, as a bulk job's request (`tenant`'s)."""

    @property
    def paths(self) -> Sequence[str]:
        """The routes it sends to: those a batch may run, in the order the Batch API says."""

    def __call__(
        self, path: str, body: bytes, tenant: str, request_id: str
    ) -> Awaitable[Reply]: ...


def never() -> bool:
    return False


async def send(
    dispatch: Dispatch,
    path: str,
    body: bytes,
    tenant: str,
    request_id: str,
    halted: Callable[[], bool] = never,
) -> Reply | None:
    """The route's reply to `body`, sent again while the server has no room for it (None:
    `halted` said to stop first)."""
    wait = RETRY_S[0]
    while True:
        reply = await dispatch(path, body, tenant, request_id)
        if reply.status not in RETRIED:
            return reply
        if halted():
            return None
        await asyncio.sleep(wait)
        wait = min(wait * 2, RETRY_S[1])

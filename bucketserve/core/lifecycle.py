"""The engine's one lifecycle state: serving, then draining. Every scheduler reads it at
admission, those started after the drain began included, and model control and its poller
wait on it; nothing keeps a draining flag of its own. Imports nothing of the project.
"""

from __future__ import annotations

import asyncio


class Lifecycle:
    def __init__(self) -> None:
        self._draining = asyncio.Event()

    @property
    def draining(self) -> bool:
        """Whether new work is refused (SIGTERM came): it stays so until the process ends."""
        return self._draining.is_set()

    def drain(self) -> None:
        self._draining.set()

    async def until_draining(self) -> None:
        await self._draining.wait()

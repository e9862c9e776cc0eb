"""The engine's one lifecycle state: starting, then serving, then draining. Readiness reads it;
every scheduler reads it at admission, those started after the drain began included, and
model control and its poller wait on it; nothing keeps a state of its own. Imports nothing of
the project.
"""

from __future__ import annotations

import asyncio
from enum import Enum


class State(Enum):
    STARTING = "starting"  # models loaded, schedulers not running yet: not ready
    SERVING = "serving"  # ready: requests are admitted
    DRAINING = "draining"  # SIGTERM came: new work is refused until the process ends


class Lifecycle:
    def __init__(self) -> None:
        self.state = State.STARTING
        self._draining = asyncio.Event()

    @property
    def serving(self) -> bool:
        """Whether it takes traffic (readiness)."""
        return self.state is State.SERVING

    @property
    def draining(self) -> bool:
        """Whether new work is refused (SIGTERM came): it stays so until the process ends."""
        return self.state is State.DRAINING

    def serve(self) -> None:
        """Serving from now on, unless a drain already began (it is never undone)."""
        if self.state is State.STARTING:
            self.state = State.SERVING

    def drain(self) -> None:
        self.state = State.DRAINING
        self._draining.set()

    async def until_draining(self) -> None:
        await self._draining.wait()

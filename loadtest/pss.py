"""A process's memory as the load tests, the benchmarks and the memory tests read it: its
proportional set size (Pss, /proc/PID/smaps_rollup: shared pages split between the processes
that map them), never RSS, which counts the memory-mapped weights in full in every process
that maps them; once, or sampled while a block runs."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path


def pss(pid: int) -> int:
    """The process's Pss in bytes; 0 once it has gone."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def pss_sampled(pid: int, every_s: float = 0.02) -> Iterator[list[int]]:
    """The process's Pss read when the block starts, every `every_s` while it runs and when it
    ends (the list fills: its max is the peak)."""
    samples = [pss(pid)]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(every_s):
            samples.append(pss(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield samples
    finally:
        done.set()
        sampler.join()
        samples.append(pss(pid))

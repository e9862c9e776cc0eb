"""What the process holds and may hold, as the system charges it: the memory limit it runs
under (a container's cgroup, v2 or v1, else the machine's memory), what it holds now, and the
peak a run reaches above it. Read from /proc and /sys; Linux only (elsewhere: no limit, and a
peak read from the resident size alone).

The peak of a run is the resident high-water mark (`VmHWM`), reset just before the run by
writing 5 to /proc/self/clear_refs: exact, whatever the run allocates and frees inside, and
what a cgroup charges (anonymous pages) or an address-space limit counts (ONNX Runtime maps
what it allocates without its arena and touches all of it).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

CGROUP = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 60  # (cgroup v1 writes "no limit" as a page-rounded 2^63 - 1)
SAMPLE_S = 0.001  # where the high-water mark cannot be reset: how often the size is read


def _status(field: str) -> int | None:
    """A size in /proc/self/status (VmRSS, VmHWM), in bytes; None where there is none."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None


def resident() -> int:
    """The process's resident size now, in bytes (0 where it cannot be read)."""
    return _status("VmRSS") or 0


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_of(run: Callable[[], T]) -> tuple[T, int]:
    """`run()`'s result, and the most it held at once above what the process held before,
    in bytes (the resident high-water mark; sampled every millisecond where it cannot be
    reset)."""
    before = resident()
    if _reset_peak():
        result = run()
        return result, max(0, (_status("VmHWM") or before) - before)
    highest = before
    done = threading.Event()

    def sample() -> None:
        nonlocal highest
        while not done.is_set():
            highest = max(highest, resident())
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = run()
    finally:
        done.set()
        sampler.join()
    return result, max(0, max(highest, resident()) - before)


@dataclass(frozen=True)
class Limit:
    """The memory the process runs under: `limit` bytes in all, `held` of them taken now
    (by the whole cgroup, or the machine's other users), named by `source`."""

    limit: int
    held: int
    source: str

    @property
    def room(self) -> int:
        return max(0, self.limit - self.held)


def _read_int(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().split()[0])
    return None


def _cgroup_dirs(controller: str, membership: Path, root: Path) -> list[Path]:
    """The folders of this process's cgroup (as `membership`, /proc/self/cgroup, names it,
    under `root`): v2's unified one, or v1's `controller`'s."""
    found: list[Path] = []
    with contextlib.suppress(OSError, ValueError):
        for line in membership.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            relative = path.lstrip("/")
            if controllers == "":
                found += [root / relative, root / "unified" / relative]
            elif controller in controllers.split(","):
                found += [root / controller / relative, root / controller]
    return found


def container_limit(
    membership: Path = Path("/proc/self/cgroup"), root: Path = CGROUP
) -> Limit | None:
    """The cgroup's memory limit and what the cgroup holds, v2 (`memory.max`,
    `memory.current`) or v1 (`memory.limit_in_bytes`, `memory.usage_in_bytes`); None when
    the process runs under none."""
    for folder in _cgroup_dirs("memory", membership, root):
        v2 = (folder / "memory.max", folder / "memory.current", "cgroup v2 memory.max")
        v1 = (
            folder / "memory.limit_in_bytes",
            folder / "memory.usage_in_bytes",
            "cgroup v1 memory.limit_in_bytes",
        )
        for limit_file, usage_file, source in (v2, v1):
            limit, usage = _read_int(limit_file), _read_int(usage_file)
            if limit is not None and usage is not None and limit < UNLIMITED:
                return Limit(limit, usage, source)
    return None


def machine_limit() -> Limit | None:
    """The machine's memory, and what its other users hold (total less available)."""
    values: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, rest = line.split(":", 1)
            values[name] = int(rest.split()[0]) * 1024
    if "MemTotal" not in values or "MemAvailable" not in values:
        return None
    total = values["MemTotal"]
    return Limit(total, total - values["MemAvailable"], "the machine's memory")


def memory_limit() -> Limit | None:
    """What bounds the process's memory: its container's limit, else the machine's."""
    return container_limit() or machine_limit()


def map_large_allocations(threshold: int = 256 << 10) -> None:
    """Allocations of at least `threshold` bytes mapped on their own and unmapped when freed
    (glibc otherwise raises its threshold to the largest block freed, up to 32 MiB, and
    keeps smaller blocks in its heap after they are freed): a batch run without ONNX
    Runtime's arena gives back what it took. Nothing where the C library is not glibc."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, threshold)  # M_MMAP_THRESHOLD (also turns off its dynamic raise)
        libc.mallopt(-1, 2 * threshold)  # M_TRIM_THRESHOLD: trim the heap's top past this

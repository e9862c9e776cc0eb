"""A running batch's plan, on disk beside its output (`batches/ID/order.npz`): the order its
requests run in, each one's length, and where each lies in the input file (its offset and
size), written once validated and read back at every start. What a batch holds in memory
while it runs is these arrays, 32 bytes a request; a request's bytes are read from the file
when it is sent (`lines.Requests`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bucketserve.jobs.lines import raw_lines

PLAN = "order.npz"


@dataclass(frozen=True)
class Plan:
    order: np.ndarray  # the requests' indices, in the order they run
    lengths: np.ndarray  # each request's length in tokens
    offsets: np.ndarray  # where each request's line starts in the input file
    sizes: np.ndarray  # and its bytes


def write_plan(folder: Path, plan: Plan) -> None:
    """`plan` kept in `folder`, whole or not at all (OSError: it could not be written)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = folder / ("writing-" + PLAN)
    try:
        with written.open("wb") as file:
            np.savez(file, order=plan.order, lengths=plan.lengths, offsets=plan.offsets,
                     sizes=plan.sizes)  # fmt: skip
            file.flush()
            os.fsync(file.fileno())
        os.replace(written, folder / PLAN)
    except OSError:
        written.unlink(missing_ok=True)
        raise


def read_plan(folder: Path, source: Path) -> Plan:
    """The plan kept in `folder` for the input file `source` (OSError: it is gone)."""
    with np.load(folder / PLAN) as kept:
        if "offsets" in kept:
            return Plan(kept["order"], kept["lengths"], kept["offsets"], kept["sizes"])
        order, lengths, numbers = kept["order"], kept["lengths"], kept["numbers"]
    # (a plan of an earlier version: its requests by line number, found in the file again)
    places = {number: (offset, len(raw)) for number, offset, raw in raw_lines(source)}
    offsets, sizes = np.array([places[n] for n in numbers.tolist()], np.int64).reshape(-1, 2).T
    return Plan(order, lengths, offsets.copy(), sizes.copy())

"""Request length distributions, shared by the benchmark and the locust users.

A distribution is named by a short spec, as on the command line:

- `natural`: long-tailed like sentence lengths in tokens (lognormal, median ~22, p99 ~130),
  clipped to 4..longest. The default workload.
- `fixed:N`: every sequence N long.
- `uniform:LO:HI`: uniform over LO..HI, both included.
- `file:PATH`: drawn (with replacement) from observed lengths, one per line, the format that
  `bucketserve plan --lengths` reads.

Every draw is clipped to the model's longest bucket, so a sample is always servable.
`python -m loadtest.lengths SPEC COUNT` prints a sample, one length per line.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bucketserve.loading.planner import read_lengths

SPECS = "natural | fixed:N | uniform:LO:HI | file:PATH"


@dataclass(frozen=True)
class LengthDistribution:
    spec: str
    longest: int
    observed: tuple[int, ...] = ()  # file: the observed lengths

    @classmethod
    def parse(cls, spec: str, longest: int) -> LengthDistribution:
        kind, _, rest = spec.partition(":")
        try:
            if kind == "natural" and not rest:
                return cls(spec, longest)
            if kind == "fixed":
                _positive(rest, 1)
                return cls(spec, longest)
            if kind == "uniform":
                lo, hi = _positive(rest, 2)
                if lo > hi:
                    raise ValueError("LO is above HI")
                return cls(spec, longest)
            if kind == "file":
                return cls(spec, longest, tuple(read_lengths(Path(rest))))
        except (ValueError, OSError) as exc:
            raise ValueError(f"length distribution {spec!r}: {exc}") from None
        raise ValueError(f"unknown length distribution {spec!r}; expected {SPECS}")

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """`count` lengths, each in 1..longest."""
        kind, _, rest = self.spec.partition(":")
        drawn: np.ndarray
        if kind == "natural":
            drawn = np.clip(np.round(rng.lognormal(3.1, 0.75, count)), 4, self.longest)
        elif kind == "fixed":
            drawn = np.full(count, int(rest))
        elif kind == "uniform":
            lo, hi = (int(x) for x in rest.split(":"))
            drawn = rng.integers(lo, hi + 1, count)
        else:
            drawn = rng.choice(np.asarray(self.observed), count)
        return np.clip(drawn, 1, self.longest).astype(int)


def _positive(text: str, count: int) -> list[int]:
    parts = text.split(":")
    if len(parts) != count or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"expected {count} positive integer(s) after the colon")
    return [int(p) for p in parts]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.lengths", description="Print a length sample, one per line."
    )
    parser.add_argument("spec", help=SPECS)
    parser.add_argument("count", type=int)
    parser.add_argument("--longest", type=int, default=256, help="clip to this length")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        lengths = LengthDistribution.parse(args.spec, args.longest)
    except ValueError as exc:
        parser.error(str(exc))
    print("\n".join(map(str, lengths.sample(np.random.default_rng(args.seed), args.count))))


if __name__ == "__main__":
    main()

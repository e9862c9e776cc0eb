"""`python -m loadtest.revisions REV`: the server as it was at a git revision against the
working tree, on the same traffic, taking turns: what a change cost, as a ratio from one run.

Both servers run from their own source (the revision checked out into a temporary git
worktree) in this environment, on this repository's models, with OTEL_* variables removed (so
that tracing is off in both). The traffic is `tiny-encoder` token ids by default: a small model
leaves the server's own per-request work the largest share, so that is where a change to the
request path shows most. Each round measures both at saturation (closed loop), in alternating
order; the figure is the ratio of the medians, with each round's ratio beside it.

    python -m loadtest.revisions HEAD~1 --rounds 6 --seconds 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from loadtest.bench import token_ids_over_http
from loadtest.lengths import LengthDistribution
from loadtest.loadgen import closed_loop, http
from loadtest.process import ROOT, running_process

CLIENTS = 16


@contextlib.contextmanager
def checked_out(revision: str) -> Iterator[Path]:
    """`revision`'s tree in a temporary git worktree, removed afterwards."""
    with tempfile.TemporaryDirectory() as folder:
        tree = Path(folder) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(tree), revision], cwd=ROOT, check=True
        )
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=True
            )


@contextlib.contextmanager
def server(source: Path, model: str, log: Path) -> Iterator[int]:
    """The server of `source` on this repository's models: its port, once ready. (It runs in
    `source`, whose package then comes first on the path, before the installed one; before
    the package was named `bucketserve`, it was `serve`.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(source)
    module = "bucketserve" if (source / "bucketserve").is_dir() else "serve.process.cli"
    command = [sys.executable, "-m", module, "serve", "--models", str(ROOT / "models")]
    command += ["--default-model", model, "--log-level", "warning"]
    with running_process(command, log_path=log, env=env, cwd=source) as (_, url):
        yield int(url.rsplit(":", 1)[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.revisions", description=__doc__)
    parser.add_argument("revision", help="the git revision to measure the working tree against")
    parser.add_argument("--model", default="tiny-encoder")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=8.0, help="each turn at saturation")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    lengths = LengthDistribution.parse("natural", 256).sample(rng, 2000)
    sequences = [rng.integers(1000, 2000, int(n)) for n in lengths]
    bodies = token_ids_over_http(sequences, ["sentence_embedding"])
    results: dict[str, list[float]] = {"before": [], "after": []}
    with (
        tempfile.TemporaryDirectory() as logs,
        checked_out(args.revision) as before,
        server(before, args.model, Path(logs) / "before.log") as old,
        server(ROOT, args.model, Path(logs) / "after.log") as new,
    ):
        ports = {"before": old, "after": new}
        for port in ports.values():  # warm both
            asyncio.run(closed_loop(http("127.0.0.1", port), bodies, CLIENTS, 2))
        for turn in range(args.rounds):
            order = ["before", "after"] if turn % 2 == 0 else ["after", "before"]
            for name in order:
                loop = closed_loop(http("127.0.0.1", ports[name]), bodies, CLIENTS, args.seconds)
                results[name].append(asyncio.run(loop).throughput)
            print(
                f"round {turn + 1}: before {results['before'][-1]:.1f}, "
                f"after {results['after'][-1]:.1f} seq/s",
                file=sys.stderr,
            )
    before_s, after_s = (statistics.median(results[n]) for n in ("before", "after"))
    each = [a / b for a, b in zip(results["after"], results["before"], strict=True)]
    print(
        f"{args.model}, {CLIENTS} clients, {args.rounds} rounds of {args.seconds:.0f} s: "
        f"{args.revision} {before_s:.1f} seq/s, working tree {after_s:.1f} seq/s: "
        f"{after_s / before_s:.3f}x (rounds {', '.join(f'{r:.3f}' for r in each)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

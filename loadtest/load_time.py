"""`python -m loadtest.load_time`: how long a model takes to load, the invariance check included.

Each run is a fresh process (a warm page cache, a cold interpreter and ONNX Runtime): the
model's spec is read, then the model built (file, session, layout, check, executor, warm
keys), timed by the builder itself; then, separately, a whole `bucketserve serve` process is
started on the model alone and timed until it answers ready. Prints medians and every run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loadtest.process import ROOT, running_server

ONE_LOAD = """
import json, sys, time
from pathlib import Path
began = time.perf_counter()
from bucketserve.loading import build_model, load_model_spec
from bucketserve.runtime.sessions import init_process
imported = time.perf_counter()
init_process()
spec = load_model_spec(Path(sys.argv[1]))
specced = time.perf_counter()
model = build_model(spec, sys.argv[2] if len(sys.argv) > 2 else None)
loaded = model.info.served_config["load_seconds"]
print(json.dumps({"import": imported - began, "spec": specced - imported, **loaded}))
"""


def load_runs(model_dir: Path, runs: int, binding: str | None) -> list[dict[str, float]]:
    found = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", ONE_LOAD, str(model_dir), *([binding] if binding else [])],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        found.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return found


def ready_runs(model_dir: Path, runs: int) -> list[float]:
    """Seconds from `bucketserve serve` starting to /v2/health/ready answering 200."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "models"
        shutil.copytree(model_dir, root / model_dir.name, symlinks=True)
        found = []
        for _ in range(runs):
            began = time.monotonic()
            with running_server(root, log_path=Path(scratch) / "server.log"):
                found.append(time.monotonic() - began)
        return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.load_time", description=__doc__)
    parser.add_argument("--model", default="minilm", help="a model folder of models/")
    parser.add_argument("--models", type=Path, default=ROOT / "models")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--binding", help="override the config's binding")
    args = parser.parse_args(argv)
    model_dir = args.models / args.model
    loads = load_runs(model_dir, args.runs, args.binding)
    ready = ready_runs(model_dir, args.runs)
    median = {k: statistics.median(run[k] for run in loads) for k in loads[0]}
    print(json.dumps({"model": args.model, "median": median, "ready_s": ready, "runs": loads}))
    print(
        f"{args.model}: spec {median['spec']:.3f} s, model built {median['total']:.3f} s "
        f"(the check {median['check']:.3f} s); a server process ready in "
        f"{statistics.median(ready):.2f} s (medians of {args.runs})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

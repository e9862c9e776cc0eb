"""`python -m loadtest.locust_run`: a whole headless locust run against a server of its own.

Starts `bucketserve serve` on a free port, runs locust headless against it (steady users, or
the step-load shape with --step-users), stops both, and leaves in --out:

- locust's CSVs (`locust_stats.csv` per bucket, `locust_stats_history.csv` every second,
  `locust_failures.csv`) and its HTML report;
- `report.png`: throughput, users and latency percentiles over time;
- `report.md`: the per-bucket table, and the CPU that locust and the server used (locust
  shares the machine with the server, so its share is part of the truth);
- `server.log`.

The exit status is locust's: non-zero when any request failed.
"""

from __future__ import annotations

import argparse
import csv
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from loadtest.lengths import SPECS
from loadtest.process import ROOT, running_server

HERE = Path(__file__).resolve().parent
PERCENTILES = ("50%", "95%", "99%")


def locust_command(args: argparse.Namespace, url: str) -> list[str]:
    files = [HERE / "locustfile.py"]
    load = ["-u", str(args.users), "-r", str(args.users), "-t", f"{args.duration}s"]
    if args.step_users:
        files.append(HERE / "step_shape.py")
        load = [
            "--step-users", str(args.step_users),
            "--step-seconds", str(args.step_seconds),
            "--steps", str(args.steps),
        ]  # fmt: skip
    return [
        sys.executable, "-m", "locust",
        "-f", ",".join(map(str, files)),
        "--headless", "--host", url, "--only-summary", "--loglevel", "WARNING",
        "--csv", str(args.out / "locust"), "--csv-full-history",
        "--html", str(args.out / "locust.html"),
        "--lengths", args.lengths, "--payload", args.payload, "--outputs", args.outputs,
        *(["--model", args.model] if args.model else []),
        *load,
    ]  # fmt: skip


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # locust writes N/A before a window has data
        return None


def plot(history: list[dict[str, str]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in history if r["Name"] == "Aggregated"]
    start = int(rows[0]["Timestamp"]) if rows else 0
    t = [int(r["Timestamp"]) - start for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    top.plot(t, [_number(r["Requests/s"]) for r in rows], label="requests/s")
    top.plot(t, [_number(r["Failures/s"]) for r in rows], label="failures/s", color="red")
    top.set_ylabel("requests/s")
    users = top.twinx()
    users.step(t, [int(r["User Count"]) for r in rows], color="grey", where="post", alpha=0.6)
    users.set_ylabel("users", color="grey")
    top.legend(loc="upper left")
    for p in PERCENTILES:
        bottom.plot(t, [_number(r[p]) for r in rows], label=f"p{p.rstrip('%')}")
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("seconds")
    bottom.legend(loc="upper left")
    top.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _bucket_order(row: dict[str, str]) -> tuple[int, str]:
    """Bucket rows by edge (`/predict [<=32]`), then setup and the total."""
    edge = row["Name"].rpartition("[<=")[2].rstrip("]")
    return (int(edge) if edge.isdigit() else 1 << 30, row["Name"])


def report(stats: list[dict[str, str]], cpu: dict[str, float], title: str) -> str:
    lines = [
        f"# {title}",
        "",
        "| request | count | failures | req/s | p50 ms | p95 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in sorted(stats, key=_bucket_order):
        lines.append(
            f"| {row['Name']} | {row['Request Count']} | {row['Failure Count']} | "
            f"{float(row['Requests/s']):.1f} | {row['50%']} | {row['95%']} | {row['99%']} | "
            f"{row['100%']} |"
        )
    lines += [
        "",
        f"CPU over the run: locust {cpu['locust_cores']:.2f} cores, "
        f"server {cpu['server_cores']:.2f} cores, of {psutil.cpu_count()}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.locust_run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--models", type=Path, default=ROOT / "models")
    parser.add_argument("--model", default="", help="default: the repository's default model")
    parser.add_argument("--lengths", default="natural", help=SPECS)
    parser.add_argument("--payload", choices=["sequences", "text"], default="sequences")
    parser.add_argument("--outputs", default="", help="comma-separated outputs to ask for")
    parser.add_argument("--users", type=int, default=16, help="steady load: this many users")
    parser.add_argument("--duration", type=float, default=60.0, help="steady load: seconds")
    parser.add_argument("--step-users", type=int, default=0, help="step load: users per step")
    parser.add_argument("--step-seconds", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("locust-results"))
    parser.add_argument("--smoke", action="store_true", help="a few seconds: for tests")
    parser.add_argument("server_flags", nargs="*", help="after --: flags for bucketserve serve")
    args = parser.parse_args(argv)
    if args.smoke:
        args.users, args.duration, args.step_seconds, args.steps = 4, 3.0, 2.0, 2
    args.out = args.out.resolve()  # locust runs from the project root
    args.out.mkdir(parents=True, exist_ok=True)

    flags = [*(["--default-model", args.model] if args.model else []), *args.server_flags]
    with running_server(args.models, *flags, log_path=args.out / "server.log") as (server, url):
        server_cpu = psutil.Process(server.pid).cpu_times()
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.monotonic()
        status = subprocess.run(locust_command(args, url), cwd=ROOT, check=False).returncode
        wall = time.monotonic() - began
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        server_now = psutil.Process(server.pid).cpu_times()
    cpu = {
        "locust_cores": (
            children.ru_utime + children.ru_stime
            - children_before.ru_utime - children_before.ru_stime
        ) / wall,
        "server_cores": (
            server_now.user + server_now.system - server_cpu.user - server_cpu.system
        ) / wall,
    }  # fmt: skip
    load = (
        f"{args.steps} steps of {args.step_users} users, {args.step_seconds:.0f} s each"
        if args.step_users
        else f"{args.users} users for {args.duration:.0f} s"
    )
    title = f"bucketserve under locust: {args.model or 'default model'}, {args.lengths}, {load}"
    stats: list[dict[str, Any]] = read_csv(args.out / "locust_stats.csv")
    plot(read_csv(args.out / "locust_stats_history.csv"), args.out / "report.png", title)
    (args.out / "report.md").write_text(report(stats, cpu, title))
    print(f"{args.out}: report.md, report.png, locust CSVs (locust exit status {status})")
    return status


if __name__ == "__main__":
    sys.exit(main())

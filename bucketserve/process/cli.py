"""The `bucketserve` command: `serve` the model repository, `batch run` a bulk job without a
server, `plan` bucket edges, `probe` a running server's health (container health checks),
`models build` the bundled models, `models import` a Hugging Face export folder."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from bucketserve.core.task import Task
from bucketserve.errors import ConfigError
from bucketserve.settings import Settings, env_name, parse_value

log = logging.getLogger("bucketserve.process.cli")


def _serve(args: argparse.Namespace) -> int:
    from bucketserve import logs
    from bucketserve.about import NAME, VERSION

    overrides = {f.name: getattr(args, f.name) for f in fields(Settings)}
    settings = Settings.from_env(**overrides)
    logs.configure(settings.log_level, settings.log_json)
    # (said before the server's imports and the models' load, which take seconds)
    log.info("%s %s starting: loading the models of %s", NAME, VERSION, settings.models)
    from bucketserve.process import server

    return server.run(settings)


def _batch_run(args: argparse.Namespace) -> int:
    from bucketserve.process.batch import run_batch

    overrides = {f.name: getattr(args, f.name) for f in fields(Settings)}
    settings = Settings.from_env(**overrides)
    return run_batch(
        settings, args.input, args.out, args.endpoint, args.model, args.column, args.restart
    )


# The KServe v2 health routes (bucketserve/edges/http/kserve_routes.py); container probes use them.
PROBE_PATHS = {"ready": "/v2/health/ready", "live": "/v2/health/live"}


def _probe(args: argparse.Namespace) -> int:
    """Exit 0 when the local server answers its health route with 200, else 1: a health check
    that needs no curl in the image."""
    import urllib.request

    port = args.port or Settings.from_env().port
    url = f"http://127.0.0.1:{port}{PROBE_PATHS[args.what]}"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:
            status = response.status
    except OSError as exc:  # refused, timed out, or an HTTP error status such as 503
        print(f"{url}: {exc}", file=sys.stderr)
        return 1
    return 0 if status == 200 else 1


def _plan(args: argparse.Namespace) -> int:
    from bucketserve.loading.planner import (
        extended,
        padding_waste,
        plan_edges,
        power_of_two_edges,
        read_lengths,
    )

    if args.lengths is not None:
        lengths = read_lengths(args.lengths)
    else:
        lengths = lengths_from_metrics(args.metrics_url, args.model)
    top = args.max_length or max(lengths)
    sample = sorted(lengths)
    if len(sample) < FEW_LENGTHS:
        print(
            f"warning: {len(sample)} lengths ({len(set(sample))} distinct) are too few to fit "
            "buckets to: the proposal below fits them and nothing like them; sample the "
            "traffic (a few thousand lengths, or --metrics-url) and give --max-length",
            file=sys.stderr,
        )
    print(
        f"sample: {len(sample)} lengths, median {sample[len(sample) // 2]}, "
        f"p99 {sample[int(len(sample) * 0.99)]}, longest {sample[-1]}"
    )
    pow2 = power_of_two_edges(top)
    keys = args.keys or len(pow2)
    plan = plan_edges(lengths, keys, top)
    edges = extended(plan.edges, top, sample[-1])
    print(f"proposed ({len(edges)} keys): buckets = {list(edges)}")
    print(f"  expected padding: {100 * plan.waste:.1f}% of computed tokens")
    if edges != plan.edges:
        fitted = len(plan.edges) - 1
        print(
            f"  ({fitted} fitted to the sample up to {plan.edges[-2]}; past it, "
            f"{len(edges) - fitted} more up to {top}, each 1/8 to 1/4 longer than the one "
            "before: no length the sample lacks shares a bucket with ones far shorter)"
        )
    print(f"power of two ({len(pow2)} keys): buckets = {list(pow2)}")
    print(f"  expected padding: {100 * padding_waste(lengths, pow2):.1f}% of computed tokens")
    return 0


# A sample smaller than this is said to be too small to fit buckets to
FEW_LENGTHS = 200


def lengths_from_metrics(url: str, model: str | None) -> list[int]:
    """A length sample from a live server's `bucketserve_sequence_length` histogram; each
    length is read as its histogram bucket's upper bound (a slight overestimate)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    cumulative: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "bucketserve_sequence_length_bucket" and (
                model is None or sample.labels.get("model") == model
            ):
                bound = float(sample.labels["le"])
                cumulative[bound] = cumulative.get(bound, 0.0) + sample.value
    lengths: list[int] = []
    below = 0.0
    for bound in sorted(b for b in cumulative if b != float("inf")):
        lengths += [int(bound)] * int(cumulative[bound] - below)
        below = cumulative[bound]
    if not lengths:
        raise ConfigError(f"{url}: no bucketserve_sequence_length samples yet")
    return lengths


def _models_build(args: argparse.Namespace) -> int:
    from modelgen.build import build

    for name in args.names:
        try:
            path = build(name, args.models)
        except ModuleNotFoundError as missing:  # (torch, transformers: the export extra)
            raise ConfigError(
                f"models build {name} needs {missing.name}, of the export extra: "
                "pip install -e '.[export]' (torch's CPU build)"
            ) from None
        print(f"built {name} in {path}")
    return 0


def _models_import(args: argparse.Namespace) -> int:
    import tempfile

    from bucketserve.loading.importer import entry_name, import_model, weights_of

    with tempfile.TemporaryDirectory() as exports:
        folder, name, verify = args.path, args.name, None
        if folder.is_dir() and weights_of(folder):  # (weights, no graph: exported first)
            name = name or entry_name(folder)
            folder, verify = _exported(folder, Path(exports))
        imported = import_model(folder, args.models, name, args.memory_budget, verify)
    model, served = imported.model, imported.model.info.served_config
    check = served["check"]
    print(f"wrote {imported.entry}: the ONNX file, tokenizer.json and this config.toml\n")
    print(imported.config)
    print(f"model {model.name} v{model.info.version} loaded and checked:")
    print(
        f"  {check['policy']}: padding moves its outputs by {check['padding']}, batching by "
        f"{check['batching']} (tolerance {check['tolerance']}); served as "
        f"{served['batching']['policy']}"
    )
    embedding = model.info.rule(Task.EMBED)
    if embedding is not None:
        print(
            f"  embedding: {embedding.output}, pooling {embedding.pooling.value}, "
            f"{'normalised' if embedding.normalize else 'not normalised'}, width {embedding.width}"
        )
    for note in imported.notes:
        print(f"  note: {note}")
    return 0


def _models_lock(args: argparse.Namespace) -> int:
    from bucketserve.loading.fingerprint import fingerprint_of
    from bucketserve.loading.lock import write_lock
    from bucketserve.loading.repository import load_repository

    repository = load_repository(args.models, name=args.model_name)  # (every model, or why not)
    fingerprints = {
        name: {spec.version: fingerprint_of(spec) for spec in specs}
        for name, specs in repository.models.items()
    }
    path = write_lock(args.models, fingerprints)
    for name, versions in sorted(fingerprints.items()):
        for version, fingerprint in sorted(versions.items()):
            print(f"{name} {version} {fingerprint}")
    for name in sorted(repository.unbuilt):
        print(f"{name}: not built, not locked (lock again once `models build` made it)")
    print(f"wrote {path}")
    return 0


def _exported(folder: Path, exports: Path) -> tuple[Path, Callable[[int], str]]:
    """`folder`'s weights exported to ONNX (the export extra), in `exports`, and the check
    of the export against the original up to the length it is imported at."""
    from bucketserve.loading.importer import optimum_command

    try:
        from modelgen.hf_folder import check_export, export_folder

        exported = export_folder(folder, exports / folder.name)
    except ModuleNotFoundError as missing:  # (torch, transformers: the export extra)
        raise ConfigError(
            f"{folder} holds weights and no ONNX file: exporting it needs {missing.name}, of the "
            "export extra (pip install 'bucketserve[export]'); or export it with optimum: "
            f"{optimum_command(folder)}, then import that folder"
        ) from None
    return exported.folder, lambda longest: check_export(folder, exported, longest)


def _converter(name: str, type_name: str) -> Callable[[str], Any]:
    def convert(raw: str) -> Any:
        try:
            return parse_value(name, type_name, raw)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


# The settings that change a `batch run` (its models, how they run, what a line may hold):
# its --help shows these; the others (listening, keys, model control) are taken but not shown.
BATCH_SETTINGS = frozenset({
    "models", "model_name", "default_model", "served_model_name", "locked", "binding",
    "instances", "intra_op_threads", "cache_dir", "max_sequences", "max_request_tokens",
    "auto_truncate", "openai_token_ids", "log_level", "log_json",
})  # fmt: skip


def _add_settings(command: argparse.ArgumentParser, shown: frozenset[str] | None = None) -> None:
    """Every setting as a flag; only those `shown` (None: all) in the command's --help."""
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata['help']} [{env_name(f.name)}; default {f.default}]"
        if shown is not None and f.name not in shown:
            help_text = argparse.SUPPRESS
        if f.type == "bool":  # (--flag, and --no-flag for one that is on by default)
            command.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            command.add_argument(
                flag,
                default=None,
                metavar=f.name.upper(),
                help=help_text,
                type=_converter(f.name, str(f.type)),
            )


def _repository_flag(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--models",
        type=Path,
        default=Path("models"),
        help="model repository folder (default: ./models)",
    )


def parser() -> argparse.ArgumentParser:
    from modelgen.build import RECIPES

    top = argparse.ArgumentParser(prog="bucketserve", description=__doc__)
    commands = top.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="serve the model repository over HTTP",
        description="Serve every model of the repository: /predict, KServe v2, /metrics. Each "
        "setting is a flag, or a BUCKETSERVE_* environment variable; a flag wins.",
    )
    _add_settings(serve)
    serve.set_defaults(run=_serve)

    plan = commands.add_parser(
        "plan",
        help="propose bucket edges fitted to observed request lengths",
        description="Fit bucket edges to a sample of request lengths (a file with one length "
        "per line, or a live server's metrics) and compare their padding with power-of-two edges.",
    )
    source = plan.add_mutually_exclusive_group(required=True)
    source.add_argument("--lengths", type=Path, help="file of lengths, one per line")
    source.add_argument("--metrics-url", help="a live server's /metrics URL")
    plan.add_argument("--model", help="with --metrics-url: that model's traffic only")
    plan.add_argument("--keys", type=int, help="how many buckets (default: as many as power of 2)")
    plan.add_argument("--max-length", type=int, help="last edge (default: the longest length seen)")
    plan.set_defaults(run=_plan)

    probe = commands.add_parser(
        "probe",
        help="check a local server's health (exit 0 when healthy)",
        description="GET the server's KServe v2 health route on 127.0.0.1; exit 0 on 200, 1 "
        "otherwise. For container health checks (HEALTHCHECK, exec probes).",
    )
    probe.add_argument("what", choices=sorted(PROBE_PATHS), help="ready: can take traffic now")
    probe.add_argument("--port", type=int, help="default: BUCKETSERVE_PORT, else 8000")
    probe.add_argument("--timeout", type=float, default=3.0, help="seconds")
    probe.set_defaults(run=_probe)

    batch = commands.add_parser("batch", help="run bulk jobs without a server")
    batch_commands = batch.add_subparsers(dest="batch_command", required=True)
    batch_run = batch_commands.add_parser(
        "run",
        help="run a file of requests (or texts) as one batch, resuming where a run stopped",
        description="Load the repository as `serve` does and run IN as a batch of OpenAI's "
        "Batch API, sorted by length: OUT gets the answers (OUT.errors.jsonl the failed "
        "lines). IN is JSONL request lines, a file of texts (one a line), or a parquet file "
        "(--column). Interrupted, the same command goes on from its last checkpoint "
        "(kept in OUT.partial/); a kept state of another input or model is refused, or "
        "discarded with --restart.",
        epilog="Every setting of `serve` is taken too (its flag, or its BUCKETSERVE_* "
        "variable); the ones shown are those that change a run.",
    )
    batch_run.add_argument("input", type=Path, metavar="IN", help="the requests or texts")
    batch_run.add_argument("--out", type=Path, required=True, help="the answers (JSONL)")
    batch_run.add_argument(
        "--endpoint", default="/v1/embeddings", help="the route each line runs (JSONL: its url)"
    )
    batch_run.add_argument("--model", dest="model", help="texts: the model that embeds them")
    batch_run.add_argument("--column", default="text", help="parquet: the texts' column")
    batch_run.add_argument(
        "--restart",
        action="store_true",
        help="discard OUT.partial/ (a run cut short, of this input or another) and start afresh",
    )
    _add_settings(batch_run, BATCH_SETTINGS)
    batch_run.set_defaults(run=_batch_run)

    models = commands.add_parser("models", help="manage the model repository")
    models_commands = models.add_subparsers(dest="models_command", required=True)
    build = models_commands.add_parser("build", help="build bundled models' ONNX files")
    build.add_argument(
        "names",
        nargs="+",
        choices=sorted(RECIPES),
        metavar="NAME",
        help=f"one of {', '.join(sorted(RECIPES))}",
    )
    _repository_flag(build)
    build.set_defaults(run=_models_build)
    imports = models_commands.add_parser(
        "import",
        help="turn a Hugging Face ONNX export folder into a repository entry",
        description="Read a folder that optimum-cli or sentence-transformers wrote (model.onnx, "
        "tokenizer.json, config.json, 1_Pooling/...), write models/NAME with its config, then "
        "load and check it as the server would. Reads the local folder only.",
    )
    imports.add_argument("path", type=Path, help="the export folder")
    imports.add_argument("--name", help="the entry's name (default: the folder's)")
    imports.add_argument(
        "--memory-budget",
        help="the memory its batches may take, as serve's flag (default: what the machine or "
        "container leaves): a context longer than a batch of one fits is imported at the "
        "longest that fits",
    )
    _repository_flag(imports)
    imports.set_defaults(run=_models_import)
    lock = models_commands.add_parser(
        "lock",
        help="write each model version's fingerprint to the repository's bucketserve.lock",
        description="Fingerprint every model version the repository serves (its files and the "
        "config fields that change answers) and write them to bucketserve.lock at its top; "
        "`serve --locked` then serves only versions whose content still matches.",
    )
    _repository_flag(lock)
    lock.add_argument("--model-name", help="the name of a one-model folder's model, as served")
    lock.set_defaults(run=_models_lock)
    return top


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:  # (Ctrl-C before serving began: loading, building)
        log.info("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The `bucketserve` command: `serve` the model repository, `models build` the bundled models."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from serve.errors import ConfigError
from serve.settings import Settings, env_name, parse_value

log = logging.getLogger("serve.cli")


def _serve(args: argparse.Namespace) -> int:
    from serve import server

    overrides = {f.name: getattr(args, f.name) for f in fields(Settings)}
    return server.run(Settings.from_env(**overrides))


def _models_build(args: argparse.Namespace) -> int:
    from serve.modelgen.build import build

    for name in args.names:
        path = build(name, args.models)
        print(f"built {name} in {path}")
    return 0


def _converter(name: str, type_name: str) -> Callable[[str], Any]:
    def convert(raw: str) -> Any:
        try:
            return parse_value(name, type_name, raw)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _add_settings(command: argparse.ArgumentParser) -> None:
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata['help']} [{env_name(f.name)}; default {f.default}]"
        if f.type == "bool":
            command.add_argument(
                flag, action="store_const", const=True, default=None, help=help_text
            )
        else:
            command.add_argument(
                flag,
                default=None,
                metavar=f.name.upper(),
                help=help_text,
                type=_converter(f.name, str(f.type)),
            )


def parser() -> argparse.ArgumentParser:
    from serve.modelgen.build import RECIPES

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
    build.add_argument(
        "--models",
        type=Path,
        default=Path("models"),
        help="model repository folder (default: ./models)",
    )
    build.set_defaults(run=_models_build)
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


if __name__ == "__main__":
    sys.exit(main())

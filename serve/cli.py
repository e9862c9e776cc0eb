"""The `bucketserve` command: `serve`, and `models build` for the bundled models."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

DEFAULT_MODELS = Path("models")


def _models_build(args: argparse.Namespace) -> int:
    from serve.modelgen.build import build

    for name in args.names:
        path = build(name, args.models)
        print(f"built {name} in {path}")
    return 0


def parser() -> argparse.ArgumentParser:
    from serve.modelgen.build import RECIPES

    top = argparse.ArgumentParser(prog="bucketserve", description=__doc__)
    commands = top.add_subparsers(dest="command", required=True)
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
        default=DEFAULT_MODELS,
        help="model repository folder (default: ./models)",
    )
    build.set_defaults(run=_models_build)
    return top


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())

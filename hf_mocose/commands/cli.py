"""The `hf-mocose` command line: one entry point, one sub-command per feature module.

Each feature module owns its own sub-commands through a `register(subparsers)` function, so
this file only lists them. A settings mistake prints one line and exits with status 2; set
HF_MOCOSE_DEBUG=1 for its traceback (see `hf_mocose.commands.errors`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import run_command

# module path -> what it adds; each module defines `register(subparsers)`.
COMMAND_MODULES = (
    "hf_mocose.evaluation.commands",  # evaluate, diagnose
    "hf_mocose.publishing.commands",  # export, push
    "hf_mocose.methods.mtd",  # mtd
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-mocose",
        description="Momentum-contrastive sentence embeddings on the Hugging Face stack.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return run_command(f"hf-mocose {args.command}", lambda: args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The `hf-mocose` command line: one entry point, one sub-command per feature module.

Each feature module owns its own sub-commands through a `register(subparsers)` function, so
this file only lists them. A settings mistake prints one line and exits with status 2; set
HF_MOCOSE_DEBUG=1 for its traceback (see `hf_mocose.commands.errors`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .errors import run_command

# module path -> what it adds; each module defines `register(subparsers)`.
COMMAND_MODULES = (
    "hf_mocose.evaluation.commands",  # evaluate, diagnose
    "hf_mocose.publishing.commands",  # export, push
    "hf_mocose.methods.mtd",  # mtd
)


# sub-command -> the module that registers it: `hf-mocose mtd` imports only the arithmetic it runs (no torch).
COMMAND_OWNERS = {
    "evaluate": "hf_mocose.evaluation.commands",
    "diagnose": "hf_mocose.evaluation.commands",
    "export": "hf_mocose.publishing.commands",
    "push": "hf_mocose.publishing.commands",
    "mtd": "hf_mocose.methods.mtd",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `hf-mocose` parser; for a known `command` only its own module is imported and registered (the
    others import torch and transformers), otherwise all of them (`--help`, a mistyped command)."""
    parser = argparse.ArgumentParser(
        prog="hf-mocose",
        description="Momentum-contrastive sentence embeddings on the Hugging Face stack.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    owner = COMMAND_OWNERS.get(command)
    for module_name in [owner] if owner in COMMAND_MODULES else COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


# OpenMP threads that have no work spin for a while before they sleep (GNU OpenMP's active wait). On a
# machine whose cores other processes also use, the spinning thread takes the core from the one doing the
# work: `hf-mocose evaluate` with torch's 2 threads on a loaded 2-core machine took 2.4x the CPU time and
# 2.2x the wall time of a run that waits passively (docs/evaluation.md). Read when torch loads OpenMP, so set
# before any sub-command imports torch; a value the user set is kept.
OPENMP_WAIT_POLICY = "PASSIVE"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("OMP_WAIT_POLICY", OPENMP_WAIT_POLICY)
    parser = build_parser(next((arg for arg in argv if not arg.startswith("-")), None))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return run_command(f"hf-mocose {args.command}", lambda: args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

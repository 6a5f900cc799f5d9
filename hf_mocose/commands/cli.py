"""The `hf-mocose` command line, and how every entry point reports a failure.

Each feature module owns its sub-commands through a `register(subparsers)` function; this file only names them.
A settings mistake (a `ValueError`, `FileNotFoundError`, `NotADirectoryError`, `HubPushError` or `SaveFailedError`
raised by a `raise` statement in `hf_mocose` or in transformers' `TrainingArguments` / `HfArgumentParser`) prints
one line and exits with status 2; anything else keeps Python's traceback, and `HF_MOCOSE_DEBUG=1` shows every one:

    train.py: error: per_device_train_batch_size must be >= 1, got 0. (HF_MOCOSE_DEBUG=1 shows the traceback)
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

# sub-command -> the module that registers it: `hf-mocose mtd` imports only the arithmetic it runs (no torch).
COMMAND_OWNERS = {"evaluate": "hf_mocose.evaluation.commands", "diagnose": "hf_mocose.evaluation.commands",
                  "export": "hf_mocose.publishing.commands", "push": "hf_mocose.publishing.commands",
                  "mtd": "hf_mocose.models.mtd", "train": "hf_mocose.commands.launch",
                  "recipes": "hf_mocose.commands.recipes"}
COMMAND_MODULES = tuple(dict.fromkeys(COMMAND_OWNERS.values()))

# Idle OpenMP threads spin, taking shared cores from the working thread (2.2x the wall time on a loaded 2-core
# machine, docs/evaluation.md). Read when torch loads OpenMP: set before any sub-command imports torch.
OPENMP_WAIT_POLICY = "PASSIVE"

DEBUG_ENV = "HF_MOCOSE_DEBUG"
USAGE_EXIT_CODE = 2  # as argparse exits on a bad flag
OTHER_PROCESSES_WAIT_S = 20  # the launcher stops the other processes within its monitor interval (0.1 s)
_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # hf_mocose/, whose raise statements speak to the user
_ARGUMENT_CHECKS = ("transformers/training_args.py", "transformers/hf_argparser.py")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `hf-mocose` parser; for a known `command` only its module is imported (the others import torch)."""
    parser = argparse.ArgumentParser(prog="hf-mocose",
                                     description="Momentum-contrastive sentence embeddings on the Hugging Face stack.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    owner = COMMAND_OWNERS.get(command)
    for module_name in [owner] if owner in COMMAND_MODULES else COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("OMP_WAIT_POLICY", OPENMP_WAIT_POLICY)
    parser = build_parser(next((arg for arg in argv if not arg.startswith("-")), None))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return run_command(f"hf-mocose {args.command}", lambda: args.func(args))


def is_user_error(err: BaseException) -> bool:
    """Whether `err` is a deliberate message about the user's settings or files (see the module docstring)."""
    from ..launch.run_folder import SaveFailedError
    from ..publishing.hub import HubPushError
    expected = (ValueError, FileNotFoundError, NotADirectoryError, HubPushError, SaveFailedError)
    if not isinstance(err, expected) or err.__traceback__ is None:
        return False
    last = traceback.extract_tb(err.__traceback__)[-1]  # the frame that raised, with its source line
    path = Path(last.filename).resolve()
    ours = _PACKAGE_DIR in path.parents or path.as_posix().endswith(_ARGUMENT_CHECKS)
    return ours and (last.line or "").startswith("raise")


def is_main_process() -> bool:
    """Whether this is the process that speaks for a launch (rank 0 of `accelerate launch`/`torchrun`, or alone)."""
    return os.environ.get("RANK", "0") == "0"


def run_command(prog: str, command: Callable[[], object]) -> int:
    """Runs an entry point and returns its exit status: a settings mistake is one line on stderr (status 2), any
    other error propagates. An int result is the status, any other result means success (0)."""
    try:
        result = command()
        sys.stdout.flush()  # a closed pipe shows here, not as a traceback at interpreter exit
    except BrokenPipeError:  # `hf-mocose recipes | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own exit flush would raise again
        return 141  # 128 + SIGPIPE, what a shell reports for a process that a closed pipe stopped
    except Exception as err:
        debug = os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")
        if debug or not is_user_error(err):
            raise
        message = " ".join(str(err).split()) or type(err).__name__
        report_refusal(f"{prog}: error: {message} ({DEBUG_ENV}=1 shows the traceback)")
        return USAGE_EXIT_CODE
    return result if isinstance(result, int) else 0


def report_refusal(line: str) -> None:
    """Once per launch: the main process prints it and writes it to torch's error file (the launcher's report then ends
    with it as its root cause); the others wait to be stopped by the launcher, and speak only if they are not."""
    if not is_main_process():
        time.sleep(OTHER_PROCESSES_WAIT_S)
    if error_file := os.environ.get("TORCHELASTIC_ERROR_FILE"):
        Path(error_file).write_text(json.dumps({"message": line, "timestamp": int(time.time())}))
    print(line, file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""How the command-line entry points report a failure: a settings mistake as one line, a bug with its traceback.

    python scripts/train.py --per_device_train_batch_size 0 ...
    train.py: error: per_device_train_batch_size must be >= 1, got 0. (HF_MOCOSE_DEBUG=1 shows the traceback)

An *expected* error is one that hf-mocose (or transformers' own argument checks) raises on
purpose about the user's settings or files: a `ValueError`, `FileNotFoundError`,
`NotADirectoryError` or `HubPushError` raised by a `raise` statement in the `hf_mocose` package or
in transformers' `TrainingArguments` / `HfArgumentParser`. It is printed as `<prog>: error:
<message>` and the process exits with status 2. Anything else (a bug, a crash inside a library)
keeps Python's full traceback, and `HF_MOCOSE_DEBUG=1` shows the traceback of every error.
"""

from __future__ import annotations

import linecache
import os
import sys
from pathlib import Path
from typing import Callable

DEBUG_ENV = "HF_MOCOSE_DEBUG"
USAGE_EXIT_CODE = 2  # as argparse exits on a bad flag
_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # hf_mocose/, whose raise statements speak to the user
# transformers' own argument checks (TrainingArguments.__post_init__, HfArgumentParser) speak to the user too.
_ARGUMENT_CHECKS = ("transformers/training_args.py", "transformers/hf_argparser.py")


def debug_enabled() -> bool:
    """Whether `HF_MOCOSE_DEBUG` asks for full tracebacks (1, true, yes, on)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _expected_types() -> tuple[type[BaseException], ...]:
    from ..publishing.hub import HubPushError

    return ValueError, FileNotFoundError, NotADirectoryError, HubPushError


def is_user_error(err: BaseException) -> bool:
    """Whether `err` is a deliberate message about the user's settings or files (see the module docstring)."""
    if not isinstance(err, _expected_types()) or err.__traceback__ is None:
        return False
    tb = err.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = tb.tb_frame.f_code.co_filename
    path = Path(filename).resolve()
    ours = _PACKAGE_DIR in path.parents or path.as_posix().endswith(_ARGUMENT_CHECKS)
    return ours and linecache.getline(filename, tb.tb_lineno).lstrip().startswith("raise")


def format_user_error(prog: str, err: BaseException) -> str:
    """`<prog>: error: <message> (HF_MOCOSE_DEBUG=1 shows the traceback)`, on one line."""
    message = " ".join(str(err).split()) or type(err).__name__
    return f"{prog}: error: {message} ({DEBUG_ENV}=1 shows the traceback)"


def run_command(prog: str, command: Callable[[], object]) -> int:
    """Runs a command-line entry point and returns its exit status.

    An expected error is printed as one line on stderr (status 2); anything else, or any error
    under `HF_MOCOSE_DEBUG=1`, propagates with its traceback. An int result is the status, any
    other result means success (0).
    """
    try:
        result = command()
    except Exception as err:
        if debug_enabled() or not is_user_error(err):
            raise
        print(format_user_error(prog, err), file=sys.stderr)
        return USAGE_EXIT_CODE
    return result if isinstance(result, int) else 0

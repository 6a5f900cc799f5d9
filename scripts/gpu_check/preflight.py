"""Before any work: can this Python import everything the gpu_check needs?

The device image has torch, transformers, accelerate and sentence-transformers but not `datasets` (which
`MoCoSETrainer` imports) nor two of its needs; their wheels travel in the carried folder (`scripts/gpu_check/carry.py`)
and `device.sh` installs them. Without them the run would die at the first trainer with `ModuleNotFoundError`
and leave no result, so run.py calls `missing_modules()` first and, when something is missing, writes its report
with the failure in it and ends with `stop_line()`: one line naming what is missing, the wheels that bring it and the
`carry` entry that brings those.
"""

from __future__ import annotations

import importlib
import os

from scripts.gpu_check.carry import CARRY_ENTRY, WHEELS

# What the run imports, in the order a missing one would first be hit; the last three come as wheels.
REQUIRED = ("torch", "transformers", "accelerate", "sentence_transformers", "safetensors", "tokenizers", "yaml",
            "datasets", "dill", "multiprocess")
WHEELS_STATUS_ENV = "GPU_CHECK_WHEELS_STATUS"  # what device.sh did with the wheels, for the report


def missing_modules(required=REQUIRED) -> dict[str, str]:
    """{module: the error importing it raised} for each of `required` that cannot be imported (any error: a
    broken install fails here too, not in the middle of a section)."""
    missing = {}
    for name in required:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - ImportError, or whatever a half-installed package raises
            missing[name] = f"{type(err).__name__}: {err}"
    return missing


def _top_missing(error: str) -> str | None:
    """The module a `No module named 'x.y'` error names ('x'), else None."""
    marker = "No module named '"
    return error.split(marker, 1)[1].split("'", 1)[0].split(".")[0] if marker in error else None


def wheels_status() -> str:
    return os.environ.get(WHEELS_STATUS_ENV, "not run through device.sh: no wheels were installed")


def stop_line(missing: dict[str, str], report: str) -> str:
    """The one line the run ends with when `missing` is not empty."""
    wheels = [WHEELS[name] for name in missing if name in WHEELS]
    # a module of the image that fails only because a carried one is missing (sentence-transformers imports
    # datasets) is named as such, not as a broken image
    through = [name for name in missing if name not in WHEELS and _top_missing(missing[name]) in WHEELS]
    others = [name for name in missing if name not in WHEELS and name not in through]
    parts = [f"gpu_check: stopped before any work: cannot import {', '.join(n for n in missing if n not in through)}"
             + (f" (nor {', '.join(through)}, which needs them)" if through else "")]
    if wheels:
        parts.append(f"the wheels {', '.join(wheels)} must travel in {CARRY_ENTRY}/wheels: run `python "
                     f"scripts/gpu_check/carry.py` where PyPI is reachable and add \"{CARRY_ENTRY}\" to the run call's "
                     f"carry (wheels: {wheels_status()})")
    if others:
        parts.append(f"{', '.join(others)} should be in the image: see {report}")
    return "; ".join(parts) + f"; report: {report}"

"""Before any work: can this Python import everything the gpu_check needs, and can `datasets` read data with the
node's pyarrow and fsspec?

A GPU image often has torch, transformers, accelerate and sentence-transformers but not `datasets` (which
`MoCoSETrainer` imports) nor two of its needs; on an air-gapped node their wheels come in the bundle
(`scripts/gpu_check/bundle.py`) and `device.sh` installs them. Without them the run would die at the first trainer with `ModuleNotFoundError`
and leave no result, so run.py calls `missing_modules()` first and, when something is missing, writes its report
with the failure in it and ends with `stop_line()`: one line naming what is missing, the wheels that bring it and the
bundle that holds those. Then `exercise_datasets` runs what every trainer of the run does first,
`Dataset.from_dict(...).map(...)` and the library's text loader on a two-line file: `datasets` 5.2 needs pyarrow >= 24
and fsspec <= 2026.9.0, and the node's versions are not known in advance, so a mismatch stops the run here in one
line (`stop_line`), not in the middle of a section.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from scripts.gpu_check.bundle import BUNDLE_NAME, WHEELS

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


def _one_line(err: Exception) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())[:500]


def exercise_datasets(folder: Path) -> dict[str, str]:
    """{what: the error it raised} for `Dataset.from_dict(...).map(...)` and `load_sentences` (the text loader:
    datasets' "text" builder, through fsspec and pyarrow) on a two-line file in `folder`; empty when both work."""
    from datasets import Dataset

    from hf_mocose.data.corpus import load_sentences

    broken = {}
    try:
        mapped = Dataset.from_dict({"text": ["one", "two words"]}).map(lambda row: {"words": len(row["text"].split())})
        if mapped["words"] != [1, 2]:
            raise ValueError(f"map gave {mapped['words']}, not [1, 2]")
    except Exception as err:  # noqa: BLE001 - whatever a mismatched pyarrow raises
        broken["Dataset.from_dict(...).map(...)"] = _one_line(err)
    try:
        path = Path(folder) / "preflight-two-lines.txt"
        path.write_text("The first sentence.\nThe second one.\n", encoding="utf-8")
        loaded = load_sentences(train_file=str(path))
        if loaded["text"] != ["The first sentence.", "The second one."]:
            raise ValueError(f"read {loaded['text']}")
    except Exception as err:  # noqa: BLE001 - whatever a mismatched pyarrow or fsspec raises
        broken["the text loader (load_sentences of a .txt file)"] = _one_line(err)
    return broken


def stop_line(missing: dict[str, str], report: str, broken: dict[str, str] | None = None,
              versions: dict | None = None) -> str:
    """The one line the run ends with when `missing` or `broken` (`exercise_datasets`) is not empty."""
    if not missing and broken:
        v = versions or {}
        what = "; ".join(f"{name} raised {error}" for name, error in broken.items())
        return (f"gpu_check: stopped before any work: datasets {v.get('datasets')} cannot read data with pyarrow "
                f"{v.get('pyarrow')} and fsspec {v.get('fsspec')} (datasets 5.2 needs pyarrow >= 24, fsspec <= "
                f"2026.9.0): {what}; report: {report}")
    wheels = [WHEELS[name] for name in missing if name in WHEELS]
    # a module of the node that fails only because a bundled one is missing (sentence-transformers imports
    # datasets) is named as such, not as a broken image
    through = [name for name in missing if name not in WHEELS and _top_missing(missing[name]) in WHEELS]
    others = [name for name in missing if name not in WHEELS and name not in through]
    parts = [f"gpu_check: stopped before any work: cannot import {', '.join(n for n in missing if n not in through)}"
             + (f" (nor {', '.join(through)}, which needs them)" if through else "")]
    if wheels:
        parts.append(f"the wheels {', '.join(wheels)} must be in {BUNDLE_NAME}/wheels: run `python "
                     f"scripts/gpu_check/bundle.py` where PyPI is reachable and copy \"{BUNDLE_NAME}\" with the "
                     f"checkout (wheels: {wheels_status()})")
    if others:
        parts.append(f"{', '.join(others)} should be installed on the node: see {report}")
    return "; ".join(parts) + f"; report: {report}"

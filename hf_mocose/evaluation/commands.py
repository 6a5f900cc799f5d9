"""`hf-mocose evaluate` and `hf-mocose diagnose`: the evaluation sub-commands.

    hf-mocose evaluate MODEL --senteval_dir DIR [--tasks sts|transfer|all|TASK ...] [--aggregation all|wmean]
                             [--pooler cls|cls_dense|mean] [--batch_size N] [--truncate_dim N] [--output results.json]
    hf-mocose diagnose MODEL [MODEL ...] --senteval_dir DIR [--plot spectrum.png] [--output diag.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from hf_mocose.models.pooling import SENTENCE_POOLING_MODES

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


def _add_encoder_arguments(parser: argparse.ArgumentParser, multi_pooler: bool = False) -> None:
    parser.add_argument("--senteval_dir", required=True,
                        help="SentEval data folder (the one holding STS/, SICK/, CR/, ...)")
    pooler_help = ("sentence pooling: cls | cls_dense (last-layer [CLS] through the checkpoint's pooler dense Linear, "
                   "no tanh) | mean. Plain HF encoders default to cls; MoCoSE checkpoints default to their own "
                   "sentence_pooling; a sentence-transformers folder given --pooler is read as a plain HF encoder")
    parser.add_argument("--pooler", nargs="+" if multi_pooler else None, choices=SENTENCE_POOLING_MODES,
                        help=pooler_help + (" (one per model, or one for all)" if multi_pooler else ""))
    parser.add_argument("--batch_size", type=int, default=64, help="sentences per forward pass (default 64)")
    parser.add_argument("--max_length", type=int, default=None, help="truncation length in tokens (default: the "
                        "encoder's own limit, i.e. whole sentences; a MoCoSE checkpoint is not cut at its training "
                        "max_seq_length; a sentence-transformers folder uses its max_seq_length)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--no_progress", action="store_true", help="hide the tqdm progress bars")


def register(subparsers) -> None:
    """Adds the `evaluate` and `diagnose` sub-commands to the `hf-mocose` parser."""
    from hf_mocose.evaluation.runner import ALL_TASKS, DEFAULT_GROUP, TASK_GROUPS
    from hf_mocose.evaluation.sts import AGGREGATIONS
    evaluate = subparsers.add_parser(
        "evaluate",
        help="STS (Spearman x100) and SentEval transfer tasks for a MoCoSE, sentence-transformers or HF encoder",
        description="Evaluates a sentence encoder on the SentEval STS and transfer tasks; prints a Markdown table "
        "in the papers' column order and optionally writes the results as JSON.")
    evaluate.add_argument("model", help="MoCoSE checkpoint, sentence-transformers folder or Hugging Face encoder folder")
    _add_encoder_arguments(evaluate)
    evaluate.add_argument("--tasks", nargs="+", default=None, metavar="TASK",
                          help=f"tasks or groups to run (default: the '{DEFAULT_GROUP}' group, i.e. the 7 STS test "
                          "sets + stsb_dev whose files are present; transfer tasks only when asked: --tasks transfer, "
                          f"or all). Tasks: {' '.join(ALL_TASKS)}. Groups: {' '.join(TASK_GROUPS)}")
    evaluate.add_argument("--aggregation", choices=AGGREGATIONS, default="all",
                          help="STS12-16 headline: 'all' = one correlation over the concatenated sets (SimCSE/MoCoSE, "
                          "default); 'wmean' = set correlations averaged, weighted by set size. Both are written to "
                          "the JSON")
    evaluate.add_argument("--truncate_dim", type=int, default=None, help="score the embeddings' first N dimensions "
                          "(a Matryoshka width), as SentenceTransformer(path, truncate_dim=N) (default: all)")
    evaluate.add_argument("--output", default=None, help="write the results as JSON here")
    evaluate.add_argument("--label", default=None, help="model name for the table (default: the folder name)")
    evaluate.add_argument("--seed", type=int, default=1111, help="seed of the transfer-task classifiers (SentEval: 1111)")
    evaluate.add_argument("--kfold", type=int, default=10, help="outer folds for MR/CR/SUBJ/MPQA (default 10)")
    evaluate.add_argument("--inner_folds", type=int, default=5, help="inner folds that pick the classifier's C (default 5)")
    evaluate.set_defaults(func=run_evaluate)

    diagnose = subparsers.add_parser(
        "diagnose", help="alignment, uniformity and singular-value spectrum of sentence embeddings on STS-B",
        description="Representation diagnostics (Wang & Isola 2020) on STS-B sentences for one or more models, "
        "with the singular-value spectra of all of them on one plot.")
    diagnose.add_argument("models", nargs="+", metavar="MODEL", help="model folders to compare")
    _add_encoder_arguments(diagnose, multi_pooler=True)
    diagnose.add_argument("--split", choices=("test", "dev", "train"), default=None, help="STS-B split (default: test, else dev, else train)")
    diagnose.add_argument("--labels", nargs="+", default=None, help="legend names, one per model")
    diagnose.add_argument("--plot", default=None, help="write the singular-value spectrum plot (PNG) here")
    diagnose.add_argument("--output", default=None, help="write the diagnostics as JSON here")
    diagnose.set_defaults(func=run_diagnose)


def _write_json(path: str, payload: dict) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)

    def clean(value):  # JSON has no NaN: write null
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        return [clean(v) for v in value] if isinstance(value, (list, tuple)) else value

    out.write_text(json.dumps(clean(payload), indent=2) + "\n")


def _check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"--batch_size must be at least 1, got {batch_size}")


def run_evaluate(args: argparse.Namespace) -> int:
    from hf_mocose.evaluation.runner import load_encoder, markdown_table, resolve_tasks, run_tasks
    _check_batch_size(args.batch_size)
    # Resolve tasks before loading the model: a typo should fail in a second, not after a load.
    tasks, skipped = resolve_tasks(args.senteval_dir, args.tasks)
    if skipped:
        print(f"Skipping {len(skipped)} task(s) with missing files: "
              + ", ".join(f"{task} ({path})" for task, path in skipped.items()), file=sys.stderr)
    print(f"Tasks: {' '.join(tasks)}", file=sys.stderr)
    if args.tasks is None:
        print("Transfer tasks (mr cr subj mpqa sst2 trec mrpc) run only when asked: --tasks transfer (or all).",
              file=sys.stderr)
    try:
        encoder = load_encoder(args.model, args.pooler, args.device, args.batch_size, args.max_length,
                               show_progress=not args.no_progress, truncate_dim=args.truncate_dim)
    except KeyboardInterrupt:
        print("Interrupted (Ctrl-C) while loading the model: no task ran.", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    label = args.label or Path(args.model).name + (f" (dim {args.truncate_dim})" if args.truncate_dim else "")
    start = time.perf_counter()
    results = run_tasks(encoder, args.senteval_dir, tasks, args.aggregation, args.seed, args.kfold, args.inner_folds,
                        log=lambda line: print(line, file=sys.stderr))  # stdout is for the table
    total = time.perf_counter() - start
    print(markdown_table(results, label))
    if "avg" in results and len(results["avg_over"]) < 7:
        print(f"\nAvg. is over {len(results['avg_over'])} of the 7 STS test tasks: {', '.join(results['avg_over'])}")
    if args.output:
        results["skipped"] = skipped
        results["meta"] = {"model": str(args.model), "label": label, "encoder": encoder.describe(),
                           "senteval_dir": str(args.senteval_dir), "tasks": tasks, "aggregation": args.aggregation,
                           "seed": args.seed, "batch_size": args.batch_size, "truncate_dim": args.truncate_dim,
                           "total_seconds": round(total, 2)}
        _write_json(args.output, results)
        if "interrupted" not in results:
            print(f"\nWrote {args.output}", file=sys.stderr)
    if "interrupted" in results:
        left, written = " ".join(results["interrupted"]), f" and written to {args.output}" if args.output else ""
        print(f"Interrupted (Ctrl-C): {len(tasks) - len(results['interrupted'])} task(s) finished{written}; not run: "
              f"{left} (--tasks {left} runs them).", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    return 0


def run_diagnose(args: argparse.Namespace) -> int:
    from hf_mocose.evaluation.sts import diagnose, load_stsb_for_diagnostics, plot_spectra
    from hf_mocose.evaluation.runner import load_encoder
    _check_batch_size(args.batch_size)
    n = len(args.models)
    poolers = args.pooler or [None]
    if len(poolers) not in (1, n):
        raise ValueError(f"give one --pooler for all models or one per model ({n}), not {len(poolers)}")
    poolers = poolers * n if len(poolers) == 1 else poolers
    if args.labels and len(args.labels) != n:
        raise ValueError(f"give one label per model: {n} models, {len(args.labels)} labels")
    if not Path(args.senteval_dir).is_dir():
        raise FileNotFoundError(f"SentEval directory {args.senteval_dir} does not exist; diagnostics need "
                                "<dir>/STS/STSBenchmark/sts-{train,dev,test}.csv")
    pairs, split = load_stsb_for_diagnostics(args.senteval_dir, args.split)
    results: dict = {}
    for i, (model, pooler) in enumerate(zip(args.models, poolers)):
        encoder = load_encoder(model, pooler, args.device, args.batch_size, args.max_length, not args.no_progress)
        label = args.labels[i] if args.labels else Path(model).name + (f" ({pooler})" if pooler else "")
        if label in results:  # the same folder twice, e.g. with two poolers
            label = f"{label} #{i + 1}"
        results[label] = {"model": str(model), "encoder": encoder.describe(), **diagnose(encoder.encode, pairs)}
    print(f"STS-B {split}: {len(pairs)} pairs\n")
    print("| Model | Alignment ↓ | Uniformity ↓ | Positive pairs | Sentences |\n|---|---|---|---|---|")
    for label, r in results.items():
        print(f"| {label} | {r['alignment']:.4f} | {r['uniformity']:.4f} | {r['n_positive_pairs']} | {r['n_sentences']} |")
    if args.plot:
        plot_spectra({label: r["singular_values"] for label, r in results.items()}, args.plot, f"STS-B {split}")
        print(f"\nWrote {args.plot}", file=sys.stderr)
    if args.output:
        _write_json(args.output, {"split": split, "models": results})
        print(f"Wrote {args.output}", file=sys.stderr)
    return 0

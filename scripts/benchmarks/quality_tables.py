"""Tables of benchmark_quality.py: per-variant mean ± std over seeds, the budget curve, and merging
the `--json` results of separate processes (one seed each, run side by side) into one table."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from scripts import write_outputs


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _stats(scored: list[dict], tasks: list[str]) -> dict:
    """Runs (each with `steps` and `scores`) -> steps, per-task mean/std/per_seed and the mean of sets."""
    stats: dict = {"steps": [r["steps"] for r in scored]}
    if all("peak_train_mib" in r for r in scored):  # labelled variants: their measured peak training memory
        stats["peak_train_mib"] = [r["peak_train_mib"] for r in scored]
    for task in tasks:
        values = [r["scores"][task] for r in scored]
        mean, std = _mean_std(values)
        stats[task] = {"mean": round(mean, 2), "std": round(std, 2), "per_seed": values}
    mean, std = _mean_std([statistics.mean(r["scores"][t] for t in tasks) for r in scored])
    stats["mean_of_sets"] = {"mean": round(mean, 2), "std": round(std, 2)}
    return stats


def _curve_points(runs: list[dict], tasks: list[str]) -> dict:
    """`--score_at_minutes` points every seed reached: minutes -> `_stats` of the runs at that point."""
    reached = [set(r.get("scores_at_minutes", {})) for r in runs]
    common = set.intersection(*reached) if reached else set()
    return {minutes: _stats([r["scores_at_minutes"][minutes] for r in runs], tasks)
            for minutes in sorted(common, key=float)}


def _row(cells: list[str], stats: dict, tasks: list[str], memory: bool = False) -> str:
    """One table row: the leading cells, the steps per seed, mean ± std per task and of the sets (and with `memory`
    the peak training memory per seed)."""
    values = [f"{stats[t]['mean']:.2f} ± {stats[t]['std']:.2f}" for t in [*tasks, "mean_of_sets"]]
    if memory:
        values.append("/".join("n/a" if m is None else f"{m:.0f}" for m in stats.get("peak_train_mib", [None])))
    return "| " + " | ".join([*cells, "/".join(str(s) for s in stats["steps"]), *values]) + " |"


def markdown_table(summary: dict) -> str:
    tasks = summary["tasks"]
    memory = any("peak_train_mib" in entry for entry in summary["variants"].values())
    header = "| variant | steps | " + " | ".join(tasks) + " | mean of sets |" + " peak training MiB |" * memory
    lines = [header, "| --- | ---: | " + " | ".join("---:" for _ in tasks) + " | ---: |" + " ---: |" * memory]
    before = summary["before"]
    pooling = f" ({summary['pooling']} pooling)" if summary.get("pooling", "cls") != "cls" else ""
    lines.append(f"| {summary['model']}{pooling}, before training | 0 | " + " | ".join(f"{before[t]:.2f}" for t in tasks)
                 + f" | {statistics.mean(before[t] for t in tasks):.2f} |" + " |" * memory)
    for name, entry in summary["variants"].items():
        lines.append(_row([name], entry, tasks, memory))
    if any(entry.get("at_minutes") for entry in summary["variants"].values()):
        lines += ["", "| variant | budget (minutes) | steps | " + " | ".join(tasks) + " | mean of sets |",
                  "| --- | ---: | ---: | " + " | ".join("---:" for _ in tasks) + " | ---: |"]
        for name, entry in summary["variants"].items():
            points = {**entry.get("at_minutes", {}), f"{summary['budget_minutes']:g}": entry}
            lines += [_row([name, minutes], point, tasks) for minutes, point in points.items()]
    return "\n".join(lines)


def write_summary(summary: dict, json_path: str | None, markdown_path: str | None) -> dict:
    table = markdown_table(summary)
    summary["markdown"] = table
    print(table)
    return write_outputs(summary, json_path, markdown_path, table)


def summarise(details: dict, variants: dict, tasks: list[str]) -> dict:
    """variant -> per-task mean/std over its runs (seeds), the mean of sets, steps and the budget curve."""
    return {name: {"overrides": variants[name], **_stats(runs, tasks), "at_minutes": _curve_points(runs, tasks)}
            for name, runs in details.items()}


# Settings that must agree for runs of separate processes (e.g. one seed each, side by side) to share a table.
MERGE_KEYS = ("model", "tasks", "before", "budget_minutes", "clock", "batch_size", "pooling", "max_seq_length",
              "learning_rate", "temperature", "schedule_steps", "corpus", "n_sentences", "eval_max_length")


def merge(paths: list[str]) -> dict:
    """One summary from the `--json` files of runs with the same settings but other seeds, or other variants (e.g.
    one process per variant and seed, so that each measures its own memory): a variant's seeds must not repeat."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    first = parts[0]
    for path, part in zip(paths[1:], parts[1:]):
        if differ := [k for k in MERGE_KEYS if part.get(k) != first.get(k)]:
            raise SystemExit(f"--merge: {path} differs from {paths[0]} in {', '.join(differ)}")
    details: dict = {}
    for part in parts:
        for name in part["variants"]:
            details.setdefault(name, []).extend(part["details"][name])
    for name, runs in details.items():
        if len(seeds := [run["seed"] for run in runs]) != len(set(seeds)):
            raise SystemExit(f"--merge: {name}'s seeds {seeds} repeat; each file must hold other seeds")
    variants = {name: entry["overrides"] for part in parts for name, entry in part["variants"].items()}
    summary = {k: first[k] for k in ("model", "tasks", "before")}
    summary["variants"] = summarise(details, variants, first["tasks"])
    summary.update({k: v for k, v in first.items() if k not in summary and k not in ("markdown", "command")})
    seeds = sorted({seed for part in parts for seed in part["seeds"]})
    summary.update({"details": details, "seeds": seeds, "command": [part["command"] for part in parts]})
    return summary

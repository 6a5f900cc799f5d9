"""Ablation sweeps: a YAML grid -> a list of `accelerate launch` runs -> one results table.

A sweep file names a base recipe, overrides shared by every run, and a list of runs or a grid (cartesian product):

    base: training_args/mocose-bert-base.yaml
    name: table8-queue-slices
    overrides: {per_device_train_batch_size: 256, queue_size: 1024, queue_init_size: 128}
    runs:
      - {name: "0-512", queue_slice: "0:512"}
      - {name: "all"}
    # or: grid: {queue_size: [256, 512, 1024], per_device_train_batch_size: [32, 64]}

`scripts/sweep.py` prints the commands (`--dry_run`) or runs them one after the other, then scores each final
checkpoint (`hf-mocose evaluate` with `--senteval_dir`, else the STS-B dev score the run saved) in a Markdown table.
"""

from __future__ import annotations

import itertools
import json
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

STS_COLUMNS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr", "stsb_dev")


@dataclass
class SweepRun:
    """One training run of a sweep: its name, its overrides and where it writes."""

    name: str
    overrides: dict
    output_dir: Path
    results: dict = field(default_factory=dict)

    def command(self, base: str, launcher: str, extra: list[str]) -> list[str]:
        flags = [part for key, value in self.overrides.items() for part in (f"--{key}", _flag_value(value))]
        return [*shlex.split(launcher), "scripts/train.py", base, *flags, "--output_dir", str(self.output_dir), *extra]


def _flag_value(value) -> str:
    if isinstance(value, (list, tuple)):  # queue slices: [[0, 256], [768, 1024]] -> "0:256,768:1024"
        pairs = [value] if value and isinstance(value[0], int) else value
        return ",".join(f"{a}:{b}" for a, b in pairs)
    return str(value).lower() if isinstance(value, bool) else str(value)


def load_sweep(path: str | Path, output_root: str | Path) -> tuple[str, str, list[SweepRun]]:
    """Reads a sweep file; returns (sweep name, base recipe, runs)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Sweep file {str(path)!r} does not exist.")
    spec = yaml.safe_load(path.read_text()) or {}
    if unknown := set(spec) - {"base", "name", "overrides", "runs", "grid"}:
        raise ValueError(f"Unknown key(s) in {path}: {', '.join(sorted(unknown))} (expected base, name, overrides, runs|grid).")
    if "base" not in spec:
        raise ValueError(f"{path} needs a `base` recipe.")
    if ("runs" in spec) == ("grid" in spec):
        raise ValueError(f"{path} needs exactly one of `runs` (a list) or `grid` (a mapping of lists).")
    name = spec.get("name", path.stem)
    shared = dict(spec.get("overrides") or {})
    entries = ([dict(run or {}) for run in spec["runs"]] if "runs" in spec
               else [dict(zip(spec["grid"], values)) for values in itertools.product(*spec["grid"].values())])
    runs = []
    for index, entry in enumerate(entries):
        run_name = str(entry.pop("name", None) or "-".join(f"{k}={_flag_value(v)}" for k, v in entry.items()) or f"run{index}")
        runs.append(SweepRun(run_name, {**shared, **entry}, Path(output_root) / name / run_name.replace("/", "_")))
    return name, spec["base"], runs


def collect_results(run: SweepRun, senteval_dir: str | None, tasks: list[str] | None = None) -> dict:
    """STS results of a finished run: `hf-mocose evaluate` on its final checkpoint, or its saved STS-B dev score."""
    final = run.output_dir / "final"
    if senteval_dir:
        from .cli import main as cli_main

        out = run.output_dir / "sts_results.json"
        cli_main(["evaluate", str(final), "--senteval_dir", senteval_dir, "--output", str(out), "--no_progress",
                  *(["--tasks", *tasks] if tasks else [])])
        return json.loads(out.read_text())
    saved = run.output_dir / "eval_results.json"
    metrics = json.loads(saved.read_text()) if saved.is_file() else {}
    return {"stsb_dev": {"spearman": metrics["eval_stsb_spearman"]}} if "eval_stsb_spearman" in metrics else {}


def results_table(runs: list[SweepRun]) -> str:
    """Markdown: one row per run, its overrides and its STS Spearman (x100) per task, plus Avg."""
    columns = [c for c in (*STS_COLUMNS, "avg") if any(c in run.results for run in runs)]
    header = ["run", "overrides", *("Avg." if c == "avg" else c for c in columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        scores = {c: r if c == "avg" else r["spearman"] for c, r in run.results.items() if c in columns}
        cells = [f"{scores[c]:.2f}" if c in scores else "-" for c in columns]
        overrides = ", ".join(f"{k}={_flag_value(v)}" for k, v in run.overrides.items())
        lines.append("| " + " | ".join([run.name, overrides, *cells]) + " |")
    return "\n".join(lines)


def run_sweep(sweep_file: str, output_root: str = "outputs/sweeps", launcher: str = "accelerate launch",
              extra: list[str] | None = None, dry_run: bool = False, senteval_dir: str | None = None,
              tasks: list[str] | None = None) -> str:
    """Runs (or, with `dry_run`, lists) a sweep; returns the results table (or the commands)."""
    name, base, runs = load_sweep(sweep_file, output_root)
    extra = list(extra or [])
    if dry_run:
        return "\n".join(shlex.join(run.command(base, launcher, extra)) for run in runs)
    for run in runs:
        command = run.command(base, launcher, extra)
        print(f"[sweep {name}] {shlex.join(command)}", flush=True)
        completed = subprocess.run(command)
        if completed.returncode != 0 or not (run.output_dir / "final").is_dir():
            raise RuntimeError(f"Run {run.name!r} failed (exit {completed.returncode}); its output is in {run.output_dir}.")
        run.results = collect_results(run, senteval_dir, tasks)
    table = results_table(runs)
    table_path = Path(output_root) / name / "results.md"
    table_path.write_text(f"# Sweep {name}\n\nBase recipe: `{base}`\n\n{table}\n")
    return table

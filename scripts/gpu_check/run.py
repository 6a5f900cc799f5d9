#!/usr/bin/env python
"""One-command acceptance run for one GPU: throughput, peak memory and five correctness checks, in ~8 minutes.

    bash scripts/gpu_check/device.sh                                  # on the device machine: $OUT/gpu_check
    PYTHONUNBUFFERED=1 python scripts/gpu_check/run.py --output_dir DIR   # on a GPU (cuda when available)
    python scripts/gpu_check/run.py --tiny --output_dir DIR               # the same on the CPU, tiny model

Needs torch, transformers, accelerate, sentence-transformers, datasets and this repository (on PYTHONPATH or
installed); nothing from the Hub: the encoder is a randomly initialised BERT-base built from `BertConfig()`
(`--tiny`: hidden 32, 2 layers) and its WordPiece tokenizer is made from Python's own documentation
(context.py). Writes DIR/gpu_check.json and DIR/gpu_check.md after every section, so a run
cut short still leaves what it measured.

Sections, in order (each timed, skipped with its reason when the time budget is short, its failure recorded
without stopping the others):
  ema_queue   (a) the EMA target stays fp32 under bf16 autocast and equals a float64 reference lerp after N
              steps; (b) the key queue equals a CPU float64 replay of the same steps (mocose_checks.py)
  export      (e) the sentence-transformers export's embeddings equal the checkpoint's `MoCoSEModel.embed`
              on the device (mocose_checks.py)
  reference   the eager fp32 run that (c) and (d) are compared with (equivalence.py)
  fsdp2       (c) FSDP2 (`fully_shard`, torch.distributed with one process) equals the unsharded run
  compile     (d) `torch_compile=True` trains and its losses and state match the eager run
  throughput  sentences/s and peak GPU memory (`torch.cuda.max_memory_allocated`) of plain fine-tuning,
              SimCSE mode, MoCoSE and sentence-transformers MNRL, fp32 and bf16, batch 64 and 256, sequence
              length 32 (throughput.py); last, with the time left: runs that no longer fit are skipped

Exit status 0 when every section ran whole and every check passed, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

STARTED = time.monotonic()
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars (sentence-transformers' model card makes one)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this repository: its hf_mocose and scripts

from scripts import REPO  # noqa: E402  (and the offline defaults of every script)

CHECKS = ("ema_fp32_lerp", "queue_cpu_replay", "fsdp2_world1", "torch_compile", "export_embeddings")


@dataclass(frozen=True)
class Section:
    name: str
    checks: tuple[str, ...]
    want_s: tuple[float, float]  # seconds it is given when there is time (full size, tiny)
    min_s: tuple[float, float]  # seconds below which it is not started (full size, tiny)
    needs_reference: bool = False


SECTIONS = (
    Section("ema_queue", ("ema_fp32_lerp", "queue_cpu_replay"), (60, 25), (20, 5)),
    Section("export", ("export_embeddings",), (60, 25), (20, 5)),
    Section("reference", (), (40, 15), (15, 3)),
    Section("fsdp2", ("fsdp2_world1",), (90, 45), (40, 15), needs_reference=True),
    # inductor compiles MoCoSE's step twice: FGSM "previous" has no perturbation at the first step, then has one
    Section("compile", ("torch_compile",), (240, 30), (90, 10), needs_reference=True),
    Section("throughput", (), (0, 0), (30, 10)),  # last: whatever time is left, row by row
)


class SectionTimeout(BaseException):
    """A section ran past its time (BaseException: no `except Exception` inside a section swallows it)."""


@contextmanager
def time_limit(seconds: float):
    """Raises `SectionTimeout` in this (main) thread after `seconds` (SIGALRM)."""
    def expire(signum, frame):
        raise SectionTimeout(f"ran past its {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def section_limit(index: int, ctx, tiny: bool) -> tuple[float, float]:
    """(seconds section `index` may take, seconds it needs at least): what it wants of what is left, keeping the
    minimum of every later section; a section that wants 0 s (throughput) takes all of it."""
    which = 1 if tiny else 0
    section, later = SECTIONS[index], SECTIONS[index + 1:]
    limit = ctx.left() - sum(s.min_s[which] for s in later)
    if section.want_s[which]:
        limit = min(section.want_s[which], limit)
    return limit, section.min_s[which]


def write_report(results: dict, output_dir: Path) -> None:
    """gpu_check.json and gpu_check.md, each replaced whole (a reader never sees half a file)."""
    from scripts.gpu_check.report import markdown

    for name, text in (("gpu_check.json", json.dumps(results, indent=1, default=str)),
                       ("gpu_check.md", markdown(results))):
        partial = output_dir / f".{name}.partial"
        partial.write_text(text + "\n", encoding="utf-8")
        partial.replace(output_dir / name)


def run_section(section: Section, ctx, results: dict, state: dict, seconds: float) -> None:
    """Runs one section under its time limit and records its outcome in `results`."""
    from scripts.gpu_check.equivalence import check_compile, check_fsdp, recorded_run
    from scripts.gpu_check.mocose_checks import check_ema_and_queue, check_export
    from scripts.gpu_check.throughput import run_throughput

    name = section.name
    if name == "ema_queue":
        results["checks"].update(check_ema_and_queue(ctx))
    elif name == "export":
        results["checks"].update(check_export(ctx))
    elif name == "reference":
        state["reference"] = recorded_run(ctx, "reference")
        results["reference_losses"] = state["reference"]["losses"]
    elif name == "fsdp2":
        results["checks"].update(check_fsdp(ctx, state["reference"], Path(__file__).resolve(), seconds - 5))
    elif name == "throughput":
        run_throughput(ctx, time.monotonic() + seconds - 1, results["throughput"],
                       on_row=lambda: write_report(results, state["output_dir"]), variants=state["variants"])
    elif name == "compile":
        results["checks"].update(check_compile(ctx, state["reference"]))


def run_all(ctx, args, results: dict) -> None:
    output_dir = Path(args.output_dir)
    state = {"output_dir": output_dir, "variants": args.variants}
    for index, section in enumerate(SECTIONS):
        record = results["sections"][section.name] = {"status": "skipped", "seconds": 0.0}
        limit, minimum = section_limit(index, ctx, args.tiny)
        if section.name not in args.sections:
            record["reason"] = "not asked for (--sections)"
        elif section.needs_reference and "reference" not in state:
            record["reason"] = "needs the eager reference run, which did not complete"
        elif limit < minimum:
            record["reason"] = f"{limit:.0f} s for it, it needs at least {minimum:.0f} s"
        else:
            ctx.log(f"section {section.name}: starting ({limit:.0f} s for it)")
            start = time.monotonic()
            try:
                with time_limit(limit + (5 if section.name == "fsdp2" else 0)):
                    run_section(section, ctx, results, state, limit)
                record.update(status="ok")
            except (Exception, SectionTimeout) as err:  # noqa: BLE001 - recorded; the next sections go on
                record.update(status="failed", error=f"{type(err).__name__}: {err}"[:3000],
                              traceback=traceback.format_exc()[-4000:])
                ctx.log(f"section {section.name}: FAILED {record['error'][:500]}")
            record["seconds"] = round(time.monotonic() - start, 1)
            try:
                ctx.free_memory()
            except Exception as err:  # noqa: BLE001 - e.g. a CUDA error left by the section: the next may still run
                ctx.log(f"freeing memory after {section.name} failed: {err}")
            ctx.log(f"section {section.name}: {record['status']} in {record['seconds']} s")
        if record["status"] == "skipped":
            ctx.log(f"section {section.name}: skipped ({record['reason']})")
        for check in section.checks:
            if check not in results["checks"]:
                why = record.get("error") or record.get("reason") or "the section did not produce it"
                results["checks"][check] = {"passed": False, "value": None, "tolerance": None,
                                            "measure": None, "detail": {"not_measured": f"{section.name}: {why}"}}
        finish(results)
        write_report(results, output_dir)


def finish(results: dict) -> None:
    results["all_checks_passed"] = all(results["checks"].get(c, {}).get("passed") for c in CHECKS)
    results["complete"] = (all(s["status"] == "ok" for s in results["sections"].values())
                           and all(r.get("status") == "ok" for r in results["throughput"]))
    results["meta"]["elapsed_s"] = round(time.monotonic() - STARTED, 1)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", help="where gpu_check.json and gpu_check.md are written (required)")
    parser.add_argument("--tiny", action="store_true", help="tiny BERT (hidden 32, 2 layers), short runs; device cpu "
                        "unless --device says otherwise; under 2 minutes on a 2-core CPU")
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available, cpu with "
                        "--tiny)")
    parser.add_argument("--time_budget", type=float, default=None, help="seconds for everything, set-up included "
                        "(default 465, under 8 minutes; 110 with --tiny); sections that no longer fit are skipped")
    parser.add_argument("--sections", nargs="+", default=[s.name for s in SECTIONS],
                        choices=[s.name for s in SECTIONS], help="run only these sections")
    parser.add_argument("--variants", nargs="+", default=None, help="throughput variants (default: all of "
                        "throughput.VARIANTS)")
    parser.add_argument("--work_dir", default=None, help="for the encoder, checkpoints and exports (default: a "
                        "temporary folder, removed at the end)")
    parser.add_argument("--_fsdp_child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.output_dir and not args._fsdp_child:
        parser.error("--output_dir is required: the folder for gpu_check.json and gpu_check.md")
    return args


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.tiny and args.device in (None, "cpu"):
        # One thread: a tiny model gains nothing from more, and on a shared machine OpenMP's spin-waiting threads
        # made each step 5-30x slower (measured on the project's 2-core machine under load).
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args._fsdp_child:
        from scripts.gpu_check.equivalence import fsdp_child

        return fsdp_child(json.loads(args._fsdp_child))
    import torch
    from scripts.gpu_check.context import RunContext, Sizes, build_encoder, device_facts, quiet_libraries, versions
    from scripts.gpu_check.throughput import VARIANTS

    device = args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: torch {torch.__version__} sees no CUDA device; use --device cpu.")
    if device != "cpu" and not device.startswith("cuda"):
        raise SystemExit(f"--device {device!r}: use cuda, cuda:N or cpu.")
    args.variants = args.variants or list(VARIANTS)
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"--variants {' '.join(unknown)}: not a throughput variant; use some of {' '.join(VARIANTS)}.")
    budget = args.time_budget or (110.0 if args.tiny else 465.0)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    workdir.mkdir(parents=True, exist_ok=True)
    quiet_libraries()
    sizes = Sizes.tiny() if args.tiny else Sizes()
    ctx = RunContext(device=device, tiny=args.tiny, model_path=str(workdir / "encoder"), workdir=workdir,
                     deadline=STARTED + budget, sizes=sizes, started=STARTED)
    results = {"schema_version": 1, "checks": {}, "throughput": [], "sections": {}, "meta": {
        "command": "python scripts/gpu_check/run.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "started_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"), "tiny": args.tiny,
        "time_budget_s": budget, "git_commit": git_commit(), "versions": versions(), "hardware": device_facts(device),
        "sizes": asdict(sizes), "variants": args.variants}}
    ctx.log(f"device {device} ({results['meta']['hardware'].get('gpu', 'CPU')}), budget {budget:.0f} s, "
            f"torch {torch.__version__}")
    try:
        setup_start = time.monotonic()
        try:
            results["meta"]["model"] = build_encoder(Path(ctx.model_path), args.tiny, ctx.seed)
            results["sections"]["setup"] = {"status": "ok", "seconds": round(time.monotonic() - setup_start, 1)}
            ctx.log(f"encoder built: {results['meta']['model']}")
        except Exception as err:  # noqa: BLE001 - recorded: nothing else can run without the encoder
            results["sections"]["setup"] = {"status": "failed", "seconds": round(time.monotonic() - setup_start, 1),
                                            "error": f"{type(err).__name__}: {err}",
                                            "traceback": traceback.format_exc()}
            args.sections = []
        run_all(ctx, args, results)
    finally:
        if not args.work_dir:
            shutil.rmtree(workdir, ignore_errors=True)
    finish(results)
    write_report(results, output_dir)
    ctx.log(f"done in {results['meta']['elapsed_s']} s: all checks passed: {results['all_checks_passed']}, "
            f"complete: {results['complete']}; {output_dir / 'gpu_check.json'}")
    print((output_dir / "gpu_check.md").read_text(encoding="utf-8"), flush=True)
    return 0 if results["all_checks_passed"] and results["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())

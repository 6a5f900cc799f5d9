#!/usr/bin/env python
"""One-command acceptance run for one GPU: seven correctness checks, the user's own path, throughput, peak memory and
the EMA's share of a step, in under 8 minutes.

    bash scripts/gpu_check/device.sh                                  # on the GPU node: outputs/gpu_check
    PYTHONUNBUFFERED=1 python scripts/gpu_check/run.py --output_dir DIR   # on a GPU (cuda when available)
    python scripts/gpu_check/run.py --tiny --output_dir DIR               # the same on the CPU, tiny model

Needs torch, transformers, accelerate, sentence-transformers, datasets and this repository (on PYTHONPATH or
installed); nothing from the Hub: the encoder is a randomly initialised BERT-base built from `BertConfig()`
(`--tiny`: hidden 32, 2 layers) and its WordPiece tokenizer is made from Python's own documentation
(context.py); the user-path check starts from the bundled float16 all-MiniLM-L6-v2 (`scripts/gpu_check/bundle.py`).
Writes DIR/gpu_check.json and DIR/gpu_check.md after every section, so a run cut short still leaves what it measured;
everything, the imports included, runs inside one guard, so they are written whatever happens. When a package is
missing it stops before any work with one line that names it (preflight.py).

Sections, in order (each timed, given its share of the budget from the sections' own estimates (plan.py), recorded
as "not measured" with its reason and elapsed time when it runs out of time, its failure recorded without stopping
the others; `--sections` runs some of them, and the eager reference too when they compare with it):
  ema_queue   (a) the EMA target stays fp32 under bf16 autocast and equals a float64 reference lerp after N
              steps; (b) the key queue equals a CPU float64 replay of the same steps (mocose_checks.py)
  export      (e) the sentence-transformers export's embeddings equal the checkpoint's `MoCoSEModel.embed`
              on the device (mocose_checks.py)
  reference   the eager fp32 run that the next three are compared with (equivalence.py)
  gpu_cpu     (f) the reference run again on this machine's CPU: losses and final key queue agree
  fsdp2       (c) FSDP2 (`fully_shard`, torch.distributed with one process) equals the unsharded run
  user_path   (g) the README's quickstart through `accelerate launch` from the bundled MiniLM, as a user gets it
              (`bf16: auto`: bf16 on a GPU with native bf16): STS-B dev Spearman against the committed CPU run of
              the same job, and the training step time of both precisions (user_path.py)
  compile     (d) `torch_compile=True` trains and its losses and state match the eager run
  throughput  sentences/s, peak GPU memory (allocated and reserved) and the EMA's share of plain fine-tuning,
              SimCSE mode, MoCoSE and sentence-transformers MNRL at sequence length 32: bf16 at batch 256 first
              (eager, then compiled), then batch 512, bf16 at 64, fp32 (throughput.py); last, with the time left:
              rows that no longer fit are not measured, and marked so

Exit status (verdict.py): 0 every selected check ran and passed; 1 a check, section or row failed; 2 nothing failed
but a selected check or section ran out of time or was interrupted; 3 a package is missing or `datasets` cannot read
data (nothing ran).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

STARTED = time.monotonic()
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars (sentence-transformers' model card makes one)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this repository: its hf_mocose and scripts

from scripts import REPO  # noqa: E402  (and the offline defaults of every script)
from scripts.gpu_check.context import THROUGHPUT_VARIANTS, SectionTimeout  # noqa: E402  (no torch: stdlib only)
from scripts.gpu_check.plan import (  # noqa: E402
    NAMES,
    default_budget,
    expected_checks,
    section_limit,
    selected_sections,
)
from scripts.gpu_check.verdict import finish, not_measured  # noqa: E402


class Terminated(BaseException):
    """SIGTERM (`timeout` stops the run with it): raised so that the guard still writes the report."""


def on_sigterm(signum, frame):
    raise Terminated("SIGTERM: stopped from outside (device.sh's timeout?)")


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


def write_report(results: dict, output_dir: Path, final: bool = False) -> None:
    """gpu_check.json and gpu_check.md, each replaced whole (a reader never sees half a file)."""
    from scripts.gpu_check.report import markdown

    finish(results, final)
    results["meta"]["elapsed_s"] = round(time.monotonic() - STARTED, 1)
    for name, text in (("gpu_check.json", json.dumps(results, indent=1, default=str)),
                       ("gpu_check.md", markdown(results))):
        partial = output_dir / f".{name}.partial"
        partial.write_text(text + "\n", encoding="utf-8")
        partial.replace(output_dir / name)


def run_section(section, ctx, results: dict, state: dict, seconds: float) -> None:
    """Runs one section under its time limit and records its outcome in `results`."""
    from scripts.gpu_check.equivalence import check_compile, check_fsdp, check_gpu_cpu, recorded_run
    from scripts.gpu_check.mocose_checks import check_ema_and_queue, check_export
    from scripts.gpu_check.throughput import run_throughput
    from scripts.gpu_check.user_path import check_user_path

    name = section.name
    if name == "ema_queue":
        results["checks"].update(check_ema_and_queue(ctx))
    elif name == "export":
        results["checks"].update(check_export(ctx))
    elif name == "reference":
        state["reference"] = recorded_run(ctx, "reference")
        results["reference_losses"] = state["reference"]["losses"]
    elif name == "gpu_cpu":
        results["checks"].update(check_gpu_cpu(ctx, state["reference"]))
    elif name == "fsdp2":
        results["checks"].update(check_fsdp(ctx, state["reference"], Path(__file__).resolve(), seconds - 5))
    elif name == "user_path":
        try:
            results["checks"].update(check_user_path(ctx, state["bundle_dir"], seconds - 2))
        finally:  # the launches' logs beside the report
            for log in ctx.workdir.glob("quickstart-device*.log"):
                shutil.copyfile(log, state["output_dir"] / log.name.replace("quickstart-device", "quickstart"))
    elif name == "compile":
        results["checks"].update(check_compile(ctx, state["reference"]))
        state["compile_s"] = results["checks"]["torch_compile"]["detail"]["seconds"]
    elif name == "throughput":
        run_throughput(ctx, time.monotonic() + seconds - 1, results["throughput"],
                       on_row=lambda: write_report(results, state["output_dir"]), variants=state["variants"],
                       compile_s=state.get("compile_s"))


def run_all(ctx, args, results: dict, state: dict) -> None:
    sections = selected_sections(args.sections)
    for name in NAMES:  # the plan whole, in order: what is not run says why
        results["sections"][name] = ({"status": "pending", "seconds": 0.0} if name in results["meta"]["sections"] else
                                     {"status": "not_selected", "seconds": 0.0, "reason": "not asked for (--sections)"})
    for index, section in enumerate(sections):
        record = results["sections"][section.name] = {"status": "not_measured", "seconds": 0.0}
        limit, minimum = section_limit(section, sections[index + 1:], ctx.left(), args.tiny)
        reference = results["sections"].get("reference") or {}
        if results["sections"]["setup"]["status"] != "ok":
            record["reason"] = "needs the encoder, which could not be built (setup failed)"
        elif section.needs_reference and "reference" not in state:
            record["reason"] = f"needs the eager reference run, which {_outcome(reference)}"
        elif limit < minimum:
            record["reason"] = f"ran out of time: {max(limit, 0):.0f} s left for it, it needs at least {minimum:.0f} s"
        else:
            ctx.log(f"section {section.name}: starting ({limit:.0f} s for it)")
            record["status"] = "running"
            run_timed(section, ctx, results, state, limit, record)
        if record["status"] != "ok":
            ctx.log(f"section {section.name}: {record['status']} ({record.get('error') or record.get('reason')})")
        for check in section.checks:
            if check not in results["checks"]:
                if record["status"] == "failed":
                    results["checks"][check] = {**not_measured(f"{section.name}: {record['error']}"), "passed": False}
                else:
                    why = f"{section.name}: {record.get('reason')}"
                    results["checks"][check] = not_measured(why, record["seconds"])
        write_report(results, state["output_dir"])


def _outcome(record: dict) -> str:
    return {"failed": "failed", "not_measured": "ran out of time", "interrupted": "was interrupted"}.get(
        record.get("status"), "did not complete")


def run_timed(section, ctx, results: dict, state: dict, limit: float, record: dict) -> None:
    """Runs `section` under `limit` seconds and writes its outcome into `record`: ok; not measured when its time ran
    out (with the reason and the seconds it had run); failed on an error; interrupted (then re-raised) when the run
    is stopped from outside."""
    start = time.monotonic()
    try:
        with time_limit(limit + (5 if section.name == "fsdp2" else 0)):
            run_section(section, ctx, results, state, limit)
        record.update(status="ok")
    except (SectionTimeout, TimeoutError) as err:  # its own limit, or a child process's (run_own_session)
        record.update(status="not_measured", reason=f"ran out of time: {err}")
    except Exception as err:  # noqa: BLE001 - recorded; the next sections go on
        record.update(status="failed", error=f"{type(err).__name__}: {err}"[:3000],
                      traceback=traceback.format_exc()[-4000:])
    except BaseException as err:  # SIGTERM, Ctrl-C: recorded, then the run stops (main's guard)
        record.update(status="interrupted", reason=f"{type(err).__name__}: {err}"[:500])
        raise
    finally:
        record["seconds"] = round(time.monotonic() - start, 1)
    try:
        ctx.free_memory()
    except Exception as err:  # noqa: BLE001 - e.g. a CUDA error left by the section: the next may still run
        ctx.log(f"freeing memory after {section.name} failed: {err}")
    ctx.log(f"section {section.name}: {record['status']} in {record['seconds']} s")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", help="where gpu_check.json and gpu_check.md are written (required)")
    parser.add_argument("--tiny", action="store_true", help="tiny BERT (hidden 32, 2 layers), short runs; device cpu "
                        "unless --device says otherwise; about 2 minutes on a 2-core CPU")
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available, cpu with "
                        "--tiny)")
    parser.add_argument("--time_budget", type=float, default=None, help="seconds for everything, set-up included "
                        "(default: the set-up and the most each selected section may take, at most 465 s, under 8 "
                        "minutes; 300 s with --tiny); what no longer fits is not measured, and marked so")
    parser.add_argument("--sections", nargs="+", default=list(NAMES), choices=NAMES, help="run only these sections "
                        "(and the eager reference, when one of them compares with it), e.g. those a run did not "
                        "measure or that failed")
    parser.add_argument("--variants", nargs="+", default=None, help="throughput variants (default: all of "
                        "throughput.VARIANTS)")
    parser.add_argument("--bundle_dir", default=str(REPO / ".gpu_bundle"), help="what scripts/gpu_check/bundle.py wrote "
                        "(the user-path check's model, corpus and STS-B dev; default .gpu_bundle)")
    parser.add_argument("--work_dir", default=None, help="for the encoder, checkpoints and exports (default: a "
                        "temporary folder, removed at the end)")
    parser.add_argument("--_fsdp_child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.output_dir and not args._fsdp_child:
        parser.error("--output_dir is required: the folder for gpu_check.json and gpu_check.md")
    return args


def git_commit(bundle_dir: Path) -> tuple[str | None, str]:
    """(the commit this run's code is, where that was read): this checkout's `git rev-parse HEAD`; on a node given a
    copy of the checkout without `.git`, the commit `bundle.py` wrote into the bundle's manifest; else (None, why)."""
    from scripts.gpu_check.bundle import MANIFEST, checkout_commit

    commit = checkout_commit(REPO)
    if commit:
        return commit["git_commit"], "git" + (" (uncommitted changes)" if commit["git_dirty"] else "")
    manifest = bundle_dir / MANIFEST
    try:
        recorded = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, f"no .git here and no {manifest}"
    if not recorded.get("git_commit"):
        return None, f"no .git here, and {manifest} names no commit"
    dirty = " (uncommitted changes)" if recorded.get("git_dirty") else ""
    return recorded["git_commit"], f"{manifest.relative_to(REPO) if manifest.is_relative_to(REPO) else manifest}{dirty}"


def check_input(args) -> None:
    """Refuses a bad --device or --variants in one line, before any work or any file (no torch needed)."""
    device = args.device
    if device is not None and device != "cpu" and device.split(":")[0] != "cuda":
        raise SystemExit(f"--device {device!r}: use cuda, cuda:N or cpu.")
    args.variants = args.variants or list(THROUGHPUT_VARIANTS)
    unknown = sorted(set(args.variants) - set(THROUGHPUT_VARIANTS))
    if unknown:
        raise SystemExit(f"--variants {' '.join(unknown)}: not a throughput variant; use some of "
                         f"{' '.join(THROUGHPUT_VARIANTS)}.")


def start(args, results: dict, state: dict):
    """Everything up to the sections, inside the guard: the packages, the device, the encoder; returns the context
    (None when a package is missing: the caller stops)."""
    from scripts.gpu_check.context import versions
    from scripts.gpu_check.preflight import exercise_datasets, missing_modules, wheels_status

    missing = missing_modules()
    results["preflight"] = {"status": "failed" if missing else "ok", "missing": missing, "wheels": wheels_status()}
    results["meta"]["versions"] = versions()  # again: what the wheels installed is importable now
    if missing:
        return None
    broken = results["preflight"]["broken"] = exercise_datasets(state["workdir"])
    if broken:
        results["preflight"]["status"] = "failed"
        return None
    import torch

    from scripts.gpu_check.context import RunContext, Sizes, build_encoder, device_facts, quiet_libraries

    quiet_libraries()
    device = args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {device}: torch {torch.__version__} sees no CUDA device; use --device cpu.")
    sizes = Sizes.tiny() if args.tiny else Sizes()
    ctx = RunContext(device=device, tiny=args.tiny, model_path=str(state["workdir"] / "encoder"),
                     workdir=state["workdir"], deadline=STARTED + results["meta"]["time_budget_s"], sizes=sizes,
                     started=STARTED)
    results["meta"].update(hardware=device_facts(device), sizes=asdict(sizes))
    ctx.log(f"device {device} ({results['meta']['hardware'].get('gpu', 'CPU')}), budget "
            f"{results['meta']['time_budget_s']:.0f} s, torch {torch.__version__}")
    setup_start = time.monotonic()
    try:
        results["meta"]["model"] = build_encoder(Path(ctx.model_path), args.tiny, ctx.seed)
        results["sections"]["setup"] = {"status": "ok", "seconds": round(time.monotonic() - setup_start, 1)}
        ctx.log(f"encoder built: {results['meta']['model']}")
    except Exception as err:  # noqa: BLE001 - recorded: nothing else can run without the encoder
        results["sections"]["setup"] = {"status": "failed", "seconds": round(time.monotonic() - setup_start, 1),
                                        "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
    return ctx


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.tiny and args.device in (None, "cpu"):
        # One thread: a tiny model gains nothing from more, and on a shared machine OpenMP's spin-waiting threads
        # made each step 5-30x slower (measured on the project's 2-core machine under load).
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args._fsdp_child:
        from scripts.gpu_check.equivalence import fsdp_child

        return fsdp_child(json.loads(args._fsdp_child))
    check_input(args)
    from scripts.gpu_check.context import versions

    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    workdir.mkdir(parents=True, exist_ok=True)
    sections = selected_sections(args.sections)
    budget = args.time_budget or default_budget(sections, args.tiny)
    commit, commit_source = git_commit(Path(args.bundle_dir))
    results = {"schema_version": 3, "checks": {}, "throughput": [], "sections": {}, "meta": {
        "command": "python scripts/gpu_check/run.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "started_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"), "tiny": args.tiny,
        "time_budget_s": budget, "git_commit": commit, "git_commit_source": commit_source, "versions": versions(),
        "variants": args.variants, "sections": [s.name for s in sections],
        "expected_checks": expected_checks(sections)}}
    state = {"output_dir": output_dir, "workdir": workdir, "variants": args.variants,
             "bundle_dir": Path(args.bundle_dir)}
    previous_term = signal.signal(signal.SIGTERM, on_sigterm)
    line = None
    try:  # the guard: whatever happens from here on, the report is written
        ctx = start(args, results, state)
        if ctx is None:
            from scripts.gpu_check.preflight import stop_line

            line = stop_line(results["preflight"]["missing"], str(output_dir / "gpu_check.json"),
                             results["preflight"].get("broken"), results["meta"]["versions"])
        else:
            run_all(ctx, args, results, state)
            ctx.log(f"done: all checks passed: {results['all_checks_passed']}, failures: {results['failures']}; "
                    f"{output_dir / 'gpu_check.json'}")
    except BaseException as err:  # noqa: BLE001 - recorded in the report, which is written below
        # stopped from outside (SIGTERM, Ctrl-C): out of time, not a failure; any other error: a failure
        kind = "interrupted" if isinstance(err, (Terminated, KeyboardInterrupt)) else "fatal"
        results[kind] = {"error": f"{type(err).__name__}: {err}"[:3000], "traceback": traceback.format_exc()[-4000:]}
        line = f"gpu_check: stopped: {results[kind]['error'][:500]}; report: {output_dir / 'gpu_check.json'}"
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        if not args.work_dir:
            shutil.rmtree(workdir, ignore_errors=True)
        write_report(results, output_dir, final=True)
    if line is None:
        print((output_dir / "gpu_check.md").read_text(encoding="utf-8"), flush=True)
        print(f"gpu_check: exit status {results['exit_status']}: every check passed: {results['all_checks_passed']}, "
              f"failures: {', '.join(results['failures']) or 'none'}; not measured: "
              f"{len(results['not_measured']) or 'nothing'}", flush=True)
    else:
        print(line, flush=True)
    return results["exit_status"]


if __name__ == "__main__":
    sys.exit(main())

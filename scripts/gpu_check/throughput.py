"""The gpu_check's throughput section: sentences per second and peak memory of each training variant.

Each (batch size, precision, variant) trains alone, one after another, through its real `Trainer.train()` loop
as `scripts.benchmarks.train_variants` builds it (the variants of scripts/benchmarks/benchmark_train.py):

  plain            `transformers.Trainer` on the bare encoder, one view, loss mean(h_CLS^2): the floor
  simcse           `MoCoSETrainer`, method="simcse" (two dropout views, in-batch negatives)
  mocose_previous  `MoCoSETrainer`, method="mocose", fgsm_mode="previous" (the default MoCoSE step)
  st_mnrl          `SentenceTransformerTrainer` + `MultipleNegativesRankingLoss` on (s, s) pairs

Precision "bf16" is `bf16=True` in the training arguments (accelerate's autocast; the weights, the EMA target
and the optimizer state stay fp32). A step is timed from `on_step_begin` to `on_step_end` with a device
synchronisation at both ends (`scripts.benchmarks.turn_taking.StepTimer`); the figure is the median over the
steps after the warm-up. Peak memory is `torch.cuda.max_memory_allocated` over the whole run (model, optimizer state,
activations), reset before each run (what was still allocated then is `allocated_before_mib`, included in the
peak); on the CPU there is none to read.
"""

from __future__ import annotations

import statistics
import time

import torch

VARIANTS = ("plain", "simcse", "mocose_previous", "st_mnrl")
PRECISIONS = ("fp32", "bf16")


def plan(ctx, variants=VARIANTS) -> list[tuple[int, str, str]]:
    """The runs in the order they are made: for each batch size and precision, every variant (so that a run
    cut short by the deadline still leaves whole groups to compare)."""
    return [(batch, precision, variant) for batch in ctx.sizes.batch_sizes for precision in PRECISIONS
            for variant in variants]


def measure(ctx, variant: str, precision: str, batch_size: int) -> dict:
    """Trains one variant for warm-up + timed steps; returns its row of the throughput table."""
    from accelerate.utils import is_compiled_module

    from scripts.benchmarks.turn_taking import StepTimer

    sizes = ctx.sizes
    cfg = ctx.cfg(batch_size, sizes.timed_steps, warmup=sizes.warmup_steps, bf16=precision == "bf16")
    sentences, full_length = ctx.sentences((cfg.warmup + cfg.steps) * batch_size)
    ctx.free_memory()
    allocated_before = torch.cuda.memory_allocated(ctx.device) if ctx.cuda else None  # left over: should be ~0
    trainer, _ = ctx.trainer(variant, cfg, sentences, f"tp-{variant}")
    timer = StepTimer(variant, device=torch.device(ctx.device))  # no baton: one runner, no turns to take
    trainer.add_callback(timer)
    trainer.train()
    compiled = is_compiled_module(trainer.model_wrapped)  # never: an earlier compiled run must not carry over
    steps = timer.step_s[cfg.warmup:]
    median = statistics.median(steps)
    row = {"variant": variant, "precision": precision, "batch_size": batch_size,
           "max_seq_length": sizes.max_seq_length, "steps_timed": len(steps), "warmup_steps": cfg.warmup,
           "ms_per_step": round(1000 * median, 2), "sentences_per_second": round(batch_size / median, 1),
           "ms_per_step_all": [round(1000 * s, 2) for s in timer.step_s], "full_length_sentences": full_length,
           "compiled": compiled, "peak_memory_mib": None}
    if ctx.cuda:
        row["peak_memory_mib"] = round(torch.cuda.max_memory_allocated(ctx.device) / 2**20, 1)
        row["allocated_before_mib"] = round(allocated_before / 2**20, 1)
        row["cuda_matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32  # fp32 rows: TF32 or full fp32
    del trainer, timer
    ctx.free_memory()
    return row


def run_throughput(ctx, until: float, rows: list, on_row=None, variants=VARIANTS) -> None:
    """Appends one row per planned run to `rows` (calling `on_row()` after each), measured while there is time
    before `until` (a `time.monotonic()` value): a run is started only when the slowest run so far would still
    end in time; the others get a row with `status: skipped` and the reason. A run that
    fails gets `status: failed` and its error; the next runs go on."""
    took: list[float] = []
    for batch, precision, variant in plan(ctx, variants):
        key = f"{variant} {precision} batch {batch}"
        left = until - time.monotonic()
        needed = 1.2 * max(took, default=0.0)  # the longest run so far, with a margin
        base = {"variant": variant, "precision": precision, "batch_size": batch,
                "max_seq_length": ctx.sizes.max_seq_length}
        if left <= 0 or needed > left:
            rows.append({**base, "status": "skipped", "reason": f"{left:.0f} s left of the section, "
                                                               f"the longest run so far took {needed / 1.2:.0f} s"})
            ctx.log(f"throughput {key}: skipped ({rows[-1]['reason']})")
            continue
        start = time.monotonic()
        try:
            row = {**measure(ctx, variant, precision, batch), "status": "ok"}
            ctx.log(f"throughput {key}: {row['sentences_per_second']} sentences/s, {row['ms_per_step']} ms/step, "
                    f"peak {row['peak_memory_mib']} MiB")
        except Exception as err:  # noqa: BLE001 - recorded; the other runs go on
            row = {**base, "status": "failed", "error": f"{type(err).__name__}: {err}"[:2000]}
            ctx.log(f"throughput {key}: FAILED {row['error'][:300]}")
            ctx.free_memory()
        took.append(time.monotonic() - start)
        row["seconds"] = round(time.monotonic() - start, 1)
        rows.append(row)
        if on_row is not None:
            on_row()

"""The gpu_check's throughput section: sentences per second, peak memory and the EMA's share of each training variant.

Each (batch size, precision, variant, compiled) trains alone, one after another, through its real `Trainer.train()`
loop as `scripts.benchmarks.train_variants` builds it (the variants of scripts/benchmarks/benchmark_train.py):

  plain            `transformers.Trainer` on the bare encoder, one view, loss mean(h_CLS^2): the floor
  simcse           `MoCoSETrainer`, method="simcse" (two dropout views, in-batch negatives)
  mocose_previous  `MoCoSETrainer`, method="mocose", fgsm_mode="previous" (the default MoCoSE step)
  st_mnrl          `SentenceTransformerTrainer` + `MultipleNegativesRankingLoss` on (s, s) pairs

Precision "bf16" is `bf16=True` in the training arguments (accelerate's autocast; the weights, the EMA target
and the optimizer state stay fp32). Every row starts with full fp32 matrix products (TF32 off: what the Trainer's
unset `tf32` leaves an eager run, whatever an earlier row or section switched on; `context.full_fp32`), and records
the precision it trained with (`fp32_precision`, read through torch's new API only). `compiled` rows are `torch_compile=True` (inductor on CUDA; on the CPU the
"eager" backend, dynamo's capture alone: the compile check already runs `aot_eager` there, and a CPU row's time
means nothing worth AOTAutograd's half minute), after `compiled_warmup_steps` untimed steps (MoCoSE "previous"
compiles twice: its first step has no perturbation). A step is timed from `on_step_begin` to `on_step_end` with a
device synchronisation at both ends (`scripts.benchmarks.turn_taking.StepTimer`); the figure is the median over the
steps after the warm-up.

Per row: `peak_memory_mib` (`torch.cuda.max_memory_allocated`) and `peak_memory_reserved_mib`
(`max_memory_reserved`: what the caching allocator took from the GPU), both over the whole run and reset before it
(what was still allocated then is `allocated_before_mib`); on the CPU there is none to read. MoCoSE rows also get
`ema_ms`, the median EMA update (`EMATargetCallback.update`), and `ema_share` = ema_ms / ms_per_step. On CUDA the
update is timed with CUDA events around it, not with `train_variants.time_ema`'s synchronisations: those would stall
the queue of kernels in the middle of the very step it is compared with. `model_tflop_per_s` counts the encoder's
matrix products only (`sentence_flops`; docs/performance.md, "One-GPU acceptance check", has the arithmetic).

Rows run in order of what the performance goal needs first (`plan`); a row that would not end before the section's
deadline is not measured, with its reason, and so is a row the deadline cuts off, with the seconds it had run
(`status: not_measured`, not a failure).
"""

from __future__ import annotations

import statistics
import time

import torch

from scripts.gpu_check.context import THROUGHPUT_VARIANTS as VARIANTS
from scripts.gpu_check.context import SectionTimeout, fp32_precision, full_fp32

PRECISIONS = ("fp32", "bf16")
# compiled rows, bf16 at the main batch size: MoCoSE first (the goal's row), then the floor, whose compilation finds
# most of its kernels (the same shapes and dtype as MoCoSE's online encoder) in inductor's cache
COMPILED = ("mocose_previous", "plain")
LARGE_BATCH = ("plain", "mocose_previous")
# encoder forwards per sentence in one step: a backward costs two (input and weight gradients), a no-grad forward one
FORWARDS_PER_STEP = {"plain": 3, "simcse": 6, "mocose_previous": 4, "st_mnrl": 6}


def plan(ctx, variants=VARIANTS) -> list[tuple[int, str, str, bool]]:
    """(batch, precision, variant, compiled) in the order they run: the goal's group first (bf16 at the main batch
    size, every variant), then its compiled rows, the large batch, bf16 at the small batch, then fp32. Rows that do
    not fit are left unmeasured one by one, so a cheap row after an expensive one that did not fit still runs."""
    small, main = ctx.sizes.batch_sizes
    rows = [(main, "bf16", v, False) for v in variants]
    rows += [(main, "bf16", v, True) for v in COMPILED if v in variants]
    rows += [(ctx.sizes.large_batch, "bf16", v, False) for v in LARGE_BATCH if v in variants]
    rows += [(small, "bf16", v, False) for v in variants]
    rows += [(batch, "fp32", v, False) for batch in (main, small) for v in variants]
    return rows


def sentence_flops(config, seq_len: int) -> float:
    """Floating-point operations of one encoder forward of one sentence of `seq_len` tokens: the layers' matrix
    products (2 per weight per token: Q, K, V, output, two feed-forward) and attention's two (L x L) products; the
    embeddings, norms, heads and loss are left out (< 0.1 % for BERT-base at length 32)."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    return layers * seq_len * (2 * (4 * h * h + 2 * h * i) + 4 * seq_len * h)


class EMATimer:
    """Times each call of `ema_callback.update` (wrapped on the instance; the class is untouched)."""

    def __init__(self, ema_callback, device: torch.device):
        self.cuda = device.type == "cuda"
        self._events, self._seconds = [], []
        original = ema_callback.update

        def timed(decay):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                original(decay)
                end.record()
                self._events.append((start, end))
            else:
                t0 = time.perf_counter()
                original(decay)
                self._seconds.append(time.perf_counter() - t0)

        ema_callback.update = timed

    def seconds(self) -> list[float]:
        """Each update's time; call after the run (the device synchronised)."""
        return [s.elapsed_time(e) / 1000 for s, e in self._events] if self.cuda else list(self._seconds)


def measure(ctx, variant: str, precision: str, batch_size: int, compiled: bool = False) -> dict:
    """Trains one variant for warm-up + timed steps; returns its row of the throughput table."""
    from accelerate.utils import is_compiled_module
    from transformers import AutoConfig

    from scripts.benchmarks.turn_taking import StepTimer

    sizes = ctx.sizes
    warmup = sizes.compiled_warmup_steps if compiled else sizes.warmup_steps
    cfg = ctx.cfg(batch_size, sizes.timed_steps, warmup=warmup, bf16=precision == "bf16")
    sentences, full_length = ctx.sentences((cfg.warmup + cfg.steps) * batch_size)
    ctx.free_memory()
    full_fp32()
    allocated_before = torch.cuda.memory_allocated(ctx.device) if ctx.cuda else None  # left over: should be ~0
    overrides = {}
    if compiled:
        torch._dynamo.reset()  # fresh caches: no earlier run's graphs, no recompilation limit reached
        overrides = dict(torch_compile=True, torch_compile_backend="inductor" if ctx.cuda else "eager")
    trainer, ema = ctx.trainer(variant, cfg, sentences, f"tp-{variant}", **overrides)
    ema_timer = EMATimer(ema, torch.device(ctx.device)) if ema is not None else None
    timer = StepTimer(variant, device=torch.device(ctx.device))  # no baton: one runner, no turns to take
    trainer.add_callback(timer)
    try:
        trainer.train()
        is_compiled = is_compiled_module(trainer.model_wrapped)
    finally:
        if compiled:
            torch._dynamo.reset()  # the eager rows after it start clean
    steps = timer.step_s[cfg.warmup:]
    median = statistics.median(steps)
    flops = FORWARDS_PER_STEP[variant] * sentence_flops(AutoConfig.from_pretrained(ctx.model_path),
                                                        sizes.max_seq_length)
    row = {"variant": variant, "precision": precision, "batch_size": batch_size, "compiled": is_compiled,
           "max_seq_length": sizes.max_seq_length, "steps_timed": len(steps), "warmup_steps": cfg.warmup,
           "ms_per_step": round(1000 * median, 2), "sentences_per_second": round(batch_size / median, 1),
           "ms_per_step_all": [round(1000 * s, 2) for s in timer.step_s], "full_length_sentences": full_length,
           "model_tflop_per_s": round(batch_size / median * flops / 1e12, 3), "flops_per_sentence": flops,
           "ema_ms": None, "ema_share": None, "peak_memory_mib": None, "peak_memory_reserved_mib": None,
           "fp32_precision": fp32_precision()}  # fp32 rows: TF32 or full fp32
    if compiled:
        row["torch_compile_backend"] = overrides["torch_compile_backend"]
    if ema_timer is not None:
        ema_s = ema_timer.seconds()[cfg.warmup:]
        if ema_s:
            row["ema_ms"] = float(f"{1000 * statistics.median(ema_s):.4g}")
            row["ema_share"] = float(f"{statistics.median(ema_s) / median:.4g}")  # 4 significant digits
    if ctx.cuda:
        row["peak_memory_mib"] = round(torch.cuda.max_memory_allocated(ctx.device) / 2**20, 1)
        row["peak_memory_reserved_mib"] = round(torch.cuda.max_memory_reserved(ctx.device) / 2**20, 1)
        row["allocated_before_mib"] = round(allocated_before / 2**20, 1)
    del trainer, timer
    ctx.free_memory()
    return row


def estimate_s(took: dict, compiled: bool, variant: str, compile_s: float | None, tiny: bool) -> float:
    """How long a row will take: an eager row, the longest eager row so far (0 for the first); a compiled row, its
    variant's time if measured, else MoCoSE's compiled row or, before that, the compile check's time (the same MoCoSE
    step, compiled twice), halved for the plain encoder (one compilation of half the graph); else a guess."""
    if not compiled:
        return max((t for (c, _), times in took.items() if not c for t in times), default=0.0)
    if took.get((True, variant)):
        return max(took[(True, variant)])
    mocose = max(took.get((True, "mocose_previous"), []), default=None) or compile_s or (20.0 if tiny else 150.0)
    return mocose * (0.5 if variant != "mocose_previous" else 1.0)


def run_throughput(ctx, until: float, rows: list, on_row=None, variants=VARIANTS,
                   compile_s: float | None = None) -> None:
    """Appends one row per planned run to `rows` (calling `on_row()` after each), measured while there is time
    before `until` (a `time.monotonic()` value): a run is started only when its estimate (`estimate_s`, with a
    20 % margin) still ends in time; the others get a row with `status: not_measured` and the reason. A run that
    fails gets `status: failed` and its error; the next runs go on. When the section's time limit interrupts a run
    (`SectionTimeout`), that run (with the seconds it had run) and every one after it are not measured."""
    took: dict[tuple[bool, str], list[float]] = {}
    cut_off = None
    for batch, precision, variant, compiled in plan(ctx, variants):
        key = f"{variant} {precision} batch {batch}{' compiled' if compiled else ''}"
        base = {"variant": variant, "precision": precision, "batch_size": batch, "compiled": compiled,
                "max_seq_length": ctx.sizes.max_seq_length}
        left = until - time.monotonic()
        needed = 1.2 * estimate_s(took, compiled, variant, compile_s, ctx.tiny)
        if cut_off or left <= 0 or needed > left:
            reason = cut_off or f"ran out of time: {left:.0f} s left of the section, this run is expected to take " \
                f"{needed:.0f} s"
            rows.append({**base, "status": "not_measured", "reason": reason, "seconds": 0.0})
            ctx.log(f"throughput {key}: not measured ({reason})")
            continue
        start = time.monotonic()
        try:
            row = {**measure(ctx, variant, precision, batch, compiled), "status": "ok"}
            ctx.log(f"throughput {key}: {row['sentences_per_second']} sentences/s, {row['ms_per_step']} ms/step, "
                    f"EMA {row['ema_ms']} ms, peak {row['peak_memory_mib']} MiB ({row['peak_memory_reserved_mib']} "
                    "reserved)")
        except SectionTimeout:
            cut_off = f"ran out of time: the section's time ran out {time.monotonic() - start:.0f} s into {key}"
            row = {**base, "status": "not_measured", "reason": cut_off}
            ctx.log(f"throughput {key}: not measured ({cut_off})")
            _free_after_failure(ctx)
        except Exception as err:  # noqa: BLE001 - recorded; the other runs go on
            row = {**base, "status": "failed", "error": f"{type(err).__name__}: {err}"[:2000]}
            ctx.log(f"throughput {key}: FAILED {row['error'][:300]}")
            _free_after_failure(ctx)
        took.setdefault((compiled, variant), []).append(time.monotonic() - start)
        row["seconds"] = round(time.monotonic() - start, 1)
        rows.append(row)
        if on_row is not None:
            on_row()


def _free_after_failure(ctx) -> None:
    """What a failed or interrupted run left: its compiled graphs and its memory."""
    torch._dynamo.reset()
    try:
        ctx.free_memory()
    except Exception as err:  # noqa: BLE001 - a CUDA error left by the run: the next may still run
        ctx.log(f"freeing memory failed: {err}")

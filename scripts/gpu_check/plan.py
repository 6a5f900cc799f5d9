"""The gpu_check's plan: its sections in order, the checks each makes, how long each is expected to take and may
take, and how the time budget is shared out (run.py runs the sections, verdict.py judges what they left). No torch.

Every figure is a pair, (one GPU, `--tiny` on the CPU). The GPU figures are estimates, written before the one
H200 run (docs/performance.md, "One-GPU acceptance check", lists its measured seconds per section). The `--tiny`
ones were measured on a loaded 2-core CPU, with room to spare.
"""

from __future__ import annotations

from dataclasses import dataclass

CHECKS = ("ema_fp32_lerp", "queue_cpu_replay", "export_embeddings", "gpu_against_cpu", "fsdp2_world1",
          "quickstart_user_path", "torch_compile")
SETUP_S = (25.0, 10.0)  # interpreter start, imports and preflight, the random encoder built and saved
# The whole run's default budget: on the GPU, a run that ends within 8 minutes (device.sh's timeout is 540 s, a job
# scheduler's limit can then be 10 minutes); --tiny: a CPU run only needs a bound in case something hangs.
WINDOW_S = (465.0, 300.0)


@dataclass(frozen=True)
class Section:
    """One part of the run. `estimate_s`: how long it is expected to take; `max_s`: the most it may take (None:
    whatever is left, row by row: throughput); `min_s`: below this it is not started."""

    name: str
    checks: tuple[str, ...]
    estimate_s: tuple[float, float]
    max_s: tuple[float | None, float | None]
    min_s: tuple[float, float]
    needs_reference: bool = False


SECTIONS = (
    Section("ema_queue", ("ema_fp32_lerp", "queue_cpu_replay"), (10, 8), (60, 40), (20, 5)),
    Section("export", ("export_embeddings",), (20, 8), (60, 40), (20, 5)),
    Section("reference", (), (10, 5), (40, 30), (15, 3)),
    Section("gpu_cpu", ("gpu_against_cpu",), (15, 5), (60, 30), (20, 3), needs_reference=True),
    Section("fsdp2", ("fsdp2_world1",), (35, 20), (90, 60), (40, 15), needs_reference=True),
    # two launches of the quickstart: bf16 as `auto` gives it a GPU user, then fp32 for its step time
    Section("user_path", ("quickstart_user_path",), (70, 40), (150, 100), (60, 20)),
    # a cold inductor compile of BERT-base takes 100-200 s, and MoCoSE's step compiles twice (FGSM "previous" has no
    # perturbation at the first step): the sections before it leave it its estimate (`section_limit`)
    Section("compile", ("torch_compile",), (150, 15), (240, 60), (100, 10), needs_reference=True),
    # last: whatever time is left, row by row; its estimate is what every row takes (the budget of `--sections
    # throughput`), compiled ones included (inductor: ~150 s for MoCoSE, half that for plain)
    Section("throughput", (), (320, 120), (None, None), (30, 10)),
)
NAMES = tuple(s.name for s in SECTIONS)


def _pick(pair: tuple, tiny: bool):
    return pair[1 if tiny else 0]


def selected_sections(names) -> list[Section]:
    """The sections to run, in the plan's order: those named, and the eager reference run when one of them is
    compared with it (so that `--sections compile` alone reruns the compile check)."""
    names = set(names)
    if any(s.needs_reference for s in SECTIONS if s.name in names):
        names.add("reference")
    return [s for s in SECTIONS if s.name in names]


def expected_checks(sections: list[Section]) -> list[str]:
    """The checks the selected sections make, in `CHECKS` order; no other check is expected of the run."""
    made = {check for s in sections for check in s.checks}
    return [check for check in CHECKS if check in made]


def default_budget(sections: list[Section], tiny: bool) -> float:
    """Seconds for the whole run: the set-up plus the most each selected section may take (its estimate for the
    open-ended throughput), at most the window (`WINDOW_S`)."""
    need = _pick(SETUP_S, tiny) + sum(_pick(s.max_s, tiny) or _pick(s.estimate_s, tiny) for s in sections)
    return min(_pick(WINDOW_S, tiny), need)


def section_limit(section: Section, later: list[Section], left: float, tiny: bool) -> tuple[float, float]:
    """(seconds `section` may take, seconds it needs at least to be started), with `left` seconds of the budget
    left and the selected sections `later` still to run: at most its own `max_s`, and never so much that a later
    section loses its estimate (throughput, which takes what is left, keeps its minimum)."""
    reserve = sum(_pick(s.min_s if _pick(s.max_s, tiny) is None else s.estimate_s, tiny) for s in later)
    limit = left - reserve
    most = _pick(section.max_s, tiny)
    if most is not None:
        limit = min(most, limit)
    return limit, _pick(section.min_s, tiny)

"""The gpu_check's verdict on its results: what failed, what was not measured, whether the run is complete, and the
exit status. Time-outs are data: what ran out of time is "not measured" with its reason, never a failure.

Exit status:
  0  every expected check (those of the selected sections) ran and passed, and nothing failed; throughput rows that
     no longer fitted are listed under `not_measured` (the section measures as many as its time allows)
  1  a check, a section or a throughput row failed, or the run stopped on an error (`fatal`)
  2  nothing failed and every check measured passed, but an expected check or a selected section was not measured:
     it ran out of time, or the run was interrupted (SIGTERM, e.g. device.sh's `timeout`); rerun those sections
  3  a package is missing or `datasets` cannot read data (preflight): nothing ran
"""

from __future__ import annotations

from scripts.gpu_check.plan import NAMES, default_budget, selected_sections

FAILED_EXIT, NOT_MEASURED_EXIT, PREFLIGHT_EXIT = 1, 2, 3
GOAL_SENTENCES_PER_S = 7000  # MoCoSE BERT-base, bf16, length 32, one H100 (docs/performance.md, "One-GPU acceptance check")


def not_measured(why: str, seconds: float | None = None) -> dict:
    """A check's record when it did not run: `passed` is None (neither passed nor failed)."""
    detail = {"not_measured": why, **({} if seconds is None else {"seconds": round(seconds, 1)})}
    return {"passed": None, "value": None, "tolerance": None, "measure": None, "detail": detail}


def row_name(row: dict) -> str:
    return (f"throughput {row['variant']} {row['precision']} batch {row['batch_size']}"
            f"{' compiled' if row.get('compiled') else ''}")


def finish(results: dict, final: bool = False) -> None:
    """Writes the verdict into `results`. `final`: the run is over, so an expected check it never reached is not
    measured (with the error that stopped the run, if one did) and so is a selected section it never started."""
    checks, sections, rows = results["checks"], results["sections"], results["throughput"]
    expected = results["meta"]["expected_checks"]
    stopped = results.get("fatal") or results.get("interrupted")
    preflight = results.get("preflight", {}).get("status")
    if final:
        why = (stopped["error"] if stopped else "preflight failed: nothing ran" if preflight == "failed"
               else "the run ended before it")
        for check in expected:
            checks.setdefault(check, not_measured(why))
        for name in results["meta"]["sections"]:
            if sections.get(name, {}).get("status", "pending") in ("pending", "running"):
                sections[name] = {"status": "not_measured", "seconds": 0.0, "reason": why}
    results["all_checks_passed"] = all(checks.get(c, {}).get("passed") is True for c in expected)
    results["failures"] = ([f"check {c}" for c in expected if checks.get(c, {}).get("passed") is False]
                           + [f"section {n}" for n, s in sections.items() if s["status"] == "failed"]
                           + [row_name(r) for r in rows if r.get("status") == "failed"]
                           + (["fatal: " + results["fatal"]["error"]] if "fatal" in results else []))
    results["not_measured"] = (
        [f"check {c}: {checks[c]['detail']['not_measured']}" for c in expected
         if c in checks and checks[c]["passed"] is None]
        + [f"section {n} ({s['status']}): {s.get('reason', '')}" for n, s in sections.items()
           if s["status"] in ("not_measured", "interrupted")]
        + [f"{row_name(r)}: {r.get('reason', '')}" for r in rows if r.get("status") == "not_measured"])
    # complete: everything ran whole, every section of the plan included (a run of some sections is not complete)
    results["complete"] = (preflight == "ok" and not stopped and all(r.get("status") == "ok" for r in rows)
                           and all(sections.get(n, {}).get("status") == "ok" for n in ("setup", *NAMES)))
    short = (any(checks.get(c, {}).get("passed") is None for c in expected) or "interrupted" in results
             or any(s["status"] in ("not_measured", "interrupted") for s in sections.values()))
    results["rerun"] = rerun(results)
    results["exit_status"] = (PREFLIGHT_EXIT if preflight == "failed" else FAILED_EXIT if results["failures"]
                              else NOT_MEASURED_EXIT if short else 0)
    mocose = [r for r in rows if r.get("status") == "ok" and r["variant"] == "mocose_previous"
              and r["precision"] == "bf16"]
    best = max(mocose, key=lambda r: r["sentences_per_second"], default=None)
    results["goal"] = {"sentences_per_second": GOAL_SENTENCES_PER_S, "what": "MoCoSE (fgsm previous) BERT-base, bf16, "
                       "length 32, one H100", "applies": not results["meta"]["tiny"],
                       "best": best and {k: best[k] for k in ("sentences_per_second", "batch_size", "compiled")},
                       "met": bool(best and best["sentences_per_second"] >= GOAL_SENTENCES_PER_S)}


def rerun(results: dict) -> dict | None:
    """The device command that runs again only the sections that failed, ran out of time or were interrupted, and
    its default budget in seconds (the set-up and the most each may take, plan.py); None when there are none."""
    sections = results["sections"]
    names = [n for n in NAMES if sections.get(n, {}).get("status") in ("failed", "not_measured", "interrupted")]
    if not names:
        return None
    tiny = results["meta"]["tiny"]
    return {"command": f"bash scripts/gpu_check/device.sh {'--tiny ' if tiny else ''}--sections {' '.join(names)}",
            "budget_s": default_budget(selected_sections(names), tiny)}

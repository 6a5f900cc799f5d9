"""The Markdown report of the gpu_check (gpu_check.md), made from its JSON results (also from those of a run that
stopped early: every part it reads may be missing)."""

from __future__ import annotations


def _number(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value != 0 and (abs(value) < 0.1 or abs(value) >= 1e6):
        return f"{value:.2e}"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _cell(text) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def header(results: dict) -> list[str]:
    meta = results["meta"]
    hardware, v, model, sizes = (meta.get(k) or {} for k in ("hardware", "versions", "model", "sizes"))
    if "gpu" in hardware:
        where = (f"{hardware['gpu']} ({hardware['gpu_memory_gib']} GiB, compute capability {hardware['capability']}), "
                 f"CUDA {hardware['cuda']}")
    else:
        where = f"CPU ({hardware.get('cpu_threads', '?')} threads)"
    lines = [
        "# One-GPU acceptance run (`scripts/gpu_check/run.py`)",
        "",
        f"- device: `{hardware.get('device', 'not reached')}`, {where}; {hardware.get('platform', '-')}",
        f"- software: Python {v.get('python')}, torch {v.get('torch')}, transformers {v.get('transformers')}, "
        f"sentence-transformers {v.get('sentence-transformers')}, accelerate {v.get('accelerate')}, datasets "
        f"{v.get('datasets')}, huggingface_hub {v.get('huggingface-hub')}",
        f"- model: {model.get('model', '-')} ({_number(model.get('parameters'))} parameters), sequence length "
        f"{sizes.get('max_seq_length', '-')}; throughput: median of {sizes.get('timed_steps', '-')} steps after "
        f"{sizes.get('warmup_steps', '-')} warm-up steps ({sizes.get('compiled_warmup_steps', '-')} when compiled)",
        f"- command: `{meta['command']}` (commit {meta.get('git_commit') or 'unknown'}, from "
        f"{meta.get('git_commit_source', '-')}), started {meta['started_utc']}",
        f"- finished in {_number(meta.get('elapsed_s'))} s of a {_number(meta['time_budget_s'], 0)} s budget; "
        f"exit status **{results.get('exit_status')}**; sections run: {', '.join(meta.get('sections') or [])}; "
        f"every expected check passed: **{'yes' if results.get('all_checks_passed') else 'NO'}**; complete: "
        f"{'yes' if results.get('complete') else 'no'}; failures: {', '.join(results.get('failures') or []) or 'none'}",
    ]
    if results.get("not_measured"):
        lines.append(f"- not measured (out of time, not failures): {_cell('; '.join(results['not_measured'])[:1500])}")
    if results.get("rerun"):
        lines.append(f"- to run again only what failed or was not measured: `{results['rerun']['command']}` (budget "
                     f"{_number(results['rerun']['budget_s'], 0)} s; docs/performance.md, 'One-GPU acceptance check')")
    preflight = results.get("preflight") or {}
    if preflight.get("status") == "failed":
        broken = "; ".join(f"{what}: {error}" for what, error in (preflight.get("broken") or {}).items())
        trouble = (f"cannot import {', '.join(preflight['missing'])}" if preflight.get("missing") else
                   f"datasets cannot read data: {_cell(broken)}")
        lines.append(f"- **stopped before any work**: {trouble[:800]} (wheels: {preflight.get('wheels')})")
    for kind in ("fatal", "interrupted"):
        if kind in results:
            lines.append(f"- **stopped ({kind})**: {_cell(results[kind]['error'][:500])}")
    goal = results.get("goal") or {}
    if goal.get("applies"):
        best = goal.get("best") or {}
        lines.append(f"- goal: {goal['what']}, >= {goal['sentences_per_second']:,} sentences/s: best measured "
                     f"{_number(best.get('sentences_per_second'))} (batch {best.get('batch_size', '-')}, compiled "
                     f"{best.get('compiled', '-')}): **{'met' if goal.get('met') else 'not met'}**")
    return lines


def throughput_table(rows: list[dict]) -> list[str]:
    lines = ["", "## Throughput", "",
             "| variant | precision | batch | compiled | ms / step (median) | sentences / s | x plain step | model "
             "TFLOP/s | EMA ms (share) | peak MiB allocated | peak MiB reserved | status |",
             "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    plain = {(r["precision"], r["batch_size"], r.get("compiled")): r["ms_per_step"] for r in rows
             if r["variant"] == "plain" and r.get("status") == "ok"}
    for r in rows:
        base = plain.get((r["precision"], r["batch_size"], r.get("compiled")))
        ratio = f"{r['ms_per_step'] / base:.2f}" if base and r.get("status") == "ok" else "-"
        status = r.get("status", "-")
        note = status if status == "ok" else f"{status}: {r.get('reason') or r.get('error', '')}"
        ema = "-" if r.get("ema_ms") is None else f"{_number(r['ema_ms'], 2)} ({100 * r['ema_share']:.1f} %)"
        compiled = "yes" if r.get("compiled") else "no"
        lines.append(f"| {r['variant']} | {r['precision']} | {r['batch_size']} | {compiled} "
                     f"| {_number(r.get('ms_per_step'), 2)} | {_number(r.get('sentences_per_second'))} | {ratio} | "
                     f"{_number(r.get('model_tflop_per_s'))} | {ema} | {_number(r.get('peak_memory_mib'))} | "
                     f"{_number(r.get('peak_memory_reserved_mib'))} | {_cell(note[:200])} |")
    if not rows:
        lines.append("| (none measured) | | | | | | | | | | | |")
    return lines


def checks_table(checks: dict) -> list[str]:
    lines = ["", "## Checks", "", "| check | passed | measured | tolerance | what is measured |",
             "| --- | --- | ---: | ---: | --- |"]
    for name, check in checks.items():
        what = check.get("measure") or check.get("detail", {}).get("not_measured", "")
        passed = {True: "yes", False: "**NO**", None: "not measured"}[check["passed"]]
        lines.append(f"| {name} | {passed} | {_number(check.get('value'))} | {_number(check.get('tolerance'))} | "
                     f"{_cell(what)} |")
    user = checks.get("quickstart_user_path", {}).get("detail", {})
    if "device_run" in user:
        device, cpu, other = user["device_run"], user["cpu_reference"], user.get("other_precision_run", {})
        lines += ["", "Quickstart (`accelerate launch ... scripts/train.py training_args/quickstart.yaml`), as `bf16: "
                  f"auto` chose on {device['device']} ({device.get('precision')}; expected "
                  f"{user.get('auto_expected')}): STS-B dev Spearman {device['spearman']} after {device['steps']} "
                  f"steps in {device['wall_s']} s; CPU reference (fp32) {cpu['spearman']} after {cpu['steps']} steps "
                  f"in {cpu['wall_s']} s ({_cell(cpu.get('source', ''))}). The same job in "
                  f"{other.get('precision', '-')}: " + (f"Spearman {other['spearman']} in {other['wall_s']} s" if
                                                         "spearman" in other else _cell(other.get("not_measured") or
                                                                                        other.get("error") or "-"))
                  + f". Seconds per training step: {user.get('step_s') or '-'}."]
    return lines


def sections_table(sections: dict) -> list[str]:
    lines = ["", "## Sections", "", "| section | status | seconds | note |", "| --- | --- | ---: | --- |"]
    for name, record in sections.items():
        note = record.get("error") or record.get("reason") or ""
        lines.append(f"| {name} | {record['status']} | {_number(record.get('seconds'))} | {_cell(note[:300])} |")
    return lines


def markdown(results: dict) -> str:
    return "\n".join(header(results) + throughput_table(results["throughput"]) + checks_table(results["checks"])
                     + sections_table(results["sections"]))

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
        f"- command: `{meta['command']}` (commit {meta.get('git_commit') or 'unknown'}), started {meta['started_utc']}",
        f"- finished in {_number(meta.get('elapsed_s'))} s of a {_number(meta['time_budget_s'], 0)} s budget; "
        f"exit status **{results.get('exit_status')}**; every check passed: "
        f"**{'yes' if results.get('all_checks_passed') else 'NO'}**; failures: "
        f"{', '.join(results.get('failures') or []) or 'none'}",
    ]
    preflight = results.get("preflight") or {}
    if preflight.get("status") == "failed":
        lines.append(f"- **stopped before any work**: cannot import {', '.join(preflight['missing'])} (wheels: "
                     f"{preflight.get('wheels')})")
    if "fatal" in results:
        lines.append(f"- **stopped**: {_cell(results['fatal']['error'][:500])}")
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
        lines.append(f"| {name} | {'yes' if check['passed'] else '**NO**'} | {_number(check.get('value'))} | "
                     f"{_number(check.get('tolerance'))} | {_cell(what)} |")
    user = checks.get("quickstart_user_path", {}).get("detail", {})
    if "device_run" in user:
        device, cpu = user["device_run"], user["cpu_reference"]
        lines += ["", "Quickstart (`accelerate launch ... scripts/train.py training_args/quickstart.yaml`): STS-B dev "
                  f"Spearman {device['spearman']} on {device['device']} after {device['steps']} steps in "
                  f"{device['wall_s']} s; CPU reference {cpu['spearman']} after {cpu['steps']} steps in "
                  f"{cpu['wall_s']} s ({_cell(cpu.get('source', ''))})."]
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

"""The Markdown report of the gpu_check (gpu_check.md), made from its JSON results."""

from __future__ import annotations


def _number(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value != 0 and (abs(value) < 0.1 or abs(value) >= 1e6):
        return f"{value:.2e}"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def header(results: dict) -> list[str]:
    meta, hardware = results["meta"], results["meta"]["hardware"]
    v = meta["versions"]
    where = (f"{hardware['gpu']} ({hardware['gpu_memory_gib']} GiB, compute capability {hardware['capability']}), "
             f"CUDA {hardware['cuda']}" if "gpu" in hardware else f"CPU ({hardware['cpu_threads']} threads)")
    model = meta.get("model", {})
    sizes = meta["sizes"]
    return [
        "# One-GPU acceptance run (`scripts/gpu_check/run.py`)",
        "",
        f"- device: `{hardware['device']}`, {where}; {hardware['platform']}",
        f"- software: Python {v['python']}, torch {v['torch']}, transformers {v['transformers']}, "
        f"sentence-transformers {v['sentence-transformers']}, accelerate {v['accelerate']}, datasets {v['datasets']}, "
        f"huggingface_hub {v['huggingface-hub']}",
        f"- model: {model.get('model', '-')} ({_number(model.get('parameters'))} parameters), sequence length "
        f"{sizes['max_seq_length']}; throughput: median of {sizes['timed_steps']} steps after "
        f"{sizes['warmup_steps']} warm-up steps",
        f"- command: `{meta['command']}` (commit {meta.get('git_commit') or 'unknown'}), started {meta['started_utc']}",
        f"- finished in {_number(meta.get('elapsed_s'))} s of a {_number(meta['time_budget_s'], 0)} s budget; "
        f"every check passed: **{'yes' if results.get('all_checks_passed') else 'NO'}**; every section ran whole: "
        f"**{'yes' if results.get('complete') else 'NO'}**",
    ]


def throughput_table(rows: list[dict]) -> list[str]:
    lines = ["", "## Throughput", "",
             "| variant | precision | batch | ms / step (median) | sentences / s | x plain step | peak memory MiB "
             "(`torch.cuda.max_memory_allocated`) | status |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    plain = {(r["precision"], r["batch_size"]): r["ms_per_step"] for r in rows
             if r["variant"] == "plain" and r.get("status") == "ok"}
    for r in rows:
        base = plain.get((r["precision"], r["batch_size"]))
        ratio = f"{r['ms_per_step'] / base:.2f}" if base and r.get("status") == "ok" else "-"
        status = r.get("status", "-")
        note = status if status == "ok" else f"{status}: {r.get('reason') or r.get('error', '')}"
        lines.append(f"| {r['variant']} | {r['precision']} | {r['batch_size']} | {_number(r.get('ms_per_step'), 2)} | "
                     f"{_number(r.get('sentences_per_second'))} | {ratio} | {_number(r.get('peak_memory_mib'))} | "
                     f"{note[:200].replace('|', '/')} |")
    if not rows:
        lines.append("| (none measured) | | | | | | | |")
    return lines


def checks_table(checks: dict) -> list[str]:
    lines = ["", "## Checks", "", "| check | passed | measured | tolerance | what is measured |",
             "| --- | --- | ---: | ---: | --- |"]
    for name, check in checks.items():
        what = check.get("measure") or check.get("detail", {}).get("not_measured", "")
        lines.append(f"| {name} | {'yes' if check['passed'] else '**NO**'} | {_number(check.get('value'))} | "
                     f"{_number(check.get('tolerance'))} | {str(what).replace('|', '/')} |")
    return lines


def sections_table(sections: dict) -> list[str]:
    lines = ["", "## Sections", "", "| section | status | seconds | note |", "| --- | --- | ---: | --- |"]
    for name, record in sections.items():
        note = record.get("error") or record.get("reason") or ""
        lines.append(f"| {name} | {record['status']} | {_number(record.get('seconds'))} | "
                     f"{note[:300].replace('|', '/').replace(chr(10), ' ')} |")
    return lines


def markdown(results: dict) -> str:
    return "\n".join(header(results) + throughput_table(results["throughput"]) + checks_table(results["checks"])
                     + sections_table(results["sections"]))

"""scripts/gpu_check/: time-outs are data. What ran out of time is "not measured", with its reason and
seconds, never a failure; only the selected sections' checks are expected; an interrupted section says so; the exit
status tells the cases apart. Also: the budget shared out from the sections' own estimates, preflight reading data
through `datasets`, the commit named where `.git` did not travel, and TF32 set and read through torch's new API only.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # scripts/ is a package of the repository root

from scripts.gpu_check.plan import CHECKS, NAMES, SECTIONS  # noqa: E402
from scripts.gpu_check.verdict import finish, not_measured  # noqa: E402

FULL_FP32 = {"all": "ieee", "cuda_matmul": "ieee", "cudnn_conv": "ieee"}


def _results(expected=CHECKS, passed=True, rows=(), preflight="ok"):
    checks = {c: {"passed": passed, "value": 0.0, "tolerance": 1.0, "measure": "", "detail": {}} for c in expected}
    return {"checks": checks, "throughput": list(rows), "preflight": {"status": preflight},
            "sections": {name: {"status": "ok", "seconds": 1.0} for name in ("setup", *NAMES)},
            "meta": {"tiny": True, "expected_checks": list(expected), "sections": list(NAMES)}}


def _row(status: str, **extra) -> dict:
    return {"variant": "plain", "precision": "fp32", "batch_size": 64, "compiled": False, "status": status, **extra}


def test_exit_status_0_passed_1_failed_2_not_measured_3_preflight():
    results = _results()
    finish(results, final=True)
    assert (results["exit_status"], results["complete"], results["failures"]) == (0, True, [])
    assert results["not_measured"] == []
    assert results["rerun"] is None
    # a throughput row that no longer fitted: listed, the run not complete, the exit status still 0
    results = _results(rows=[_row("not_measured", reason="ran out of time: 3 s left")])
    finish(results, final=True)
    assert results["exit_status"] == 0 and results["complete"] is False and results["failures"] == []
    assert results["not_measured"] == ["throughput plain fp32 batch 64: ran out of time: 3 s left"]
    # a check whose section ran out of time: not a failure, its own exit status
    results = _results()
    results["checks"]["torch_compile"] = not_measured("compile: ran out of time: ran past its 240 s", 240.04)
    results["sections"]["compile"] = {"status": "not_measured", "seconds": 240.0, "reason": "ran past its 240 s"}
    finish(results, final=True)
    assert results["exit_status"] == 2 and results["failures"] == [] and not results["all_checks_passed"]
    assert results["not_measured"] == ["check torch_compile: compile: ran out of time: ran past its 240 s",
                                       "section compile (not_measured): ran past its 240 s"]
    assert results["checks"]["torch_compile"]["detail"]["seconds"] == 240.0
    assert results["rerun"] == {"command": "bash scripts/gpu_check/device.sh --tiny --sections compile",
                                "budget_s": 10 + 30 + 60}  # set-up, the reference it compares with, compile (tiny)
    results["checks"]["export_embeddings"]["passed"] = False  # and a check that failed: 1
    finish(results, final=True)
    assert results["exit_status"] == 1 and results["failures"] == ["check export_embeddings"]
    for broken in ({"rows": [_row("failed", error="RuntimeError: boom")]}, {"passed": False}):
        results = _results(**broken)
        finish(results, final=True)
        assert results["exit_status"] == 1 and results["failures"], broken
    results = _results(preflight="failed")
    results["checks"], results["sections"] = {}, {}
    finish(results, final=True)
    assert results["exit_status"] == 3 and results["complete"] is False
    assert all(results["checks"][c]["passed"] is None for c in CHECKS)


def test_checks_of_sections_not_selected_are_not_expected_and_do_not_count():
    from scripts.gpu_check.plan import expected_checks, selected_sections

    assert [s.name for s in selected_sections(["compile"])] == ["reference", "compile"]  # compared with it
    assert expected_checks(selected_sections(["throughput"])) == []
    assert expected_checks(selected_sections(["user_path", "ema_queue"])) == ["ema_fp32_lerp", "queue_cpu_replay",
                                                                              "quickstart_user_path"]
    results = _results(expected=())
    results["meta"]["sections"] = ["throughput"]
    finish(results, final=True)
    assert results["exit_status"] == 0 and results["checks"] == {} and results["all_checks_passed"]


def test_the_budget_comes_from_the_sections_estimates_and_compile_keeps_its_own():
    from scripts.gpu_check.plan import SETUP_S, WINDOW_S, default_budget, section_limit, selected_sections

    assert default_budget(list(SECTIONS), tiny=False) == WINDOW_S[0] == 465
    user_path = selected_sections(["user_path"])
    assert default_budget(user_path, tiny=False) == SETUP_S[0] + user_path[0].max_s[0]
    compile_, throughput = SECTIONS[-2:]
    assert compile_.name == "compile" and compile_.estimate_s[0] >= 150 and compile_.max_s[0] >= 240
    # every section keeping to its estimate: each may take its most, compile all of its 240 s
    left = WINDOW_S[0] - SETUP_S[0]
    for index, section in enumerate(SECTIONS[:-1]):
        limit, _ = section_limit(section, list(SECTIONS[index + 1:]), left, tiny=False)
        assert limit == section.max_s[0], section.name
        left -= section.estimate_s[0]
    # a section before compile that would overrun is cut, so that compile keeps its estimate and throughput its minimum
    limit, _ = section_limit(SECTIONS[5], [compile_, throughput], 250.0, tiny=False)
    assert SECTIONS[5].name == "user_path" and limit == 250 - compile_.estimate_s[0] - throughput.min_s[0]


def _main(tmp_path, monkeypatch, *argv) -> tuple[int, dict]:
    from scripts.gpu_check import run

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what main() sets for --tiny: undone after the test
    code = run.main(["--tiny", "--output_dir", str(tmp_path / "out"), "--work_dir", str(tmp_path / "w"), *argv])
    return code, json.loads((tmp_path / "out" / "gpu_check.json").read_text())


def test_a_section_that_runs_out_of_time_is_not_measured_never_failed(tmp_path, monkeypatch):
    from scripts.gpu_check import run

    monkeypatch.setattr(run, "section_limit", lambda section, later, left, tiny: (1.0, 0.1))
    monkeypatch.setattr(run, "run_section", lambda *args: time.sleep(30))
    code, results = _main(tmp_path, monkeypatch, "--sections", "ema_queue", "export")
    assert code == 2 and results["exit_status"] == 2 and results["failures"] == [] and not results["complete"]
    assert results["meta"]["expected_checks"] == ["ema_fp32_lerp", "queue_cpu_replay", "export_embeddings"]
    assert sorted(results["checks"]) == sorted(results["meta"]["expected_checks"])  # no other check expected
    for name in ("ema_queue", "export"):
        record = results["sections"][name]
        assert record["status"] == "not_measured" and record["reason"] == "ran out of time: ran past its 1 s"
        assert 1.0 <= record["seconds"] < 10
    check = results["checks"]["ema_fp32_lerp"]
    assert check["passed"] is None and check["detail"]["not_measured"] == "ema_queue: ran out of time: ran past its 1 s"
    assert 1.0 <= check["detail"]["seconds"] < 10
    assert {results["sections"][n]["status"] for n in NAMES if n not in ("ema_queue", "export")} == {"not_selected"}


def test_an_interrupted_section_says_so_with_its_seconds(tmp_path, monkeypatch, capsys):
    """SIGTERM (device.sh's `timeout`) in the middle of a section: that section is `interrupted` after the seconds
    it ran, the next one not measured, the report written, exit status 2 (out of time, not a failure)."""
    from scripts.gpu_check import run

    def terminated(*args):
        time.sleep(0.5)
        signal.raise_signal(signal.SIGTERM)  # to this (main) thread, as the kernel delivers timeout's to the process
        time.sleep(30)

    monkeypatch.setattr(run, "run_section", terminated)
    code, results = _main(tmp_path, monkeypatch, "--sections", "ema_queue", "export")
    assert code == 2 and results["interrupted"]["error"].startswith("Terminated: SIGTERM") and not results["complete"]
    ema, export = results["sections"]["ema_queue"], results["sections"]["export"]
    assert ema["status"] == "interrupted" and ema["reason"].startswith("Terminated") and 0.5 <= ema["seconds"] < 10
    assert export == {"status": "not_measured", "seconds": 0.0, "reason": results["interrupted"]["error"]}
    assert results["failures"] == [] and all(c["passed"] is None for c in results["checks"].values())
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("gpu_check: stopped: Terminated: SIGTERM")
    assert "| ema_queue | interrupted |" in (tmp_path / "out" / "gpu_check.md").read_text()


def test_throughput_alone_expects_no_check_and_exits_0(tmp_path, monkeypatch):
    from scripts.gpu_check import throughput

    def one_row(ctx, until, rows, **kwargs):
        rows.append(_row("ok", ms_per_step=10.0, sentences_per_second=6400.0, seconds=1.0))

    monkeypatch.setattr(throughput, "run_throughput", one_row)
    code, results = _main(tmp_path, monkeypatch, "--sections", "throughput")
    assert code == 0 and results["checks"] == {} and results["failures"] == [] and results["not_measured"] == []
    assert results["sections"]["throughput"]["status"] == "ok" and results["complete"] is False  # not every section


def test_preflight_stops_in_one_line_when_datasets_cannot_read_data(tmp_path, monkeypatch, capsys):
    """A pyarrow that does not fit `datasets` (simulated: `Dataset.map`, which `filter` uses too, raises)."""
    import datasets

    def broken(self, *args, **kwargs):
        raise TypeError("Expected bytes, got a 'int' object")  # what a mismatched pyarrow raises

    monkeypatch.setattr(datasets.Dataset, "map", broken)
    code, results = _main(tmp_path, monkeypatch)
    assert code == 3 and results["preflight"]["status"] == "failed" and results["complete"] is False
    assert set(results["preflight"]["broken"]) == {"Dataset.from_dict(...).map(...)",
                                                   "the text loader (load_sentences of a .txt file)"}
    line = capsys.readouterr().out.strip().splitlines()[-1]
    versions = results["meta"]["versions"]
    assert line.startswith(f"gpu_check: stopped before any work: datasets {versions['datasets']} cannot read data "
                           f"with pyarrow {versions['pyarrow']} and fsspec {versions['fsspec']}")
    assert "TypeError: Expected bytes" in line and line.endswith(str(tmp_path / "out" / "gpu_check.json"))
    assert "datasets cannot read data" in (tmp_path / "out" / "gpu_check.md").read_text()


def test_without_git_the_report_names_the_commit_the_bundle_recorded(tmp_path, monkeypatch):
    from scripts.gpu_check import bundle, run

    assert bundle.checkout_commit(tmp_path) is None  # no checkout there
    assert bundle.checkout_commit(REPO / "scripts") is None  # inside a checkout is not the top of one
    (tmp_path / bundle.MANIFEST).write_text(json.dumps({"git_commit": "0123abc", "git_dirty": True}))
    monkeypatch.setattr(bundle, "checkout_commit", lambda repo: None)  # as on a node given a copy without .git
    assert run.git_commit(tmp_path) == ("0123abc", f"{tmp_path / bundle.MANIFEST} (uncommitted changes)")
    (tmp_path / bundle.MANIFEST).unlink()
    assert run.git_commit(tmp_path) == (None, f"no .git here and no {tmp_path / bundle.MANIFEST}")


@pytest.fixture
def restore_fp32_precision():
    saved = (torch.backends.fp32_precision, torch.backends.cuda.matmul.fp32_precision,
             torch.backends.cudnn.conv.fp32_precision)
    yield
    torch.backends.fp32_precision, torch.backends.cuda.matmul.fp32_precision = saved[:2]
    torch.backends.cudnn.conv.fp32_precision = saved[2]


def test_tf32_is_set_and_read_through_the_new_api_after_transformers_set_it(tmp_path, restore_fp32_precision):
    """transformers' `enable_tf32` (torch_compile=True on a GPU) sets the process-wide `fp32_precision`; from then on
    the legacy flag cannot be read, on the CPU too. The code that sets and reads the flags runs after it."""
    from scripts.gpu_check.context import RunContext, Sizes, build_encoder
    from scripts.gpu_check.equivalence import recorded_run
    from scripts.gpu_check.throughput import measure

    torch.backends.fp32_precision = "tf32"
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        _ = torch.backends.cuda.matmul.allow_tf32  # the trap the old throughput.py fell into
    ctx = RunContext(device="cpu", tiny=True, model_path=str(tmp_path / "encoder"), workdir=tmp_path,
                     deadline=time.monotonic() + 600, sizes=Sizes.tiny())
    build_encoder(Path(ctx.model_path), tiny=True)
    row = measure(ctx, "plain", "fp32", 8)
    assert row["fp32_precision"] == FULL_FP32 and row["sentences_per_second"] > 0
    torch.backends.fp32_precision = "tf32"
    run = recorded_run(ctx, "reference")
    assert run["how"]["fp32_precision"] == FULL_FP32 and len(run["losses"]) == ctx.sizes.equivalence_steps


def test_no_legacy_tf32_flag_is_left_in_the_library_or_the_scripts():
    legacy = "allow_" + "tf32"
    hits = [f"{path.relative_to(REPO)}:{number}" for folder in ("hf_mocose", "scripts")
            for path in sorted((REPO / folder).rglob("*")) if path.suffix in (".py", ".sh")
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if legacy in line]
    assert hits == []

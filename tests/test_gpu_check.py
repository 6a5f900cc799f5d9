"""scripts/gpu_check/, the one-GPU acceptance check, in its `--tiny` form on the CPU.

The whole run goes through scripts/gpu_check/device.sh, the command prepared for the GPU machine (no wheels to
install here); another run of it hides the bundled packages and must end in one line and a report; the other tests
show that the checks fail when what they check is broken, and check the bundle, the verdict (what ran out of time
is "not measured", never a failure), the plan and its time budget, and the TF32 flags (new API only).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DEVICE_SCRIPT = REPO / "scripts" / "gpu_check" / "device.sh"
sys.path.insert(0, str(REPO))  # scripts/ is a package of the repository root
from scripts.gpu_check.bundle import checkout_commit  # noqa: E402  (no torch, nothing heavy)
CHECKS = ("ema_fp32_lerp", "queue_cpu_replay", "export_embeddings", "gpu_against_cpu", "fsdp2_world1",
          "quickstart_user_path", "torch_compile")
SECTIONS = ("setup", "ema_queue", "export", "reference", "gpu_cpu", "fsdp2", "user_path", "compile", "throughput")
VARIANTS = ("plain", "mocose_previous")
# Makes the bundled packages absent for a Python started with this file's folder on PYTHONPATH: the path finder
# does not find them (as on a node without the wheels), so `import datasets` raises ModuleNotFoundError and
# `importlib.util.find_spec` returns None, as it would.
HIDE_BUNDLED = """import importlib.machinery as machinery
HIDDEN = {"datasets", "dill", "multiprocess"}
_find = machinery.PathFinder.find_spec.__func__
def find_spec(cls, fullname, path=None, target=None):
    return None if fullname.partition(".")[0] in HIDDEN else _find(cls, fullname, path, target)
machinery.PathFinder.find_spec = classmethod(find_spec)
"""


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """`bash scripts/gpu_check/device.sh --tiny ...` with two throughput variants (the default has four) and a
    budget no loaded CI machine runs out of (the default, 300 s, leaves unmeasured what no longer fits)."""
    out = tmp_path_factory.mktemp("gpu_check")
    env = {**os.environ, "GPU_CHECK_OUTPUT": str(out / "report"), "GPU_CHECK_WHEELS": str(out / "no-wheels"),
           "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(DEVICE_SCRIPT), "--tiny", "--time_budget", "500",
                           "--variants", *VARIANTS], env=env, capture_output=True, text=True, timeout=900)
    return proc, out / "report"


@pytest.mark.slow
def test_tiny_run_passes_every_check_and_writes_json_table_and_log(tiny_run):
    proc, report = tiny_run
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    results = json.loads((report / "gpu_check.json").read_text())
    assert results["schema_version"] == 3 and results["all_checks_passed"] and results["exit_status"] == 0
    assert results["failures"] == [] and results["not_measured"] == [] and results["complete"] is True
    assert results["preflight"]["status"] == "ok" and results["preflight"]["broken"] == {}  # datasets reads data
    assert "fatal" not in results and "interrupted" not in results
    meta = results["meta"]
    assert meta["sections"] == list(SECTIONS[1:]) and meta["expected_checks"] == list(CHECKS)
    checkout = checkout_commit(REPO)  # None where the tests run from a copy without .git
    if checkout:
        assert meta["git_commit"] == checkout["git_commit"] and meta["git_commit_source"].startswith("git")
    assert meta["tiny"] and meta["hardware"]["device"] == "cpu" and meta["model"]["layers"] == 2
    assert meta["versions"]["torch"] in (torch.__version__, torch.__version__.split("+")[0])
    assert 0 < meta["elapsed_s"] <= meta["time_budget_s"]
    assert [name for name in results["sections"]] == list(SECTIONS)
    assert all(s["status"] == "ok" and s["seconds"] >= 0 for s in results["sections"].values())
    assert sorted(results["checks"]) == sorted(CHECKS)
    for name, check in results["checks"].items():
        assert set(check) == {"passed", "value", "tolerance", "measure", "detail"}, name
        assert check["passed"] is True and 0 <= check["value"] <= check["tolerance"], (name, check)
    checks = {name: check["detail"] for name, check in results["checks"].items()}
    assert checks["fsdp2_world1"]["run"]["fsdp"] is True
    assert checks["torch_compile"]["graphs_captured"] > 0
    assert checks["ema_fp32_lerp"]["target_linear_output_dtype"] == "torch.bfloat16"  # bf16 on
    assert checks["queue_cpu_replay"]["initial_fill"] == 3  # build_trainer's overrides reach the queue
    assert checks["export_embeddings"]["modules"] == ["Transformer", "Pooling", "Dense"]
    # GPU against CPU on a CPU-only machine: the same code, marked as CPU against CPU
    gpu_cpu = checks["gpu_against_cpu"]
    assert gpu_cpu["cpu_against_cpu"] is True and gpu_cpu["devices"] == ["cpu", "cpu"]
    assert len(gpu_cpu["cpu_losses"]) == 3 and gpu_cpu["loss_relative_error"] <= gpu_cpu["loss_tolerance"]
    # the user's path: the quickstart through accelerate launch, its score, steps and wall time, and the reference
    user = checks["quickstart_user_path"]
    assert user["cpu_against_cpu"] is True and user["same_inputs"] and user["same_steps"]
    run = user["device_run"]
    assert run["steps"] == 3 and run["wall_s"] > 0 and math.isfinite(run["spearman"]) and len(run["evaluations"]) == 2
    assert run["command"].startswith("accelerate launch --config_file configs/accelerate/default.yaml "
                                     "scripts/train.py training_args/quickstart.yaml ")
    # as `bf16: auto` chose on this CPU (what choose_auto_bf16 says it must), then the other precision, both timed
    assert run["precision"] == user["auto_expected"] and run["auto_line"].startswith("bf16: auto -> ")
    other = user["other_precision_run"]
    assert {run["precision"], other["precision"]} == {"bf16", "fp32"} and other["steps"] == 3
    assert "--bf16" not in run["command"]
    assert other["command"].endswith(f"--bf16 {str(other['precision'] == 'bf16').lower()}")
    assert set(user["step_s"]) == {"bf16", "fp32", "fp32_over_bf16"} and user["step_s"]["bf16"] > 0
    assert user["step_s"]["fp32_over_bf16"] == pytest.approx(user["step_s"]["fp32"] / user["step_s"]["bf16"], rel=1e-2)
    rows = results["throughput"]
    expected = ([(v, "bf16", 256, False) for v in VARIANTS] + [(v, "bf16", 256, True) for v in VARIANTS[::-1]]
                + [(v, "bf16", 512, False) for v in VARIANTS] + [(v, "bf16", 64, False) for v in VARIANTS]
                + [(v, "fp32", b, False) for b in (256, 64) for v in VARIANTS])
    assert [(r["variant"], r["precision"], r["batch_size"], r["compiled"]) for r in rows] == expected
    for row in rows:
        assert row["status"] == "ok" and row["sentences_per_second"] > 0, row
        assert row["peak_memory_mib"] is None and row["peak_memory_reserved_mib"] is None, row  # none on the CPU
        assert row["steps_timed"] == 3 and math.isclose(row["sentences_per_second"],
                                                         row["batch_size"] / row["ms_per_step"] * 1000, rel_tol=0.01)
        if row["variant"] == "mocose_previous":
            assert row["ema_ms"] > 0 and 0 < row["ema_share"] < 1, row
            assert math.isclose(row["ema_share"], row["ema_ms"] / row["ms_per_step"], rel_tol=0.01)
        else:
            assert row["ema_ms"] is None and row["ema_share"] is None, row
        if row["compiled"]:
            assert row["torch_compile_backend"] == "eager" and row["warmup_steps"] == 3, row
        assert row["fp32_precision"] == {"all": "ieee", "cuda_matmul": "ieee", "cudnn_conv": "ieee"}, row
    table = (report / "gpu_check.md").read_text()
    assert "## Throughput" in table and "## Checks" in table and "## Sections" in table
    for name in CHECKS:
        assert f"| {name} | yes |" in table
    assert table.count("| ok |") >= len(rows) + len(SECTIONS)
    assert "Quickstart (`accelerate launch" in table
    log = (report / "gpu_check.log").read_text()
    assert f"torch {torch.__version__}" in log and "exit status 0" in log
    for log in ("quickstart.log", f"quickstart-{other['precision']}.log"):  # the launched jobs' own output
        assert "STS-B dev Spearman" in (report / log).read_text()


def test_without_the_bundled_packages_the_node_script_ends_in_one_line_and_a_report(tmp_path):
    """datasets, dill and multiprocess hidden, no wheels to install: nothing runs, the last line names them, the
    wheels and the bundle, and gpu_check.json says so (exit status 3)."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_BUNDLED)
    out = tmp_path / "report"
    env = {**os.environ, "PYTHONPATH": str(hide), "GPU_CHECK_OUTPUT": str(out),
           "GPU_CHECK_WHEELS": str(tmp_path / "no-wheels"), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(DEVICE_SCRIPT), "--tiny"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("gpu_check: stopped before any work: cannot import datasets, dill, multiprocess")
    for name in ("datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19", '".gpu_bundle"',
                 "scripts/gpu_check/bundle.py", f"none in {tmp_path / 'no-wheels'}", str(out / "gpu_check.json")):
        assert name in lines[-1], name
    assert "Traceback" not in proc.stdout + proc.stderr
    results = json.loads((out / "gpu_check.json").read_text())
    assert results["preflight"]["status"] == "failed" and results["exit_status"] == 3 and results["complete"] is False
    assert {"datasets", "dill", "multiprocess"} <= set(results["preflight"]["missing"])
    assert sorted(results["checks"]) == sorted(CHECKS)
    assert all(c["passed"] is None and c["detail"]["not_measured"] == "preflight failed: nothing ran"
               for c in results["checks"].values())
    assert "stopped before any work" in (out / "gpu_check.md").read_text()
    assert lines[-1] in (out / "gpu_check.log").read_text()


def test_device_script_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(DEVICE_SCRIPT)]).returncode == 0


@pytest.mark.parametrize("argv, message", [
    (["--device", "tpu"], "--device 'tpu': use cuda, cuda:N or cpu."),
    (["--tiny", "--variants", "plain", "bogus"], "--variants bogus: not a throughput variant"),
])
def test_bad_input_is_refused_in_one_line_before_any_work(argv, message, tmp_path):
    from scripts.gpu_check import run

    with pytest.raises(SystemExit, match=message.replace("(", r"\(").replace(")", r"\)")):
        run.main(["--output_dir", str(tmp_path / "out"), *argv])
    assert not (tmp_path / "out").exists()


def _context(tmp_path):
    from scripts.gpu_check.context import RunContext, Sizes, build_encoder

    ctx = RunContext(device="cpu", tiny=True, model_path=str(tmp_path / "encoder"), workdir=tmp_path,
                     deadline=time.monotonic() + 600, sizes=Sizes.tiny())
    build_encoder(Path(ctx.model_path), tiny=True)
    return ctx


def test_ema_and_queue_checks_fail_when_the_update_or_the_queue_is_wrong(tmp_path, monkeypatch):
    """A lerp with eta and 1 - eta swapped, and keys written one slot off: both checks say NO."""
    from hf_mocose.models.queue import KeyQueue
    from hf_mocose.models.ema import EMATargetCallback
    from scripts.gpu_check.mocose_checks import check_ema_and_queue

    @torch.no_grad()
    def swapped_lerp(self, decay):
        torch._foreach_lerp_(self.pairs.target_params, self.pairs.online_params, decay)
        self.last_decay = decay

    enqueue = KeyQueue.enqueue
    monkeypatch.setattr(EMATargetCallback, "update", swapped_lerp)
    monkeypatch.setattr(KeyQueue, "enqueue", lambda self, keys: enqueue(self, keys.roll(1, dims=0)))
    results = check_ema_and_queue(_context(tmp_path))
    assert not results["ema_fp32_lerp"]["passed"] and results["ema_fp32_lerp"]["value"] > 1e-3
    assert not results["queue_cpu_replay"]["passed"] and results["queue_cpu_replay"]["value"] > 1e-2


def test_equivalence_check_fails_on_a_different_state_or_loss():
    from scripts.gpu_check.equivalence import LOSS_RTOL, STATE_RTOL, compare

    torch.manual_seed(0)
    start = {"w": torch.randn(10, 10), "queue": torch.randn(4, 3)}
    update = {k: 0.1 * torch.randn_like(v) for k, v in start.items()}
    reference = {"losses": [2.0, 1.5], "initial": start, "final": {k: start[k] + update[k] for k in start},
                 "how": {}}

    def run(losses=(2.0, 1.5), shift=0.0):
        return {"losses": list(losses), "final": {k: start[k] + (1 + shift) * update[k] for k in start}, "how": {}}

    assert compare(reference, run(), "same", True)["passed"]
    off = compare(reference, run(shift=10 * STATE_RTOL), "off", True)
    assert not off["passed"] and off["value"] == pytest.approx(10 * STATE_RTOL, rel=1e-3)
    assert not compare(reference, run(losses=(2.0, 1.5 * (1 + 10 * LOSS_RTOL))), "loss", True)["passed"]
    assert not compare(reference, run(losses=(2.0,)), "a step short", True)["passed"]
    assert not compare(reference, run(), "not sharded", False)["passed"]


def test_an_error_anywhere_still_writes_the_report_and_one_line(tmp_path, monkeypatch, capsys):
    """Inside the guard from the first import on: an error before any section is recorded as `fatal`."""
    from scripts.gpu_check import preflight, run

    def broken(*_):
        raise RuntimeError("the image is broken")

    monkeypatch.setattr(preflight, "missing_modules", broken)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what main() sets for --tiny: undone after the test
    assert run.main(["--tiny", "--output_dir", str(tmp_path / "out"), "--work_dir", str(tmp_path / "w")]) == 1
    results = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert results["fatal"]["error"] == "RuntimeError: the image is broken" and results["exit_status"] == 1
    assert all(c["detail"]["not_measured"] == "RuntimeError: the image is broken" for c in results["checks"].values())
    assert results["complete"] is False and results["failures"] == ["fatal: RuntimeError: the image is broken"]
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("gpu_check: stopped: RuntimeError: the image")
    assert (tmp_path / "out" / "gpu_check.md").is_file()


def test_throughput_plan_puts_the_goal_first_then_compiled_then_batch_512():
    from types import SimpleNamespace

    from scripts.gpu_check.context import Sizes
    from scripts.gpu_check.throughput import VARIANTS, plan

    rows = plan(SimpleNamespace(sizes=Sizes()), VARIANTS)
    assert rows[:4] == [(256, "bf16", v, False) for v in VARIANTS]
    assert rows[4:6] == [(256, "bf16", "mocose_previous", True), (256, "bf16", "plain", True)]
    assert rows[6:8] == [(512, "bf16", "plain", False), (512, "bf16", "mocose_previous", False)]
    assert len(rows) == 8 + 3 * len(VARIANTS) and len(set(rows)) == len(rows)


def test_a_compiled_row_is_estimated_from_the_compile_check_then_from_measured_rows():
    from scripts.gpu_check.throughput import estimate_s

    took = {(False, "plain"): [5.0], (False, "mocose_previous"): [7.0]}
    assert estimate_s(took, False, "st_mnrl", 100.0, False) == 7.0  # the longest eager row
    assert estimate_s(took, True, "mocose_previous", 100.0, False) == 100.0  # the compile check's time
    assert estimate_s(took, True, "plain", 100.0, False) == 50.0
    assert estimate_s(took, True, "plain", None, False) == 75.0  # no compile check: a guess
    took[(True, "mocose_previous")] = [80.0]
    assert estimate_s(took, True, "plain", 100.0, False) == 40.0  # MoCoSE's compiled row measured


def test_flop_count_of_bert_base_is_the_documented_one():
    """docs/performance.md, "One-GPU acceptance check": 5.47 GFLOP per sentence of 32 tokens and encoder forward; MoCoSE 4 of them."""
    from transformers import BertConfig

    from scripts.gpu_check.throughput import FORWARDS_PER_STEP, sentence_flops

    forward = sentence_flops(BertConfig(), 32)
    assert forward == 12 * 32 * (2 * (4 * 768**2 + 2 * 768 * 3072) + 4 * 32 * 768) == 5_473_566_720
    assert FORWARDS_PER_STEP["mocose_previous"] * forward == 21_894_266_880
    assert round(989e12 / (4 * forward)) == 45_172


def test_the_bundle_holds_a_float16_copy_with_checksums_that_catch_a_damaged_file(tmp_path, tiny_encoder):
    from safetensors import safe_open
    from transformers import AutoModel

    from scripts.gpu_check import bundle

    sts = tmp_path / "senteval" / "STS" / "STSBenchmark" / "sts-dev.csv"
    sts.parent.mkdir(parents=True)
    sts.write_text("g\tf\t0\t0000\t4.0\tA cat sits.\tA cat is sitting.\n", encoding="utf-8")
    folder = tmp_path / "bundle"
    manifest = bundle.prepare(folder, tmp_path / "senteval", model=Path(tiny_encoder), wheels=False)
    model_dir = folder / bundle.MODEL_DIR
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        dtypes = {f.get_tensor(name).dtype for name in f.keys()}
    assert torch.float16 in dtypes and torch.float32 not in dtypes
    original = AutoModel.from_pretrained(tiny_encoder)
    rounded = AutoModel.from_pretrained(model_dir, dtype=torch.float32)  # as the quickstart loads it
    for (name, a), (_, b) in zip(original.state_dict().items(), rounded.state_dict().items()):
        assert b.dtype == a.dtype and torch.equal(b, a.half().to(a.dtype) if a.is_floating_point() else a), name
    assert manifest["model"]["largest_rounding_error"] <= manifest["model"]["largest_abs_weight"] * 2**-11
    assert {bundle.STS_FILE, bundle.CORPUS_FILE, f"{bundle.MODEL_DIR}/model.safetensors"} <= set(manifest["files"])
    written = json.loads((folder / bundle.MANIFEST).read_text())  # the commit, for a node without .git
    assert written["git_commit"] == (checkout_commit(REPO) or {}).get("git_commit")
    assert bundle.verify_checksums(folder)["ok"]
    with (model_dir / "model.safetensors").open("r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    verified = bundle.verify_checksums(folder)
    assert not verified["ok"] and verified["mismatched"] == [f"{bundle.MODEL_DIR}/model.safetensors"]


def test_user_path_check_needs_the_same_inputs_steps_and_a_score_within_tolerance():
    from scripts.gpu_check.user_path import REFERENCE_FILE, compare

    inputs = {"model_safetensors": "a", "train_file": "b", "stsb_dev_file": "c"}
    reference = {"spearman": 83.0, "steps": 63, "inputs": inputs}
    run = {"spearman": 82.2, "steps": 63, "inputs": inputs, "wall_s": 30.0, "device": "cuda"}
    assert compare(run, reference, 1.0, "rule")["passed"]
    assert not compare({**run, "spearman": 81.5}, reference, 1.0, "rule")["passed"]
    assert not compare({**run, "steps": 62}, reference, 1.0, "rule")["passed"]
    assert not compare({**run, "inputs": {**inputs, "model_safetensors": "other"}}, reference, 1.0, "rule")["passed"]
    assert not compare(run, reference, 1.0, "rule", ok=False)["passed"]  # e.g. `auto` chose the wrong precision
    committed = json.loads(REFERENCE_FILE.read_text())  # the CPU reference the device run is compared with
    assert committed["reference"]["seed"] == 42 and len(committed["runs"]) >= 3 and committed["tolerance"] > 0
    assert set(committed["inputs"]) == set(inputs) and committed["reference"]["steps"] > 0


def test_gpu_against_cpu_check_fails_when_the_cpu_run_differs(monkeypatch):
    from scripts.gpu_check import equivalence

    torch.manual_seed(0)
    start = {"online.w": torch.randn(4, 4), "queue.keys": torch.nn.functional.normalize(torch.randn(8, 4), dim=1)}
    final = {k: v + 0.1 for k, v in start.items()}
    device_run = {"losses": [2.0, 1.9], "initial": start, "final": final, "how": {"device": "cuda:0"}}
    cpu_run = {"losses": [2.0, 1.9], "final": dict(final), "how": {"device": "cpu"}}
    monkeypatch.setattr(equivalence, "recorded_run", lambda ctx, name, **kw: cpu_run)
    from scripts.gpu_check.context import RunContext, Sizes

    ctx = RunContext(device="cuda", tiny=True, model_path="unused", workdir=Path("unused"), deadline=0.0,
                     sizes=Sizes.tiny())
    record = equivalence.check_gpu_cpu(ctx, device_run)["gpu_against_cpu"]
    assert record["passed"] and record["detail"]["cpu_against_cpu"] is False
    cpu_run["final"] = {**final, "queue.keys": final["queue.keys"] * (1 + 10 * equivalence.GPU_CPU_QUEUE_RTOL)}
    record = equivalence.check_gpu_cpu(ctx, device_run)["gpu_against_cpu"]
    assert not record["passed"] and record["value"] > equivalence.GPU_CPU_QUEUE_RTOL
    cpu_run.update(final=dict(final), losses=[2.0, 1.9 * (1 + 10 * equivalence.GPU_CPU_LOSS_RTOL)])
    assert not equivalence.check_gpu_cpu(ctx, device_run)["gpu_against_cpu"]["passed"]


def test_user_path_step_time_leaves_the_evaluations_out_and_both_precisions_are_compared():
    from scripts.gpu_check.user_path import step_times, train_step_s

    state = {"global_step": 10, "log_history": [{"loss": 1.0, "step": 5}, {"eval_runtime": 2.0, "step": 5},
                                                {"eval_runtime": 1.0, "step": 10}, {"train_runtime": 8.0}]}
    assert train_step_s(state) == 0.5  # (8 - 2 - 1) / 10
    assert train_step_s({**state, "log_history": state["log_history"][:-1]}) is None
    times = step_times({"precision": "bf16", "train_step_s": 0.5}, {"precision": "fp32", "train_step_s": 1.5})
    assert times == {"bf16": 0.5, "fp32": 1.5, "fp32_over_bf16": 3.0}
    assert step_times({"precision": "bf16", "train_step_s": 0.5}, {"precision": "fp32", "not_measured": "x"}) == {
        "bf16": 0.5}

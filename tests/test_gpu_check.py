"""scripts/gpu_check/, the one-GPU acceptance run (issue 27), in its `--tiny` form on the CPU.

The whole run goes through scripts/gpu_check/device.sh, the command prepared for the GPU machine (no wheels to
install here); the other tests show that the checks fail when what they check is broken.
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
CHECKS = ("ema_fp32_lerp", "queue_cpu_replay", "export_embeddings", "fsdp2_world1", "torch_compile")
SECTIONS = ("setup", "ema_queue", "export", "reference", "fsdp2", "compile", "throughput")
VARIANTS = ("plain", "mocose_previous")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """`bash scripts/gpu_check/device.sh --tiny ...` with two throughput variants (the default has four) and a
    budget no loaded CI machine runs out of (the default, 110 s, skips what no longer fits)."""
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
    assert results["schema_version"] == 1 and results["all_checks_passed"] and results["complete"]
    meta = results["meta"]
    assert meta["tiny"] and meta["hardware"]["device"] == "cpu" and meta["model"]["layers"] == 2
    assert meta["versions"]["torch"] in (torch.__version__, torch.__version__.split("+")[0])
    assert 0 < meta["elapsed_s"] <= meta["time_budget_s"]
    assert [name for name in results["sections"]] == list(SECTIONS)
    assert all(s["status"] == "ok" and s["seconds"] >= 0 for s in results["sections"].values())
    assert sorted(results["checks"]) == sorted(CHECKS)
    for name, check in results["checks"].items():
        assert set(check) == {"passed", "value", "tolerance", "measure", "detail"}, name
        assert check["passed"] is True and 0 <= check["value"] <= check["tolerance"], (name, check)
    assert results["checks"]["fsdp2_world1"]["detail"]["run"]["fsdp"] is True
    assert results["checks"]["torch_compile"]["detail"]["graphs_captured"] > 0
    assert results["checks"]["ema_fp32_lerp"]["detail"]["target_linear_output_dtype"] == "torch.bfloat16"  # bf16 on
    assert results["checks"]["queue_cpu_replay"]["detail"]["initial_fill"] == 3  # build_trainer's overrides reach
    assert results["checks"]["export_embeddings"]["detail"]["modules"] == ["Transformer", "Pooling", "Dense"]
    rows = results["throughput"]
    assert {(r["variant"], r["precision"], r["batch_size"]) for r in rows} == {
        (v, p, b) for v in VARIANTS for p in ("fp32", "bf16") for b in (64, 256)}
    for row in rows:
        assert row["status"] == "ok" and row["sentences_per_second"] > 0 and row["peak_memory_mib"] is None, row
        assert row["compiled"] is False, row
        assert row["steps_timed"] == 3 and math.isclose(row["sentences_per_second"],
                                                         row["batch_size"] / row["ms_per_step"] * 1000, rel_tol=0.01)
    table = (report / "gpu_check.md").read_text()
    assert "## Throughput" in table and "## Checks" in table and "## Sections" in table
    for name in CHECKS:
        assert f"| {name} | yes |" in table
    assert table.count("| ok |") >= len(rows) + len(SECTIONS)
    log = (report / "gpu_check.log").read_text()
    assert f"torch {torch.__version__}" in log and "done in" in log  # the versions line, then run.py's end


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

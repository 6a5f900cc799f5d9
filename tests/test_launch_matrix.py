"""The launch matrix: every recipe under every shipped accelerate config, 2 CPU processes, through scripts/train.py.

    accelerate launch --config_file configs/accelerate/<engine>.yaml scripts/train.py training_args/<recipe>.yaml

Rows: the top-level recipes of training_args/, and every run of every ablation sweep in training_args/ablations/
(its flags built by `hf_mocose.commands.sweep`, as `scripts/sweep.py` launches them). Columns: default (one
process: the quickstart's launcher; top-level recipes), ddp, fsdp2, zero2, zero3 as shipped (an ablation sweep's runs under DDP and FSDP2, its first run under DeepSpeed: `recipe_rows`). Each cell either trains two optimizer steps (evaluated, checkpointed and exported at step 2, on
the engine it names: the checkpoint's layout tells DDP, FSDP2 and DeepSpeed apart) or is refused before any work
with one `train.py: error:` line (rank 0's) naming the setting and what to use instead. No process may print a
traceback (the launcher itself then reports the failed processes in its own words).

Only what needs no Hub and no wiki1m is overridden (`COMMON`): a tiny random BERT for the model, Python's own docs
for the corpus, 2 steps, a 5-pair STS file for evaluation; every method setting stays the recipe's.
FSDP2 and DeepSpeed run on CPU through the worker's test-only shims (tests/fsdp_worker.py); DeepSpeed rows need
the `deepspeed` package and are skipped, saying so, without it.

`python -m pytest -q` runs a fast subset (`FAST`); `python -m pytest -q -m launch_matrix` runs every cell.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO_ROOT, launch_train_script, rank_logs

from hf_mocose.commands.sweep import SweepRun, load_sweep

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.launch_matrix]
RECIPES = REPO_ROOT / "training_args"
ENGINES = ("ddp", "fsdp2", "zero2", "zero3")
ONE_PROCESS = "default"  # configs/accelerate/default.yaml: the quickstart's launcher, one process
STS_ROWS = [("5.0", "A man is playing a guitar.", "A man plays the guitar."),
            ("0.5", "A woman is slicing an onion.", "A dog runs in a field."),
            ("3.2", "Kids play in the park.", "Children are playing outside."),
            ("1.0", "The stock market fell.", "A cat sleeps on the sofa."),
            ("4.2", "A plane is taking off.", "An airplane departs.")]
# What each shipped config does with each method as the recipes are written (no bf16: true): a refusal (regex of
# its one line), or nothing (it trains).
REFUSED = {
    **{(method, "zero2"): rf"method='{method}' does not support DeepSpeed \(ZeRO stage 2\) with mixed_precision bf16: "
                          r"DeepSpeed casts the whole model to bf16, the EMA target included.* Use FSDP2 .* or DDP"
       for method in ("mocose", "esimcse")},  # methods with an EMA target
    **{(method, "zero3"): rf"method='{method}' does not support DeepSpeed ZeRO stage 3 .* shard with FSDP2 instead"
       for method in ("mocose", "esimcse")},
    **{(method, "zero2"): r"DeepSpeed with mixed_precision bf16 .* needs bf16: true .* add --bf16 true"
       for method in ("simcse", "ifcl")},
    **{(method, "zero3"): r"hf-mocose does not support DeepSpeed ZeRO stage 3: .* Shard with FSDP2 instead"
       for method in ("simcse", "ifcl")},
}
# Rows whose settings do not fit 2 processes: the sweep is sized for a global batch of 64 (its comment says so), and
# the recipe's per-device batch of 64 on 2 processes makes 128, for which target_mtd's window outgrows the queue.
ROW_REFUSED = {f"ablations/mtd-targets-extra/{run}": r"target_mtd=\d+(\.\d+)? needs \d+ queue entries at eta=0.75 "
               r"with global batch 128, but queue_size is 1024\. Raise queue_size" for run in ("d-14.67", "d-18")}
# The default run: the paper recipes under FSDP2, and one recipe under each other engine.
FAST = {("quickstart", ONE_PROCESS), ("mocose-bert-base", "fsdp2"), ("mocose-bert-large", "fsdp2"), ("mocose-una-bert-base", "fsdp2"),
        ("mocose-bert-base", "ddp"), ("mocose-bert-base", "zero2"), ("mocose-bert-base", "zero3"),
        ("esimcse-bert-base", "ddp"), ("esimcse-bert-base", "fsdp2")}
NO_DEEPSPEED = ("DeepSpeed is not installed: `accelerate launch` needs it for configs/accelerate/zero*.yaml "
                "(pip install deepspeed; on CPU tests/fsdp_worker.py's shim runs it over gloo)")


def recipe_rows() -> list[tuple[str, str, dict, tuple[str, ...]]]:
    """`(row name, base recipe, overrides, engines)`: each top-level recipe under every engine, then each run of
    each ablation sweep under DDP and FSDP2, where its settings reach the sharded model. Under DeepSpeed the
    outcome is decided before the model is built, by the method and the launch alone (every run's flags are
    parsed by tests/test_sweep.py), so the first run of each sweep stands for its sweep there."""
    rows = [(path.stem, f"training_args/{path.name}", {}, (ONE_PROCESS, *ENGINES))
            for path in sorted(RECIPES.glob("*.yaml"))]
    for sweep in sorted((RECIPES / "ablations").glob("*.yaml")):
        _, base, runs = load_sweep(sweep, "unused")
        rows += [(f"ablations/{sweep.stem}/{run.name}", base, run.overrides,
                  ENGINES if index == 0 else ("ddp", "fsdp2")) for index, run in enumerate(runs)]
    return rows


def _cells():
    for name, base, overrides, engines in recipe_rows():
        for engine in engines:
            marks = [] if (name, engine) in FAST else [pytest.mark.launch_matrix_full]
            yield pytest.param(name, base, overrides, engine, id=f"{name}-{engine}", marks=marks)


@pytest.fixture(scope="module")
def sts_dev(tmp_path_factory):
    path = tmp_path_factory.mktemp("sts") / "sts-dev.csv"
    path.write_text("".join(f"g\tf\t2012\t{i}\t{s}\t{a}\t{b}\n" for i, (s, a, b) in enumerate(STS_ROWS)))
    return path


def common_overrides(tiny_encoder: str, sts_dev: Path) -> list[str]:
    """No Hub, no wiki1m, two steps, evaluated and saved at step 2; nothing of the method."""
    return ["--model_name_or_path", tiny_encoder, "--train_file", "builtin:python_docs", "--max_steps", "2",
            "--stsb_dev_file", str(sts_dev), "--eval_steps", "2", "--save_steps", "2", "--logging_steps", "1",
            "--dataloader_num_workers", "0", "--disable_tqdm", "true", "--use_cpu", "true"]


def launch(tmp_path, base, overrides, engine, extra=(), accelerate_args=()):
    """Launches one cell; returns (process, per-rank stderr, output_dir)."""
    out = tmp_path / "run"
    argv = SweepRun("cell", dict(overrides), out).command(str(REPO_ROOT / base), "", list(extra))[1:]
    if engine.startswith("zero"):
        pytest.importorskip("deepspeed", reason=NO_DEEPSPEED)
    proc = launch_train_script(engine, argv, tmp_path / "logs", accelerate_args)
    # One process: accelerate runs the script itself, without per-rank log files.
    return proc, (rank_logs(tmp_path / "logs") if engine != ONE_PROCESS else {0: proc.stderr}), out


def assert_no_traceback(logs: dict[int, str], proc, engine: str = "ddp") -> None:
    ranks = [0] if engine == ONE_PROCESS else [0, 1]
    assert sorted(logs) == ranks, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    for rank, text in logs.items():
        assert "Traceback" not in text, f"rank {rank}:\n{text[-6000:]}"


ENGINE_LAYOUT = {  # what checkpoint-2 holds under each engine (SHARDED_STATE_DICT in fsdp2.yaml)
    ONE_PROCESS: ("optimizer.pt", "model.safetensors"),
    "ddp": ("optimizer.pt", "model.safetensors"),
    "fsdp2": ("pytorch_model_fsdp_0", "optimizer_0"),
    "zero2": ("global_step2",),
}


def assert_trained(out: Path, engine: str) -> None:
    """Two optimizer steps on 2 processes (one under default.yaml), on `engine`, evaluated, saved and exported."""
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and any("eval_stsb_spearman" in h for h in state["log_history"])
    checkpoint = {p.name for p in (out / "checkpoint-2").iterdir()}
    rng_states = {"rng_state.pth"} if engine == ONE_PROCESS else {"rng_state_0.pth", "rng_state_1.pth"}
    assert rng_states <= checkpoint  # one per process
    assert set(ENGINE_LAYOUT[engine]) <= checkpoint, sorted(checkpoint)
    others = {name for other, names in ENGINE_LAYOUT.items() if other != engine for name in names} - set(
        ENGINE_LAYOUT[engine])
    assert not others & checkpoint - {"model.safetensors"}, sorted(checkpoint)
    assert (out / "final" / "config.json").is_file() and (out / "sentence-transformers" / "modules.json").is_file()


@pytest.mark.parametrize("name, base, overrides, engine", _cells())
def test_every_recipe_trains_or_is_refused_in_one_line(name, base, overrides, engine, tiny_encoder, sts_dev, tmp_path):
    method = yaml.safe_load((REPO_ROOT / base).read_text())["method"]
    proc, logs, out = launch(tmp_path, base, overrides, engine, common_overrides(tiny_encoder, sts_dev))
    assert_no_traceback(logs, proc, engine)
    refusal = REFUSED.get((overrides.get("method", method), engine)) or ROW_REFUSED.get(name)
    if refusal is None:
        assert proc.returncode == 0, f"rank 0:\n{logs[0][-6000:]}"
        assert_trained(out, engine)
        return
    assert proc.returncode != 0
    for rank, text in logs.items():  # printed once, by rank 0 (the others are stopped by the launcher)
        errors = [line for line in text.splitlines() if line.startswith("train.py: error:")]
        assert len(errors) == (rank == 0), f"rank {rank}:\n{text[-3000:]}"
        assert not errors or re.search(refusal, errors[0]), errors[0]
    assert not out.exists()  # refused before any work: not even the output folder


def _target_layer(path: Path, prefix: str):
    from safetensors.torch import load_file

    weights = load_file(path)
    return next(tensor for name, tensor in weights.items()
                if name.startswith(prefix) and name.endswith("encoder.layer.0.attention.self.query.weight"))


@pytest.mark.launch_matrix_full
@pytest.mark.parametrize("recipe, engine, accelerate_args, extra", [
    ("quickstart", "zero2", ["--mixed_precision", "no"], []),  # MoCoSE under DeepSpeed: fp32, as the refusal says
    ("quickstart", "ddp", ["--mixed_precision", "bf16"], []),  # MoCoSE with bf16: DDP (autocast)
    ("simcse-bert-base", "zero2", [], ["--bf16", "true"]),  # SimCSE and IFCL under zero2.yaml with the bf16 it asks for
    ("ifcl-bert-base", "zero2", [], ["--bf16", "true"]),  # (mean pooling: a bf16 export within bf16 rounding)
    # torch.compile with FGSM is refused under FSDP2: it trains under DDP, and FSDP2 compiles without FGSM
    # (aot_eager: dynamo and AOTAutograd without inductor's minutes of code generation on a CPU).
    ("quickstart", "ddp", [], ["--torch_compile", "true", "--torch_compile_backend", "aot_eager"]),
    ("quickstart", "ddp", ["--dynamo_backend", "aot_eager"], []),  # compiled by accelerate, torch_compile false
    ("quickstart", "fsdp2", [], ["--torch_compile", "true", "--torch_compile_backend", "aot_eager",
                                 "--fgsm_mode", "off"]),
], ids=["mocose-zero2-fp32", "mocose-ddp-bf16", "simcse-zero2-bf16", "ifcl-zero2-bf16", "mocose-ddp-compile-fgsm",
        "mocose-ddp-dynamo-backend-fgsm", "mocose-fsdp2-compile-no-fgsm"])
def test_what_the_refusals_point_to_trains(recipe, engine, accelerate_args, extra, tiny_encoder, sts_dev, tmp_path):
    """The alternatives the DeepSpeed refusals name train, and MoCoSE's target stays fp32 and moves."""
    argv_extra = [*common_overrides(tiny_encoder, sts_dev), *extra]
    proc, logs, out = launch(tmp_path, f"training_args/{recipe}.yaml", {}, engine, argv_extra, accelerate_args)
    assert_no_traceback(logs, proc)
    assert proc.returncode == 0, f"rank 0:\n{logs[0][-6000:]}"
    assert_trained(out, engine)
    if recipe == "quickstart":
        target = _target_layer(out / "final" / "model.safetensors", "target_encoder.")
        start = _target_layer(Path(tiny_encoder) / "model.safetensors", "")
        assert target.dtype == start.dtype == torch.float32
        assert not target.equal(start)  # the EMA moved it


# DDP's cell runs with the full matrix: tests/test_distributed.py already trains Matryoshka under DDP by default.
@pytest.mark.parametrize("engine", [pytest.param("ddp", marks=pytest.mark.launch_matrix_full), "fsdp2"])
def test_matryoshka_trains_under_ddp_and_fsdp2(engine, tiny_encoder, sts_dev, tmp_path):
    """The Matryoshka cell: `--matryoshka_dims 32 16 8` on the quickstart recipe trains on 2 processes under each
    engine, logs STS-B dev at every width, and exports a model whose card has a row per width."""
    extra = [*common_overrides(tiny_encoder, sts_dev), "--matryoshka_dims", "32", "16", "8"]
    proc, logs, out = launch(tmp_path, "training_args/quickstart.yaml", {}, engine, extra)
    assert_no_traceback(logs, proc)
    assert proc.returncode == 0, f"rank 0:\n{logs[0][-6000:]}"
    assert_trained(out, engine)
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert any({"eval_stsb_spearman_dim16", "eval_stsb_spearman_dim8"} <= set(entry) for entry in history)
    card = (out / "sentence-transformers" / "README.md").read_text()
    assert "trained with Matryoshka dimensions 32, 16, 8" in card
    assert all(re.search(rf"\n\| {dim} \| -?\d+\.\d\d \|\n", card) for dim in (32, 16, 8))

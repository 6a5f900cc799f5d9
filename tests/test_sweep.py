"""scripts/sweep.py: a grid becomes training runs, and their STS results one table (tiny-model smoke run)."""

import sys
from pathlib import Path

import pytest
import yaml
from conftest import SENTEVAL_DIR

from hf_mocose.commands.sweep import load_sweep, run_sweep

REPO = Path(__file__).resolve().parents[1]


def test_every_shipped_sweep_parses_and_its_runs_validate(tmp_path):
    from hf_mocose.commands.train import parse_args

    for path in sorted((REPO / "training_args" / "ablations").glob("*.yaml")):
        name, base, runs = load_sweep(path, tmp_path)
        assert runs, path
        for run in runs:
            flags = run.command(base, "accelerate launch", [])[3:]  # drop the launcher and script
            script, args = parse_args([str(REPO / flags[0]), *flags[1:]])  # raises on any invalid setting
            assert args.output_dir == str(run.output_dir)


def test_grid_is_a_cartesian_product(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": "b.yaml", "grid": {"queue_size": [16, 32], "projection_layers": [0, 1]},
                                     "overrides": {"seed": 3}}, sort_keys=False))
    _, _, runs = load_sweep(sweep, tmp_path)
    assert [r.overrides for r in runs] == [
        {"seed": 3, "queue_size": q, "projection_layers": p} for q in (16, 32) for p in (0, 1)
    ]
    assert runs[0].name == "queue_size=16-projection_layers=0"


@pytest.mark.parametrize("spec,match", [({"runs": []}, "base"), ({"base": "b", "runs": [], "grid": {}}, "exactly one"),
                                        ({"base": "b", "runs": [], "colour": 1}, "colour")])
def test_bad_sweep_files(tmp_path, spec, match):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match=match):
        load_sweep(sweep, tmp_path)


def test_smoke_sweep_runs_and_tabulates(tiny_encoder, tmp_path):
    recipe = tmp_path / "base.yaml"
    recipe.write_text(yaml.safe_dump({
        "model_name_or_path": tiny_encoder, "train_file": "builtin:python_docs", "max_train_samples": 32,
        "per_device_train_batch_size": 8, "max_steps": 2, "queue_size": 16, "queue_init_size": 16, "use_cpu": True,
        "eval_strategy": "no", "save_strategy": "no", "disable_tqdm": True, "report_to": "none",
        "export_sentence_transformers": False,
    }))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(recipe), "name": "smoke",
                                     "runs": [{"name": "all"}, {"name": "young", "queue_slice": "0:8"}]}))
    senteval = str(SENTEVAL_DIR) if SENTEVAL_DIR.is_dir() else None
    table = run_sweep(str(sweep), str(tmp_path / "runs"), launcher=sys.executable, senteval_dir=senteval,
                      tasks=["stsb_dev"] if senteval else None)
    assert "| all |" in table and "| young | queue_slice=0:8 |" in table
    assert (tmp_path / "runs" / "smoke" / "young" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "runs" / "smoke" / "results.md").read_text().count("\n| ") == 3
    if senteval:
        assert "stsb_dev" in table.splitlines()[0]


def _parsed_runs(path, tmp_path):
    from hf_mocose.commands.train import parse_args

    _, base, runs = load_sweep(path, tmp_path)
    return {run.name: parse_args([str(REPO / base), *run.command(base, "x", [])[3:]])[1] for run in runs}


def test_paper_recipes_keep_the_papers_heads_and_fgsm_whatever_the_defaults(tmp_path):
    """The library defaults are identity heads at 1e-3 (docs/quality.md); every paper recipe, and so every
    ablation grid built on one, still trains the paper's random heads at one learning rate with FGSM 5e-9."""
    from hf_mocose.commands.train import parse_args
    from hf_mocose.trainer.training_args import MoCoSETrainingArguments

    default = MoCoSETrainingArguments(output_dir=str(tmp_path / "d"))
    assert (default.head_init, default.head_learning_rate) == ("identity", 1e-3)
    recipes = REPO / "training_args"
    for recipe in ("mocose-bert-base.yaml", "mocose-bert-large.yaml", "mocose-una-bert-base.yaml",
                   "simcse-bert-base.yaml", "ifcl-bert-base.yaml"):
        _, args = parse_args([str(recipes / recipe)])
        assert (args.head_init, args.head_learning_rate) == ("random", None), recipe
        assert (args.fgsm_epsilon, args.fgsm_epsilon_unit) == (5e-9, "absolute"), recipe
    for grid in ("table4-heads.yaml", "table8-queue-slices.yaml"):
        for args in _parsed_runs(recipes / "ablations" / grid, tmp_path).values():
            assert (args.head_init, args.head_learning_rate) == ("random", None), grid

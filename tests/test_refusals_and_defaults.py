"""Edges of a first run answered with one clear line or made to work: empty data, queue defaults, the export's
place, a missing resume folder, light imports, a launch of one process of several, quiet library notices."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_training_args


# ----------------------------------------------------------------------------- empty data, through Python
@pytest.mark.parametrize("texts, message", [
    ([], "train_dataset has no rows"),
    (["", "   ", "\n"], r"train_dataset has no non-empty sentences \(3 rows, all empty or blank\)"),
])
def test_python_door_refuses_empty_data_before_any_work(tiny_encoder, tmp_path, texts, message, monkeypatch):
    from datasets import Dataset

    from hf_mocose import MoCoSETrainer
    from hf_mocose.trainer import inputs

    loaded = []
    monkeypatch.setattr(inputs, "build_mocose_model", lambda *a, **k: loaded.append(a) or pytest.fail("model loaded"))
    output_dir = tmp_path / "run"
    with pytest.raises(ValueError, match=message):
        MoCoSETrainer(model=tiny_encoder, args=tiny_training_args(output_dir),
                      train_dataset=Dataset.from_dict({"text": texts}))
    assert not loaded and not output_dir.exists()


def test_python_door_drops_blank_sentences_as_the_command_line_does(tiny_encoder, tmp_path):
    from datasets import Dataset

    from hf_mocose import MoCoSETrainer

    trainer = MoCoSETrainer(model=tiny_encoder, args=tiny_training_args(tmp_path),
                            train_dataset=Dataset.from_dict({"text": ["A man plays a guitar.", " ", "Someone sings."]}))
    assert len(trainer.train_dataset) == 2


# ----------------------------------------------------------------------------- derived defaults
def test_queue_init_size_default_fits_any_queue(tmp_path, tiny_encoder):
    from hf_mocose import MoCoSEConfig, MoCoSEModel
    from hf_mocose.models.settings import METHOD_DEFAULTS
    from hf_mocose.trainer.training_args import MoCoSETrainingArguments

    assert METHOD_DEFAULTS["queue_init_size"] is None
    small = MoCoSETrainingArguments(output_dir=str(tmp_path), use_cpu=True, queue_size=64)
    assert small.queue_init_size == 64  # min(128, K): never more than the queue holds
    assert MoCoSETrainingArguments(output_dir=str(tmp_path), use_cpu=True).queue_init_size == 128  # the paper's, K=512
    assert MoCoSETrainingArguments(output_dir=str(tmp_path), use_cpu=True, queue_size=64,
                                   queue_init_size=16).queue_init_size == 16  # a given value is kept
    assert MoCoSEConfig(queue_size=32).queue_init_size == 32
    model = MoCoSEModel.from_pretrained(tiny_encoder, **small.model_config_kwargs())
    assert model.config.queue_init_size == 64 and int(model.queue.queue_fill) == 64
    with pytest.raises(ValueError, match="queue_init_size"):  # an explicit impossible value is still refused
        MoCoSETrainingArguments(output_dir=str(tmp_path), use_cpu=True, queue_size=64, queue_init_size=65)


def test_st_loss_queue_init_size_default_fits_any_queue(tiny_encoder):
    from conftest import tiny_sentence_transformer

    from hf_mocose import MoCoSELoss

    loss = MoCoSELoss(tiny_sentence_transformer(tiny_encoder), queue_size=64)
    assert loss.settings["queue_init_size"] == 64 and int(loss.queue.queue_fill) == 64
    assert MoCoSELoss(tiny_sentence_transformer(tiny_encoder)).settings["queue_init_size"] == 128


def test_paper_recipes_set_queue_init_size_themselves():
    """The derived default must not change a paper recipe: each one that has a queue sets K_s."""
    import yaml

    recipes = Path(__file__).resolve().parents[1] / "training_args"
    for recipe in recipes.glob("*.yaml"):
        values = yaml.safe_load(recipe.read_text())
        if values.get("method", "mocose") != "simcse" and "queue_size" in values:
            assert "queue_init_size" in values, recipe.name


# ----------------------------------------------------------------------------- SentenceTransformer and the export
def test_trainer_exports_and_sentence_transformers_loads_the_checkpoint(tiny_encoder, tmp_path):
    import torch
    from conftest import make_trainer
    from sentence_transformers import SentenceTransformer

    import hf_mocose

    assert "export_to_sentence_transformers" in hf_mocose.__all__
    from hf_mocose import export_to_sentence_transformers
    from hf_mocose.publishing.export import export_to_sentence_transformers as defined

    assert export_to_sentence_transformers is defined
    trainer = make_trainer(tiny_encoder, tmp_path / "run", max_steps=2)
    trainer.train()
    export = trainer.export_sentence_transformers()
    assert export == tmp_path / "run" / "sentence-transformers" and (export / "README.md").is_file()
    sentences = ["A man is playing a guitar.", "Momentum contrast keeps a queue of negative keys."]
    exported = SentenceTransformer(str(export)).encode(sentences, convert_to_tensor=True)
    checkpoint = SentenceTransformer(str(tmp_path / "run" / "final"))  # the MoCoSE checkpoint: its online branch
    model = trainer.model.eval()
    tokens = trainer.processing_class(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model.embed(**tokens)
    torch.testing.assert_close(checkpoint.encode(sentences, convert_to_tensor=True), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(exported, expected, atol=1e-5, rtol=0)


def test_export_inside_the_checkpoint_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    from conftest import run_cli

    from hf_mocose.publishing import export

    monkeypatch.setattr(export, "load_mocose_checkpoint", lambda *a: pytest.fail("checkpoint loaded"))
    final = tmp_path / "final"
    final.mkdir()
    code, _, err = run_cli(["export", str(final), str(final / "st")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"Output folder '{final / 'st'}' is inside the checkpoint '{final}'" in err
    assert not (final / "st").exists()


# ----------------------------------------------------------------------------- small ones
def test_missing_resume_folder_is_named_before_the_model_is_loaded(tmp_path, capsys, monkeypatch):
    from hf_mocose.commands import train

    monkeypatch.setattr(train, "build_mocose_model", lambda *a, **k: pytest.fail("model loaded"))
    output_dir = tmp_path / "run"
    argv = ["--model_name_or_path", "builtin:all-MiniLM-L6-v2", "--train_file", "builtin:python_docs",
            "--output_dir", str(output_dir), "--use_cpu", "true", "--resume_from_checkpoint",
            str(output_dir / "checkpoint-9")]
    assert train.cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"train.py: error: resume_from_checkpoint '{output_dir / 'checkpoint-9'}' is not a folder. "
                   "(HF_MOCOSE_DEBUG=1 shows the traceback)"]
    assert not output_dir.exists()


def test_mtd_and_import_hf_mocose_need_neither_torch_nor_transformers():
    import subprocess
    import sys

    code = ("import sys, hf_mocose; from hf_mocose.commands import cli; "
            "assert cli.main(['mtd', '--batch_size', '64', '--target', '14.67']) == 0; "
            "print(sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


# ----------------------------------------------------------------------------- accelerate launch
@pytest.mark.parametrize("env, refused", [
    ({"ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_DYNAMO_BACKEND": "NO", "MASTER_ADDR": "127.0.0.1"}, True),
    ({"ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_DYNAMO_BACKEND": "NO"}, False),  # one process asked for
    ({"ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_DYNAMO_BACKEND": "NO", "MASTER_ADDR": "127.0.0.1",
      "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, False),  # --multi_gpu: two processes
    ({"MASTER_ADDR": "10.0.0.1"}, False),  # not started by accelerate launch
])
def test_one_process_of_several_is_detected(env, refused):
    from hf_mocose.launch.sharding import refuse_one_process_of_several

    if refused:
        with pytest.raises(ValueError, match="accelerate launch started ONE process although more were asked for"):
            refuse_one_process_of_several(env)
    else:
        refuse_one_process_of_several(env)


def test_accelerate_cpu_two_processes_is_one_line(tmp_path):
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_MOCOSE_DEBUG", None)
    command = [sys.executable, "-m", "accelerate.commands.launch", "--quiet", "--cpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(repo / "scripts/train.py"),
               "--model_name_or_path", "builtin:all-MiniLM-L6-v2", "--train_file", "builtin:python_docs",
               "--output_dir", str(tmp_path / "run")]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=repo)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: accelerate launch started ONE process"), lines
    assert not (tmp_path / "run").exists()


def test_a_cpu_run_prints_no_library_notices(minilm, tmp_path, capfd):
    """No pin_memory warning without an accelerator (`use_cpu` left False, as on a CPU-only machine), no PAD/BOS/EOS
    announcement for the config MoCoSE builds around all-MiniLM-L6-v2."""
    import warnings

    from datasets import Dataset

    from hf_mocose import MoCoSETrainer
    from hf_mocose.data.corpus import python_docs_sentences

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = MoCoSETrainer(model=minilm, args=tiny_training_args(tmp_path, max_steps=1, use_cpu=False),
                                train_dataset=Dataset.from_dict({"text": python_docs_sentences()[:16]}))
        trainer.train()
    output = capfd.readouterr()
    text = output.out + output.err + "\n".join(str(w.message) for w in caught)
    assert "pin_memory" not in text and "PAD/BOS/EOS" not in text
    assert trainer.args.dataloader_pin_memory is (trainer.args.device.type != "cpu")
    assert trainer.model.config.pad_token_id == trainer.processing_class.pad_token_id  # aligned all the same


@pytest.mark.parametrize("preset, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_cli_lets_openmp_threads_wait_passively_unless_told_otherwise(monkeypatch, capsys, preset, expected):
    """Set before a sub-command imports torch (whose OpenMP reads it when it loads); docs/evaluation.md has the
    measurement behind it (spinning threads on a shared machine)."""
    import os

    from hf_mocose.commands import cli

    if preset is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", preset)
    assert cli.main(["mtd", "--batch_size", "64", "--target", "14.67"]) == 0
    assert os.environ["OMP_WAIT_POLICY"] == expected

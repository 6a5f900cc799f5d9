"""The training command: a recipe with one value changed, more processes, a resume at another batch size, the
card, --help."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from hf_mocose.commands.train import cli_main, main, parse_args
from hf_mocose.compat import TRAINER_KEEPS_CHECKPOINT_BATCH_SIZE

QUICKSTART = str(REPO_ROOT / "training_args" / "quickstart.yaml")
STS_ROWS = [("5.0", "A man is playing a guitar.", "A man plays the guitar."),
            ("0.5", "A woman is slicing an onion.", "A dog runs in a field."),
            ("3.2", "Kids play in the park.", "Children are playing outside."),
            ("1.0", "The stock market fell.", "A cat sleeps on the sofa.")]


@pytest.fixture
def sts_dev(tmp_path):
    path = tmp_path / "senteval" / "sts-dev.csv"
    path.parent.mkdir()
    path.write_text("".join(f"g\tf\t2012\t{i}\t{s}\t{a}\t{b}\n" for i, (s, a, b) in enumerate(STS_ROWS)))
    return path


# ----------------------------------------------------------------------------- 1: what follows a changed value
def test_a_changed_value_moves_the_recipe_values_that_follow_it(tmp_path, capsys):
    _, args = parse_args([QUICKSTART, "--max_steps", "3", "--save_steps", "3", "--queue_size", "32", "--bf16", "false",
                          "--output_dir", str(tmp_path)])
    assert (args.save_steps, args.eval_steps, args.queue_size, args.queue_init_size) == (3, 3, 32, 32)
    assert args.load_best_model_at_end
    assert capsys.readouterr().out.splitlines() == [
        "queue_init_size 64 -> 32: K_s, queue_init_size 64 (recipe), is more than queue_size 32 (--queue_size); "
        "--queue_init_size decides instead.",
        "eval_steps 25 -> 3: load_best_model_at_end true (recipe) needs save_steps 3 (--save_steps) to be a multiple "
        "of eval_steps 25 (recipe); --eval_steps decides instead."]
    # the save cadence follows a given evaluation cadence; evaluation turned off takes the best model with it
    assert parse_args([QUICKSTART, "--eval_steps", "10", "--bf16", "false"])[1].save_steps == 30
    assert "save_steps 25 -> 30: " in capsys.readouterr().out
    assert not parse_args([QUICKSTART, "--eval_strategy", "no", "--bf16", "false"])[1].load_best_model_at_end
    assert "load_best_model_at_end true -> false: " in capsys.readouterr().out


@pytest.mark.parametrize("flags, line", [
    (["--queue_size", "32", "--queue_init_size", "40"],
     "K_s, queue_init_size 40 (--queue_init_size), is more than queue_size 32 (--queue_size): change "
     "--queue_init_size or --queue_size."),
    (["--queue_init_size", "400"],
     "K_s, queue_init_size 400 (--queue_init_size), is more than queue_size 256 (recipe): change --queue_init_size or "
     "--queue_size."),
    (["--save_steps", "3", "--eval_steps", "2"],
     "load_best_model_at_end true (recipe) needs save_steps 3 (--save_steps) to be a multiple of eval_steps 2 "
     "(--eval_steps): change --eval_steps or --save_steps or --load_best_model_at_end."),
])
def test_values_given_together_that_conflict_are_refused_naming_the_keys(flags, line, tmp_path, capsys):
    assert cli_main([QUICKSTART, *flags, "--output_dir", str(tmp_path / "run")]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"train.py: error: {line} (HF_MOCOSE_DEBUG=1 shows the traceback)"]
    assert captured.out == "" and not (tmp_path / "run").exists()


def test_the_quickstart_with_three_changed_values_trains(tiny_encoder, sts_dev, tmp_path, capsys):
    out = tmp_path / "run"
    main([QUICKSTART, "--max_steps", "3", "--save_steps", "3", "--queue_size", "32", "--model_name_or_path",
          tiny_encoder, "--max_train_samples", "48", "--per_device_train_batch_size", "8", "--stsb_dev_file",
          str(sts_dev), "--bf16", "false", "--output_dir", str(out), "--export_sentence_transformers", "false",
          "--disable_tqdm", "true"])
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and state["best_model_checkpoint"].endswith("checkpoint-3")
    assert [entry["step"] for entry in state["log_history"] if "eval_stsb_spearman" in entry][0] == 3
    assert "queue_init_size 64 -> 32" in capsys.readouterr().out


# ----------------------------------------------------------------------------- 2: a refusal under DDP, once
def test_a_refusal_under_ddp_is_the_first_line_and_the_root_cause(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("HF_MOCOSE_DEBUG", None)
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(REPO_ROOT / "configs/accelerate/ddp.yaml"), "--num_processes", "3", str(REPO_ROOT / "scripts/train.py"),
               QUICKSTART, "--use_cpu", "true", "--queue_size", "8", "--queue_init_size", "64",
               "--output_dir", str(tmp_path / "run")]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode != 0 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    refusal = [line for line in lines if line.startswith("train.py: error:")]
    assert len(refusal) == 1 and lines[0] == refusal[0], result.stderr
    assert "queue_init_size 64 (--queue_init_size), is more than queue_size 8" in refusal[0]
    # torch's ChildFailedError report follows; its root cause, the last thing it says, is the same line
    root_cause = result.stderr[result.stderr.index("Root Cause"):].splitlines()
    assert root_cause[-2] == f"  traceback : {refusal[0]}" and root_cause[-1].startswith("=====")
    assert result.stderr.count("Traceback (most recent call last)") == 1  # the launcher's own, no process's
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- 7: a short --help
def test_help_shows_the_mocose_and_common_trainer_options_and_points_to_the_rest(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--help"])
    short = capsys.readouterr().out
    assert exit_.value.code == 0
    with pytest.raises(SystemExit):
        parse_args(["--help_all"])
    full = capsys.readouterr().out
    options = [line.split()[0] for line in short.splitlines() if line.startswith("  -")]
    assert {"--train_file", "--queue_size", "--ema_decay_start", "--output_dir", "--max_steps", "--learning_rate",
            "--resume_from_checkpoint"} <= set(options)
    assert "--adam_beta1" not in options and "--adam_beta1" in full and "--no_target_dropout" in full
    assert len(options) < 100 and len(short.splitlines()) * 2 < len(full.splitlines())
    assert "--help_all lists all" in short.replace("\n", " ")
    assert short.index("MoCoSE: model and data") < short.index("Common Trainer options")


def test_help_shows_the_recipe_defaults(capsys):
    with pytest.raises(SystemExit):
        parse_args([QUICKSTART, "--help"])
    assert "(default: 256)" in capsys.readouterr().out  # the quickstart's queue_size


# ----------------------------------------------------------------------------- 5 and 6: a resume, and the card
def train_argv(encoder, corpus, out, batch, steps, *extra):
    return ["--model_name_or_path", encoder, "--train_file", str(corpus), "--per_device_train_batch_size", str(batch),
            "--max_steps", str(steps), "--queue_size", "16", "--queue_init_size", "4", "--max_seq_length", "16",
            "--output_dir", str(out), "--use_cpu", "true", "--save_steps", "2", "--disable_tqdm", "true", *extra]


def test_a_resume_at_another_batch_size_is_named_and_the_card_and_state_agree(tiny_encoder, tmp_path, caplog):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"Sentence number {i} is about a small thing.\n" for i in range(64)))
    out = tmp_path / "run"
    main(train_argv(tiny_encoder, corpus, out, 8, 4, "--eval_strategy", "no", "--export_sentence_transformers", "false"))
    shutil.rmtree(out / "checkpoint-4")  # as if stopped after step 2
    caplog.clear()
    main(train_argv(tiny_encoder, corpus, out, 4, 4, "--eval_strategy", "no", "--resume_from_checkpoint", "last"))
    # transformers < 5 resumes at the checkpoint's size whatever is asked: then the run says so and records that.
    trained, named = (8, "at per_device_train_batch_size 8, its own, not 4: transformers < 5") if \
        TRAINER_KEEPS_CHECKPOINT_BATCH_SIZE else (4, "trained at per_device_train_batch_size 8, with "
                                                     "per_device_train_batch_size 4: not an exact resume")
    said = [record.getMessage() for record in caplog.records if "per_device_train_batch_size 8" in record.getMessage()]
    assert len(said) == 1 and len(said[0].splitlines()) == 1 and named in said[0]
    for state in (out / "trainer_state.json", out / "checkpoint-4" / "trainer_state.json"):
        assert json.loads(state.read_text())["train_batch_size"] == trained, state
    card = (out / "sentence-transformers" / "README.md").read_text()
    assert f"| batch size per device | {trained} |" in card and f"B = {trained} sentences per optimizer step" in card


def test_no_card_holds_a_local_path(tiny_encoder, sts_dev, tmp_path):
    corpus = tmp_path / "data" / "my_corpus.txt"
    corpus.parent.mkdir()
    corpus.write_text("".join(f"Sentence number {i} is about a small thing.\n" for i in range(32)))
    out = tmp_path / "run"
    main(train_argv(tiny_encoder, corpus, out, 8, 2, "--stsb_dev_file", str(sts_dev), "--eval_steps", "2"))
    card = (out / "sentence-transformers" / "README.md").read_text()
    assert "- **Training Dataset:** my_corpus.txt" in card and "- `stsb_dev_file`: sts-dev.csv" in card
    for local in (tmp_path, out, tmp_path.parent):
        assert str(local) not in card
    named = tmp_path / "named"
    main(train_argv(tiny_encoder, corpus, named, 8, 2, "--eval_strategy", "no", "--corpus_name", "Python docs"))
    assert "- **Training Dataset:** Python docs" in (named / "sentence-transformers" / "README.md").read_text()

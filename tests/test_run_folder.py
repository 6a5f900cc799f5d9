"""The run's folder is the run's own: one run per `output_dir` (the lock of `launch.run_folder`), a save
that fails for want of space, the sources a run names checked before the model loads, a resume that changes a
setting its checkpoint restores. Each refusal is one line naming the value and what to do instead."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from conftest import REPO_ROOT, make_st_trainer, make_trainer
from test_preflight_refusals import DEBUG_HINT, no_model_load, refusal, train_argv, write_corpus  # noqa: F401 (a fixture)

from hf_mocose.commands.train import cli_main, main, parse_args
from hf_mocose.data.corpus import BUILTIN_PYTHON_DOCS, load_sentences
from hf_mocose.launch.checkpoints import checkpoint_problems
from hf_mocose.launch.run_folder import (LOCK_FILE, OWNER_FILE, SaveFailedError, folder_bytes, holds_run_folder,
                                         lock_run_folder, release_run_folder)

SCRIPT = str(REPO_ROOT / "scripts" / "train.py")
HOLD_THE_LOCK = """
import sys, time
from hf_mocose.launch.run_folder import lock_run_folder
lock_run_folder(sys.argv[1])
print("held", flush=True)
time.sleep(120)
"""


def subprocess_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HF_MOCOSE_DEBUG"}
    return {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO_ROOT)}


@pytest.fixture
def other_run(tmp_path):
    """Another live process holding `tmp_path / "run"`; yields (folder, pid)."""
    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(folder)], env=subprocess_env(),
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    yield folder, holder.pid
    holder.kill()
    holder.wait()


# ----------------------------------------------------------------------------- one run per folder
def test_a_folder_held_by_a_live_run_is_refused_naming_it(other_run, tmp_path, capsys):
    folder, pid = other_run
    assert cli_main(train_argv("unused", write_corpus(tmp_path / "c.txt"), folder)) == 2
    line = refusal(capsys)
    owner = json.loads((folder / OWNER_FILE).read_text())
    assert line == (f"output_dir '{folder}' is in use by another run (pid {pid} on {socket.gethostname()}, running "
                    f"since {owner['since']}): two runs in one folder delete each other's checkpoints. Wait for it "
                    "to end, or give another --output_dir.")
    assert sorted(p.name for p in folder.iterdir()) == sorted([LOCK_FILE, OWNER_FILE])  # nothing else written there


def test_both_python_front_ends_refuse_a_held_folder(tiny_encoder, other_run):
    folder, pid = other_run
    for trainer in (make_trainer(tiny_encoder, folder, save_strategy="steps", save_steps=2),
                    make_st_trainer(tiny_encoder, folder, save_strategy="steps", save_steps=2)):
        with pytest.raises(ValueError, match=f"is in use by another run \\(pid {pid} on "):
            trainer.train()
        assert trainer.state.global_step == 0


def test_the_lock_of_a_dead_run_is_taken_over_saying_so_and_released_at_the_end(tiny_encoder, tmp_path, caplog):
    folder = tmp_path / "run"
    folder.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = {"pid": int(dead.stdout), "host": socket.gethostname(), "since": "2026-01-01T00:00:00+00:00"}
    (folder / OWNER_FILE).write_text(json.dumps(record))  # as a run killed with SIGKILL leaves it
    caplog.set_level(logging.WARNING, logger="hf_mocose")
    trainer = make_trainer(tiny_encoder, folder, save_strategy="steps", save_steps=2)
    trainer.train()
    assert (f"output_dir {folder}: taking over the lock of a run that ended without releasing it (pid "
            f"{record['pid']} on {record['host']}, running since 2026-01-01T00:00:00+00:00).") in caplog.text
    assert not holds_run_folder(str(folder)) and not (folder / OWNER_FILE).exists()
    st_trainer = make_st_trainer(tiny_encoder, tmp_path / "st-run", save_strategy="steps", save_steps=2)
    st_trainer.train()
    assert not holds_run_folder(str(tmp_path / "st-run")) and not (tmp_path / "st-run" / OWNER_FILE).exists()


def test_the_lock_is_reentrant_in_a_process_and_released_after_a_failure(tmp_path):
    folder = str(tmp_path / "run")
    lock_run_folder(folder)
    lock_run_folder(folder)  # the driver holds it around MoCoSETrainer.train, which takes it too
    release_run_folder(folder)
    assert holds_run_folder(folder)
    release_run_folder(folder)
    assert not holds_run_folder(folder)
    trainer_folder = tmp_path / "refused"
    (trainer_folder / "checkpoint-2").mkdir(parents=True)  # another run's: refused after the lock was taken
    with pytest.raises(ValueError, match="holds another run's checkpoints"):
        main(train_argv("unused", write_corpus(tmp_path / "c.txt"), trainer_folder))
    assert not holds_run_folder(str(trainer_folder))


def test_a_release_removes_the_folders_the_lock_made_while_they_hold_nothing_else(tmp_path):
    """A run refused after taking the lock leaves nothing: the folders `lock_run_folder` made go, those that were
    there stay, and a folder a file was written to stays whole."""
    (tmp_path / "there").mkdir()
    empty = tmp_path / "there" / "made" / "run"
    lock_run_folder(str(empty))
    release_run_folder(str(empty))
    assert [entry.name for entry in tmp_path.iterdir()] == ["there"] and not any((tmp_path / "there").iterdir())
    written = tmp_path / "new" / "run"
    lock_run_folder(str(written))
    (written / "config.json").write_text("{}")
    release_run_folder(str(written))
    assert sorted(entry.name for entry in written.iterdir()) == [LOCK_FILE, "config.json"]


@pytest.mark.slow
def test_two_runs_started_together_leave_one_complete_run_and_one_line(tiny_encoder, tmp_path):
    corpus, out = write_corpus(tmp_path / "c.txt", n=64), tmp_path / "run"
    runs = [subprocess.Popen([sys.executable, SCRIPT, *train_argv(tiny_encoder, corpus, out, "--seed", str(seed),
                                                                   "--save_total_limit", "10", steps=6)],
                             env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for seed in (1, 2)]
    results = [(run.wait(timeout=600), *run.communicate()) for run in runs]
    assert sorted(code for code, _, _ in results) == [0, 2], [err[-2000:] for _, _, err in results]
    (_, winner_out, _), = [r for r in results if r[0] == 0]
    (_, _, loser_err), = [r for r in results if r[0] == 2]
    assert f"Saved the final MoCoSE checkpoint to {out / 'final'}" in winner_out
    errors = [line for line in loser_err.splitlines() if line.startswith("train.py: error: ")]
    assert len(errors) == 1 and f"output_dir '{out}' is in use by another run (pid " in errors[0], loser_err[-2000:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert (out / "final" / "model.safetensors").is_file() and not list(out.rglob(".tmp*"))
    assert not (out / OWNER_FILE).exists()


# ----------------------------------------------------------------------------- a full disk at a save
def fills_the_disk_at(monkeypatch, writer: str, *folders: str) -> None:
    """From the save of a folder named (or starting) as one of `folders` on, the weights writer (safetensors) or the
    optimizer's (torch.save) fails as on a full disk: safetensors after writing part of its file, torch.save with
    `OSError(ENOSPC)`."""
    import transformers.modeling_utils as modeling_utils

    if writer == "weights":
        real = modeling_utils.safe_save_file

        def save_file(tensors, filename, metadata=None):
            if Path(filename).parent.name.startswith(folders):
                Path(filename).write_bytes(b"\0" * 100)
                raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                                      '"No space left on device" })')
            return real(tensors, filename, metadata=metadata)

        monkeypatch.setattr(modeling_utils, "safe_save_file", save_file)
        return
    real = torch.save

    def save(obj, path, *args, **kwargs):
        if isinstance(path, (str, os.PathLike)) and Path(path).parent.name in folders and Path(path).name == writer:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


@pytest.mark.parametrize("writer", ["weights", "optimizer.pt", "scheduler.pt"])
def test_a_full_disk_at_a_save_is_one_line_and_the_last_complete_checkpoint_resumes(writer, tiny_encoder, tmp_path,
                                                                                    monkeypatch, capsys):
    corpus, out = write_corpus(tmp_path / "c.txt", n=64), tmp_path / "run"
    argv = train_argv(tiny_encoder, corpus, out, steps=4)
    fills_the_disk_at(monkeypatch, writer, "checkpoint-4")
    assert cli_main(argv) == 2
    line = refusal(capsys)
    file = out / "checkpoint-4" / ("model.safetensors" if writer == "weights" else writer)
    why = "Error while serializing" if writer == "weights" else "No space left on device"
    assert re.fullmatch(f"Saving {re.escape(str(out / 'checkpoint-4'))} failed writing {re.escape(str(file))} "
                        f"\\({why}.*\\): the save needs about [0-9.,]+ MB and [0-9.,]+ MB is free; the last complete "
                        f"checkpoint is {re.escape(str(out / 'checkpoint-2'))}: free space, then resume with "
                        "--resume_from_checkpoint last \\(it skips the incomplete checkpoint-4\\)\\.", line), line
    needed = float(re.search("needs about ([0-9.,]+) MB", line)[1].replace(",", ""))
    assert needed == pytest.approx(folder_bytes(out / "checkpoint-2") / 1e6, abs=0.05)
    monkeypatch.undo()
    assert cli_main([*argv, "--resume_from_checkpoint", "last"]) == 0
    assert not checkpoint_problems(out / "checkpoint-4")
    assert (out / "final" / "model.safetensors").is_file()


def export_line(export: Path, final: Path, again: str) -> str:
    """The one line of an export that a full disk stopped at its weights, with the size the save needs as a group."""
    return (re.escape(f"Saving {export} failed writing {export / 'model.safetensors'} (Error while serializing: ")
            + ".*" + re.escape("): the save needs about ") + "([0-9.,]+)" + re.escape(" MB and ") + "[0-9.,]+"
            + re.escape(f" MB is free; {final} is whole: free space, then export it again with {again}."))


def test_a_full_disk_at_the_export_or_the_loss_state_is_one_line(tiny_encoder, tmp_path, monkeypatch, capsys):
    from hf_mocose.commands.cli import main as hf_mocose

    corpus, out = write_corpus(tmp_path / "c.txt", n=64), tmp_path / "run"
    export, final, elsewhere = out / "sentence-transformers", out / "final", tmp_path / "exported"
    fills_the_disk_at(monkeypatch, "weights", ".sentence-transformers.staging-", ".exported.staging-")
    assert cli_main(train_argv(tiny_encoder, corpus, out, "--export_sentence_transformers", "true")) == 2
    assert re.fullmatch(export_line(export, final, f"hf-mocose export {final} {export} --overwrite"), refusal(capsys))
    assert not export.exists() and not list(out.glob(".sentence-transformers.staging-*"))
    # hf-mocose export onto a full disk: the same line, with the size of the export it writes
    assert hf_mocose(["export", str(final), str(elsewhere)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hf-mocose export: error: ")]
    assert len(lines) == 1 and lines[0].endswith(DEBUG_HINT), lines  # (the rest of stderr: progress bars)
    needed = re.fullmatch(export_line(elsewhere, final, f"hf-mocose export {final} {elsewhere}"),
                          lines[0][len("hf-mocose export: error: "):-len(DEBUG_HINT)])
    assert needed, lines
    monkeypatch.undo()
    assert hf_mocose(["export", str(final), str(elsewhere)]) == 0
    written = folder_bytes(elsewhere) - (elsewhere / "README.md").stat().st_size  # the card: a few kB of text
    assert float(needed[1].replace(",", "")) == pytest.approx(written / 1e6, abs=0.05)
    assert folder_bytes(out / "checkpoint-2") > 2 * written  # not a checkpoint's size (the optimizer's moments)

    st_out = tmp_path / "st-run"
    real = torch.save

    def save(obj, path, *args, **kwargs):
        if Path(path).name == "state.pt" and Path(path).parent.parent.name == "checkpoint-4":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    trainer = make_st_trainer(tiny_encoder, st_out, save_strategy="steps", save_steps=2, max_steps=4)
    with pytest.raises(SaveFailedError) as info:
        trainer.train()
    state = st_out / "checkpoint-4" / "mocose_loss" / "state.pt"
    assert str(info.value).startswith(f"Saving {st_out / 'checkpoint-4'} failed writing {state} (No space left on "
                                      "device): the save needs about ")
    assert str(info.value).endswith(f"the last complete checkpoint is {st_out / 'checkpoint-2'}: free space, then "
                                    "resume with --resume_from_checkpoint last (it skips the incomplete checkpoint-4).")
    assert holds_run_folder(str(st_out))  # a callback sees no exception: held until the next train() or the exit


def test_a_save_that_cannot_fit_is_refused_before_the_first_step(tiny_encoder, tmp_path, monkeypatch):
    import shutil

    trainer = make_trainer(tiny_encoder, tmp_path / "run", save_strategy="steps", save_steps=2)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=1000))
    with pytest.raises(ValueError, match=f"^output_dir '{re.escape(str(tmp_path / 'run'))}' has 0.0 MB free, and a "
                       "checkpoint of this run takes about [0-9.,]+ MB: the first save would fail. Free space there, "
                       "or give an --output_dir on a disk with room.$"):
        trainer.train()
    assert trainer.state.global_step == 0


# ----------------------------------------------------------------------------- every named source before the model
def test_a_folder_or_a_glob_of_files_is_a_corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(2):
        (folder / f"part{i}.jsonl").write_text("".join(json.dumps({"text": f"Part {i} line {j}."}) + "\n"
                                                       for j in range(3)))
    (folder / ".hidden").write_text("not a part")
    for train_file in (str(folder), str(folder / "part*.jsonl")):
        assert load_sentences(train_file)["text"] == [f"Part {i} line {j}." for i in range(2) for j in range(3)]
    (folder / "notes.md").write_text("# notes")
    with pytest.raises(ValueError, match=f"^train_file '{folder}': notes.md has an unsupported extension '.md'"):
        load_sentences(str(folder))
    (folder / "notes.md").rename(folder / "more.txt")
    with pytest.raises(ValueError, match=f"^train_file '{folder}' mixes formats \\(.jsonl, .txt\\)"):
        load_sentences(str(folder))


@pytest.mark.parametrize("name, problem", [("missing.txt", "does not exist"), ("*.parquet", "matches no file")])
def test_a_train_file_that_names_nothing_is_refused_before_the_model_loads(name, problem, tmp_path, capsys,
                                                                           no_model_load):
    train_file = str(tmp_path / name)
    argv = train_argv("unused", Path(train_file), tmp_path / "run")
    assert cli_main(argv) == 2
    assert refusal(capsys) == (f"train_file {train_file!r} {problem}: give a file, a folder or a glob (e.g. "
                               "'corpus/*.txt') of .csv/.json/.jsonl/.parquet/.tsv/.txt files.")


def test_a_bad_byte_in_a_folder_names_its_file(tmp_path, capsys, no_model_load):
    folder = tmp_path / "corpus"
    folder.mkdir()
    write_corpus(folder / "a.txt")
    write_corpus(folder / "b.txt", n=2, extra=b"caf\xe9\n")
    assert cli_main(train_argv("unused", folder, tmp_path / "run")) == 2
    assert refusal(capsys).startswith(f"train_file '{folder / 'b.txt'}' is not UTF-8 text: line 3 holds the byte(s) e9")


def test_a_hub_dataset_offline_and_not_cached_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch,
                                                                                no_model_load):
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty-cache")
    # a packaged recipe's train_file unset from the command line, so that dataset_name is read
    argv = ["quickstart", "--train_file", "none", "--dataset_name", "princeton-nlp/datasets-for-simcse",
            "--stsb_dev_file", "null", "--output_dir", str(tmp_path / "run"), "--bf16", "false"]
    assert cli_main(argv) == 2
    assert re.fullmatch(re.escape(
        "dataset_name 'princeton-nlp/datasets-for-simcse' cannot be read: offline mode is on (HF_HUB_OFFLINE / "
        "HF_DATASETS_OFFLINE) and it is not in the local cache (") + r"\w+" + re.escape(
        "). Give the sentences as a local --train_file (a file, a folder or a glob of .txt/.jsonl/.csv/.parquet "
        "files), or load the dataset once while online."), refusal(capsys))
    assert not (tmp_path / "run").exists()


def test_none_unsets_an_optional_path_of_a_recipe():
    script_args, args = parse_args(["quickstart", "--train_file", "none", "--dataset_name", "me/corpus",
                                    "--stsb_dev_file", "NULL", "--output_dir", "unused", "--bf16", "false"])
    assert (script_args.train_file, script_args.dataset_name, args.stsb_dev_file) == (None, "me/corpus", None)
    assert parse_args(["quickstart", "--output_dir", "unused", "--bf16", "false"])[0].train_file == BUILTIN_PYTHON_DOCS


# ----------------------------------------------------------------------------- a resume that changes a setting
def test_a_resume_at_another_learning_rate_or_weight_decay_is_refused_naming_both_values(tiny_encoder, tmp_path,
                                                                                        capsys, caplog):
    corpus, out = write_corpus(tmp_path / "c.txt", n=64), tmp_path / "run"
    assert cli_main(train_argv(tiny_encoder, corpus, out, "--learning_rate", "3e-5", steps=4)) == 0
    shutil.rmtree(out / "checkpoint-4")  # as if stopped after step 2
    capsys.readouterr()
    resume = ["--resume_from_checkpoint", "last", "--max_steps", "4"]
    assert cli_main(train_argv(tiny_encoder, corpus, out, *resume, "--learning_rate", "1e-4", "--weight_decay",
                               "0.01")) == 2
    assert refusal(capsys) == (
        f"Cannot resume {out / 'checkpoint-2'} with other optimizer settings (learning_rate 3e-05 in the checkpoint, "
        "0.0001 asked; weight_decay 1e-06 in the checkpoint, 0.01 asked): its optimizer and scheduler state restore the "
        "checkpoint's, so this run's would be silently ignored. Resume with the checkpoint's values, or train with "
        "the new ones from the start in a fresh --output_dir.")
    assert not (out / "checkpoint-4").exists()
    # the same settings resume; a schedule of another shape is this run's (the Trainer builds it from the arguments)
    caplog.set_level(logging.WARNING, logger="hf_mocose")
    assert cli_main(train_argv(tiny_encoder, corpus, out, *resume, "--learning_rate", "3e-5", "--lr_scheduler_type",
                               "constant", "--warmup_steps", "1")) == 0
    assert (f"Resuming {out / 'checkpoint-2'} with another learning-rate schedule, applied from here on (checkpoint "
            "-> this run): lr_scheduler_type linear -> constant; warmup_steps 0 -> 1.") in caplog.text
    assert (out / "checkpoint-4" / "trainer_state.json").is_file()

"""Fault injection: what a run does when things go wrong, and what it leaks (nothing).

The home of every failure mode found so far: a process killed while saving a checkpoint, weights
files cut short, a checkpoint that does not fit the run, bad arguments and inputs, and the Hub
token (which must only ever travel in an Authorization header). Each test names the failure it
injects; the message it expects says what to do next.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, run_cli
from fake_hub import FakeHub

from hf_mocose.commands.train import cli_main, main, parse_args
from hf_mocose.data.corpus import BUILTIN_PYTHON_DOCS, load_sentences
from hf_mocose.launch.checkpoints import (
    IncompleteCheckpointError,
    check_resume_compatible,
    checkpoint_problems,
    resolve_resume_checkpoint,
    safetensors_problem,
)
from hf_mocose.launch.run_folder import LOCK_FILE

UNREACHABLE_MODEL = "no such folder, and not a Hub id that can be reached offline"


def train_argv(encoder: str, output_dir: Path, *extra: str, steps: int = 6) -> list[str]:
    """A tiny deterministic run that saves a checkpoint every 2 steps and keeps them all."""
    return ["--model_name_or_path", encoder, "--train_file", BUILTIN_PYTHON_DOCS, "--max_train_samples", "64",
            "--per_device_train_batch_size", "8", "--max_steps", str(steps), "--queue_size", "16",
            "--queue_init_size", "4", "--output_dir", str(output_dir), "--use_cpu", "true", "--eval_strategy", "no",
            "--save_steps", "2", "--save_total_limit", "10", "--disable_tqdm", "true", "--fgsm_epsilon", "0.01",
            "--report_to", "none", "--export_sentence_transformers", "false", *extra]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HF_MOCOSE_DEBUG"}
    return {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO_ROOT), **extra}


def files_under(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.rglob("*")) if p.is_file()]


@pytest.fixture(scope="module")
def reference_run(tiny_encoder, tmp_path_factory) -> Path:
    """An uninterrupted 6-step run: checkpoint-2, -4, -6 and final/."""
    out = tmp_path_factory.mktemp("reference")
    main(train_argv(tiny_encoder, out))
    return out


def copy_checkpoints(reference: Path, target: Path, *steps: int) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for step in steps:
        shutil.copytree(reference / f"checkpoint-{step}", target / f"checkpoint-{step}")
    return target


def truncate(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


# ----------------------------------------------------------------------------- killed while saving
KILL_DURING_SAVE = '''
import os, signal, sys
from pathlib import Path

import transformers.modeling_utils as modeling_utils
from hf_mocose.commands.train import main

real_save = modeling_utils.safe_save_file


def save_then_die(tensors, filename, metadata=None):
    """At checkpoint-4, die as SIGKILL would leave safetensors' save: half a temporary file, no model.safetensors."""
    folder = Path(filename).parent
    if folder.name == "checkpoint-4":
        temporary = folder / ".tmpK1lled"
        real_save(tensors, str(temporary), metadata=metadata)
        os.truncate(temporary, temporary.stat().st_size // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(tensors, filename, metadata=metadata)


modeling_utils.safe_save_file = save_then_die
main(sys.argv[1:])
'''


@pytest.mark.slow
def test_killed_during_save_resume_last_picks_the_complete_checkpoint_exactly(
        tiny_encoder, reference_run, tmp_path, caplog):
    out = tmp_path / "run"
    script = tmp_path / "kill_during_save.py"
    script.write_text(KILL_DURING_SAVE)
    killed = subprocess.run([sys.executable, str(script), *train_argv(tiny_encoder, out)], env=subprocess_env(),
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    half_written = out / "checkpoint-4"
    assert (half_written / "config.json").is_file() and (half_written / ".tmpK1lled").is_file()
    assert not (half_written / "model.safetensors").exists()
    assert not checkpoint_problems(out / "checkpoint-2")

    # Naming the half-written folder is refused, pointing at the complete one.
    with pytest.raises(IncompleteCheckpointError) as info:
        resolve_resume_checkpoint(str(half_written), out)
    assert "incomplete" in str(info.value) and ".tmpK1lled" in str(info.value)
    assert f"--resume_from_checkpoint {out / 'checkpoint-2'}" in str(info.value)

    (out / "final").mkdir()  # as an earlier run killed while saving its final model would have left it
    (out / "final" / ".tmpSt4le").write_bytes(b"half a model")
    caplog.set_level(logging.INFO, logger="hf_mocose")
    final = main(train_argv(tiny_encoder, out, "--resume_from_checkpoint", "last"))
    log = caplog.text
    assert "skipped checkpoint-4, it is incomplete: temporary file .tmpK1lled" in log
    assert f"resuming from {out / 'checkpoint-2'}, the newest complete checkpoint" in log
    assert f"Removing {half_written}" in log
    # Nothing stale carried forward: no temporary file anywhere, and checkpoint-4 was written anew, whole.
    assert not [p for p in files_under(out) if p.name.startswith(".tmp")]
    assert not checkpoint_problems(half_written)
    from safetensors.torch import load_file

    want, got = load_file(reference_run / "final" / "model.safetensors"), load_file(Path(final) / "model.safetensors")
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name


def test_interrupted_folders_are_skipped_and_say_why(reference_run, tmp_path, caplog):
    out = copy_checkpoints(reference_run, tmp_path, 2, 4, 6)
    (out / "checkpoint-6" / "optimizer.pt").unlink()  # killed before the optimizer state was written
    (out / "checkpoint-6" / "trainer_state.json").unlink()
    truncate(out / "checkpoint-4" / "model.safetensors")  # weights cut short (full disk, interrupted copy)
    caplog.set_level(logging.INFO, logger="hf_mocose")
    assert resolve_resume_checkpoint("last", out) == str(out / "checkpoint-2")
    assert "skipped checkpoint-6, it is incomplete: no trainer_state.json" in caplog.text
    assert "no optimizer.pt" in caplog.text
    assert f"skipped checkpoint-4, it is incomplete: {out / 'checkpoint-4' / 'model.safetensors'} is incomplete (" in caplog.text
    # A whole run of incomplete checkpoints starts from scratch, saying so.
    assert resolve_resume_checkpoint("last", tmp_path / "empty") is None
    assert resolve_resume_checkpoint(True, out) == str(out / "checkpoint-2")
    assert resolve_resume_checkpoint("false", out) is None


# ----------------------------------------------------------------------------- truncated weights
def test_truncated_weights_on_resume_name_the_file_and_the_previous_checkpoint(
        tiny_encoder, reference_run, tmp_path):
    out = copy_checkpoints(reference_run, tmp_path / "run", 2, 4)
    weights = out / "checkpoint-4" / "model.safetensors"
    truncate(weights)
    with pytest.raises(IncompleteCheckpointError) as info:
        main(train_argv(tiny_encoder, out, "--resume_from_checkpoint", str(out / "checkpoint-4")))
    message = str(info.value)
    assert f"{weights} is incomplete (" in message and " bytes)" in message
    assert f"The previous complete checkpoint is {out / 'checkpoint-2'}" in message


def test_truncated_weights_in_export(reference_run, tmp_path, capsys):
    out = copy_checkpoints(reference_run, tmp_path / "run", 2, 4)
    weights = out / "checkpoint-4" / "model.safetensors"
    truncate(weights)
    code, _, err = run_cli(["export", str(out / "checkpoint-4"), str(tmp_path / "st")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{weights} is incomplete" in err
    assert f"The previous complete checkpoint is {out / 'checkpoint-2'}: export it instead." in err
    assert not (tmp_path / "st").exists()
    truncate(out / "checkpoint-2" / "model.safetensors")  # no complete checkpoint left to point to
    code, _, err = run_cli(["export", str(out / "checkpoint-2"), str(tmp_path / "st")], capsys)
    assert code == 2 and "There is no earlier complete checkpoint" in err


def test_truncated_starting_model_is_named(tiny_encoder, reference_run, tmp_path):
    final = tmp_path / "final"
    shutil.copytree(reference_run / "final", final)
    truncate(final / "model.safetensors")
    with pytest.raises(IncompleteCheckpointError, match=f"{final / 'model.safetensors'} is incomplete"):
        main(train_argv(str(final), tmp_path / "run"))


# ----------------------------------------------------------------------------- damaged safetensors files
def _whole_weights(path: Path) -> tuple[bytes, int]:
    """A small safetensors file (two tensors, metadata): its bytes and its header length."""
    from safetensors.torch import save_file

    save_file({"a": torch.arange(100, dtype=torch.float32), "b": torch.zeros(3, 4, dtype=torch.bfloat16)},
              str(path), metadata={"format": "pt"})
    data = path.read_bytes()
    return data, int.from_bytes(data[:8], "little")


def _offsets_changed(data: bytes, header_length: int) -> bytes:
    """Valid JSON whose byte ranges do not fit the tensors' shapes (same header length, same file size)."""
    header = json.loads(data[8:8 + header_length])
    header["a"]["data_offsets"] = [0, 10]
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= header_length
    return data[:8] + text.ljust(header_length) + data[8 + header_length:]


DAMAGE = {  # name -> (damaged bytes from (data, header length), expected message after the path)
    "whole": (lambda d, n: d, None),
    "shorter than the length prefix": (lambda d, n: d[:5], " is incomplete (5 bytes, cut off inside its header)"),
    "cut inside the header": (lambda d, n: d[:8 + n // 2], "cut off inside its header)"),
    "cut inside the data": (lambda d, n: d[:8 + n + 50], "{cut:,} of {size:,} bytes)"),
    "one byte short": (lambda d, n: d[:-1], "{cut:,} of {size:,} bytes)"),
    "damaged JSON": (lambda d, n: d[:9] + b"#" + d[10:], " is not a readable safetensors file (damaged header: "),
    "byte ranges that do not fit": (_offsets_changed, " is not a readable safetensors file (damaged header: "),
    "bytes after the data": (lambda d, n: d + bytes(16), " is not a readable safetensors file ({cut:,} bytes, 16 more"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_safetensors_damage_is_named_with_sizes_and_agrees_with_the_loader(case, tmp_path):
    """`safetensors_problem` (`safe_open`'s verdict, our wording) for each kind of damage, in one line."""
    from safetensors import SafetensorError, safe_open

    data, header_length = _whole_weights(tmp_path / "whole.safetensors")
    damage, expected = DAMAGE[case]
    path = tmp_path / "model.safetensors"
    path.write_bytes(damage(data, header_length))
    problem = safetensors_problem(path)
    if expected is None:
        assert problem is None
    else:
        assert problem.startswith(str(path)) and "\n" not in problem
        assert expected.format(cut=path.stat().st_size, size=len(data)) in problem, problem
    try:  # what transformers' loader (safe_open) makes of the same file
        with safe_open(str(path), framework="pt") as weights:
            [weights.get_tensor(name) for name in weights.keys()]
        loads = True
    except SafetensorError:
        loads = False
    assert loads == (problem is None)
    assert safetensors_problem(tmp_path / "absent.safetensors") == f"{tmp_path / 'absent.safetensors'} is missing"


# ----------------------------------------------------------------------------- a checkpoint that does not fit
def test_resume_with_another_queue_size_names_the_field_before_training(tiny_encoder, reference_run, tmp_path):
    out = copy_checkpoints(reference_run, tmp_path / "run", 2)
    with pytest.raises(ValueError) as info:
        main(train_argv(tiny_encoder, out, "--queue_size", "32", "--resume_from_checkpoint", "last"))
    message = str(info.value)
    assert "(queue_size=16 in the checkpoint, queue_size=32 in this run; tensor shapes" in message
    assert "queue.keys (16, 32) vs (32, 32)" in message
    # no step was taken, nothing was saved (the run lock's empty file stays, launch.run_folder)
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE, "checkpoint-2"]


def test_changed_field_without_a_shape_change_only_warns(tiny_encoder, reference_run):
    from hf_mocose import MoCoSEModel

    model = MoCoSEModel.from_pretrained(tiny_encoder, queue_size=16, queue_init_size=4, max_seq_length=32,
                                        contrastive_temperature=0.1)
    assert check_resume_compatible(reference_run / "checkpoint-2", model) == {"contrastive_temperature": (0.05, 0.1)}


# ----------------------------------------------------------------------------- bad arguments and inputs
@pytest.mark.parametrize("flags, match", [
    (["--queue_init_size", "600"], "queue_init_size"),
    (["--queue_size", "0"], "queue_size"),
    (["--contrastive_temperature", "0"], "contrastive_temperature"),
    (["--contrastive_temperature", "-0.1"], "contrastive_temperature"),
    (["--ema_decay_start", "1.5"], "ema_decay_start"),
    (["--ema_decay_end", "-0.1"], "ema_decay_end"),
    (["--sentence_pooling", "max"], "sentence_pooling 'max'"),
    (["--per_device_train_batch_size", "0"], "per_device_train_batch_size must be an integer >= 1, got 0"),
    (["--per_device_train_batch_size", "-4"], "per_device_train_batch_size must be an integer >= 1, got -4"),
    (["--per_device_eval_batch_size", "0"], "per_device_eval_batch_size must be an integer >= 1, got 0"),
    (["--gradient_accumulation_steps", "0"], "gradient_accumulation_steps must be an integer >= 1, got 0"),
    (["--dataloader_num_workers", "-1"], "dataloader_num_workers must be >= 0"),
    (["--num_train_epochs", "0"], "num_train_epochs must be > 0 when max_steps is not set"),
    (["--save_steps", "0"], "save_steps must be > 0 with save_strategy='steps'"),
    (["--eval_steps", "-5"], "eval_steps must be > 0 with eval_strategy='steps'"),
    (["--learning_rate", "-1"], "learning_rate must be >= 0"),
    (["--max_train_samples", "0"], "max_train_samples must be >= 1"),
    (["--preprocessing_num_workers", "0"], "preprocessing_num_workers must be >= 1"),
])
def test_bad_arguments_are_refused_before_anything_is_loaded(flags, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        parse_args(["--output_dir", str(tmp_path), "--use_cpu", "true", *flags])


def test_empty_corpus_file_is_named(tmp_path):
    empty = tmp_path / "corpus.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=f"train_file '{empty}' is empty \\(0 bytes\\)"):
        load_sentences(str(empty))


@pytest.mark.parametrize("model", ["/nonexistent/encoder", "someone/not-in-the-cache", "not a/valid id"])
def test_missing_model_path_is_one_clear_message(model, tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match=UNREACHABLE_MODEL) as info:
        main(["--model_name_or_path", model, "--train_file", BUILTIN_PYTHON_DOCS, "--output_dir", str(tmp_path),
              "--use_cpu", "true", "--eval_strategy", "no"])
    assert repr(model) in str(info.value)
    assert info.value.__cause__ is None and info.value.__context__ is None  # not a chain of four tracebacks


# ----------------------------------------------------------------------------- one line, or a traceback
def test_configuration_error_is_one_line_and_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    argv = ["--output_dir", str(tmp_path), "--per_device_train_batch_size", "0"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["train.py: error: per_device_train_batch_size must be an integer >= 1, got 0. "
                                "(HF_MOCOSE_DEBUG=1 shows the traceback)"]
    monkeypatch.setenv("HF_MOCOSE_DEBUG", "1")
    with pytest.raises(ValueError, match="per_device_train_batch_size"):
        cli_main(argv)


def test_a_bug_keeps_its_traceback(tiny_encoder, tmp_path, monkeypatch, capsys):
    import hf_mocose.commands.train as training

    def broken_seed(seed):  # stands for a bug: a ValueError nobody raised on purpose
        return int("not a number")

    monkeypatch.setattr(training, "set_seed", broken_seed)
    with pytest.raises(ValueError, match="invalid literal"):
        cli_main(train_argv(tiny_encoder, tmp_path))
    monkeypatch.setattr(training, "set_seed", lambda seed: {}["missing"])
    with pytest.raises(KeyError):
        cli_main(train_argv(tiny_encoder, tmp_path))


def test_hf_mocose_command_errors_are_one_line(tmp_path, capsys, monkeypatch):
    code, _, err = run_cli(["export", str(tmp_path / "missing"), str(tmp_path / "st")], capsys)
    assert code == 2 and err.splitlines() == [
        f"hf-mocose export: error: Checkpoint folder '{tmp_path / 'missing'}' does not exist. "
        "(HF_MOCOSE_DEBUG=1 shows the traceback)"]
    monkeypatch.setenv("HF_MOCOSE_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        run_cli(["export", str(tmp_path / "missing"), str(tmp_path / "st")], capsys)


@pytest.mark.slow
def test_train_script_exit_status_and_debug_variable(tmp_path):
    command = [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), "--output_dir", str(tmp_path),
               "--model_name_or_path", str(tmp_path / "no-such-model"), "--train_file", BUILTIN_PYTHON_DOCS,
               "--use_cpu", "true"]
    quiet = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 2
    assert "Traceback" not in quiet.stderr
    assert f"train.py: error: model_name_or_path '{tmp_path / 'no-such-model'}': {UNREACHABLE_MODEL}" in quiet.stderr
    loud = subprocess.run(command, env=subprocess_env(HF_MOCOSE_DEBUG="1"), capture_output=True, text=True, timeout=300)
    assert loud.returncode == 1 and "Traceback (most recent call last)" in loud.stderr


# ----------------------------------------------------------------------------- the Hub token
def test_pickled_arguments_never_hold_the_token(tmp_path):
    from hf_mocose.trainer.training_args import MoCoSETrainingArguments

    args = MoCoSETrainingArguments(output_dir=str(tmp_path), use_cpu=True, hub_token="hf_pickleProbe")
    for copied in (pickle.loads(pickle.dumps(args)), copy.copy(args), copy.deepcopy(args)):
        assert copied.hub_token is None and copied.queue_size == args.queue_size
    assert args.hub_token == "hf_pickleProbe"  # the live arguments keep it for the Authorization header
    assert "hf_pickleProbe" not in args.to_json_string() + repr(args)


def secret_forms(token: str) -> list[bytes]:
    """The token as bytes and as it would appear inside base64 text at each of the three alignments."""
    forms = [token.encode()]
    for shift in range(3):
        data = b"\0" * shift + token.encode()
        # Skip the group holding the prefix and the last, partial group: the rest depends on the token alone.
        forms.append(base64.b64encode(data)[4 if shift else 0:4 * (len(data) // 3)])
    return forms


@pytest.mark.slow
def test_hub_token_is_never_written_nor_uploaded(tiny_encoder, tmp_path):
    token = "hf_leakProbe" + os.urandom(8).hex()
    hub = FakeHub(token=token)
    hub.thread.start()
    out = tmp_path / "run"
    env = subprocess_env(HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="0", HF_HOME=str(tmp_path / "hf-home"),
                         HF_TOKEN_PATH=str(tmp_path / "no-token-file"))
    env.pop("HF_TOKEN", None)
    try:
        run = subprocess.run(
            [sys.executable, str(REPO_ROOT / "scripts" / "train.py"),
             *train_argv(tiny_encoder, out, "--push_to_hub", "true", "--hub_token", token, "--hub_model_id",
                         "alice/run", "--hub_strategy", "all_checkpoints", "--hub_always_push", "true",
                         "--export_sentence_transformers", "true",
                         steps=4)],
            env=env, capture_output=True, text=True, timeout=600)
    finally:
        hub.server.shutdown()
        hub.server.server_close()
    assert run.returncode == 0, run.stderr[-3000:]
    uploaded = hub.files[("alice/run", "main")]
    # Every kind of folder was pushed, each with its pickled arguments: checkpoints, the MoCoSE model, the export.
    assert {"checkpoint-2/training_args.bin", "checkpoint-4/training_args.bin", "mocose/training_args.bin",
            "modules.json", "README.md"} <= set(uploaded)
    assert f"Bearer {token}" in hub.authorizations  # the token did travel, in the Authorization header only
    forms = secret_forms(token)
    leaks = [f"uploaded {name}" for name, data in uploaded.items() if any(f in data for f in forms)]
    leaks += [f"request {i}" for i, raw in enumerate(hub.raw) if any(f in raw for f in forms)]
    leaks += [f"file {p}" for p in files_under(out) if any(f in p.read_bytes() for f in forms)]
    leaks += [f"log {name}" for name, text in (("stdout", run.stdout), ("stderr", run.stderr)) if token in text]
    assert not leaks
    saved = torch.load(out / "checkpoint-2" / "training_args.bin", weights_only=False)
    assert saved.hub_token is None and saved.push_to_hub is True
    assert json.loads(uploaded["checkpoint-2/trainer_state.json"])["global_step"] == 2

"""`hf-mocose train` and `hf-mocose recipes`: recipes by name, launch flags to accelerate, the run's exit status.

The launches themselves: tests/test_packaging.py (an installed wheel, from another folder) and
tests/test_multinode.py (two machines on localhost).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml
from conftest import REPO_ROOT, run_cli

from hf_mocose.commands import launch
from hf_mocose.commands.recipes import ACCELERATE_CONFIGS, RECIPES, named_files, recipe_purpose, resolve_yaml
from hf_mocose.commands.train import parse_args


def test_every_recipe_is_named_and_says_what_it_is_for(capsys):
    recipes = named_files(RECIPES)
    assert set(recipes) == {path.stem for path in (REPO_ROOT / "training_args").glob("*.yaml")}
    assert set(named_files(ACCELERATE_CONFIGS)) == {"default", "ddp", "fsdp2", "zero2", "zero3"}
    for name, path in recipes.items():
        purpose = recipe_purpose(path)  # the first line: one whole sentence
        assert purpose.endswith(".") and len(purpose) <= 115, (name, purpose)
    code, out, _ = run_cli(["recipes"], capsys)
    assert code == 0
    for name, path in recipes.items():
        assert re.search(rf"^  {re.escape(name)} +{re.escape(recipe_purpose(path))}$", out, re.M), out
    assert "ddp, default, fsdp2, zero2, zero3" in out
    assert run_cli(["train", "--list"], capsys)[1] == out


def test_a_reader_that_stops_early_gets_no_traceback():
    """`hf-mocose recipes | head -1`: the closed pipe ends the command quietly with a shell's SIGPIPE status."""
    listing = subprocess.Popen([sys.executable, "-m", "hf_mocose.commands.cli", "recipes"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    listing.stdout.close()  # before the command has printed anything: its first flush meets a closed pipe
    _, err = listing.communicate(timeout=120)
    assert (listing.returncode, err) == (141, "")


def test_a_recipe_is_a_name_or_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside the checkout
    quickstart = REPO_ROOT / "training_args" / "quickstart.yaml"
    assert resolve_yaml("quickstart") == resolve_yaml("quickstart.yaml") == quickstart
    own = tmp_path / "mine.yaml"
    own.write_text("model_name_or_path: builtin:all-MiniLM-L6-v2\nqueue_size: 64\n")
    assert resolve_yaml(str(own)) == own and resolve_yaml("mine.yaml") == own.relative_to(tmp_path)
    for missing in ("quickstrat", "somewhere/quickstart.yaml"):
        with pytest.raises(FileNotFoundError, match=rf"Recipe '{missing}' does not exist: .*\(adapt-minilm, .*quick"):
            resolve_yaml(missing)
    script_args, args = parse_args(["mocose-bert-base", "--max_steps", "3", "--output_dir", str(tmp_path / "o")])
    recipe = yaml.safe_load((REPO_ROOT / "training_args" / "mocose-bert-base.yaml").read_text())
    assert script_args.model_name_or_path == recipe["model_name_or_path"] and args.queue_size == recipe["queue_size"]
    assert args.max_steps == 3
    assert parse_args([str(own), "--output_dir", "o"])[1].queue_size == 64


def test_launch_flags_go_to_accelerate_and_the_rest_to_training(monkeypatch, capsys):
    """The GPU-node command `hf-mocose train mocose-bert-base --accelerate_config fsdp2 --num_processes 8`, with more
    flags of both kinds: what accelerate is asked to start (its launcher is not run here)."""
    from accelerate.commands.launch import launch_command_parser

    launched = []  # what the child process would parse (`launch.run_launcher` starts it)
    monkeypatch.setattr(launch, "run_launcher", lambda arguments: launched.append(
        launch_command_parser().parse_args(arguments)) or 0)
    argv = ["train", "mocose-bert-base", "--accelerate_config", "fsdp2", "--num_processes", "8", "--max_steps", "3",
            "--gradient_accumulation_steps", "2", "--main_process_port=29555", "--same_network", "--debug",
            "underflow_overflow",
            "--learning_rate=1e-5"]
    code, _, _ = run_cli(argv, capsys)
    assert code == 0 and len(launched) == 1
    args = launched[0]
    assert args.config_file == str(REPO_ROOT / "configs" / "accelerate" / "fsdp2.yaml")
    assert (args.num_processes, args.main_process_port, args.same_network) == (8, 29555, True)
    assert args.module and args.training_script == launch.TRAIN_MODULE
    # Names both parsers know stay with training (as in TRL): gradient accumulation, debug.
    assert args.training_script_args == ["mocose-bert-base", "--max_steps", "3", "--gradient_accumulation_steps", "2",
                                         "--debug", "underflow_overflow", "--learning_rate=1e-5"]
    run_cli(["train", "quickstart", "--max_steps", "3"], capsys)  # no launcher config given: `default`
    assert launched[1].config_file == str(REPO_ROOT / "configs" / "accelerate" / "default.yaml")
    own = REPO_ROOT / "configs" / "accelerate" / "ddp.yaml"
    run_cli(["train", "quickstart", "--config_file", str(own)], capsys)  # accelerate's own flag
    run_cli(["train", "quickstart", f"--accelerate_config={own}"], capsys)
    assert launched[2].config_file == launched[3].config_file == str(own)


def test_launcher_mistakes_are_one_line(capsys):
    code, _, err = run_cli(["train", "quickstart", "--accelerate_config", "fsdp3"], capsys)
    assert code == 2 and err.strip() == (
        "hf-mocose train: error: Accelerate config 'fsdp3' does not exist: give a YAML file or the name of one that "
        "ships with hf-mocose (ddp, default, fsdp2, zero2, zero3). (HF_MOCOSE_DEBUG=1 shows the traceback)")
    code, _, err = run_cli(["train", "quickstart", "--accelerate_config", "ddp", "--config_file", "x.yaml"], capsys)
    assert code == 2 and "give one launcher config: --accelerate_config NAME|PATH or --config_file PATH" in err
    code, out, _ = run_cli(["train"], capsys)
    assert code == 2 and out.startswith("usage: hf-mocose train RECIPE") and "quickstart" in out


def test_the_exit_status_is_the_run_s(monkeypatch, capsys):
    """A failed process is reported by the process itself (its one line); the launcher adds no traceback and returns
    its status: one process (accelerate raises CalledProcessError), several (torch raises ChildFailedError)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    def one_process(args):
        raise subprocess.CalledProcessError(2, ["python"])

    def several(args):
        failure = ProcessFailure(local_rank=0, pid=1, exitcode=2, error_file="")
        raise ChildFailedError("hf_mocose.commands.train", {0: failure})

    for launcher in (one_process, several):  # in run_launcher's child process
        monkeypatch.setattr("accelerate.commands.launch.launch_command", launcher)
        assert launch.accelerate_launch(["--module", launch.TRAIN_MODULE, "quickstart"]) == 2


@pytest.mark.slow
def test_a_refusal_through_hf_mocose_train_is_train_py_s_line(tmp_path):
    """The same refusal as `scripts/train.py`, word for word, and its status 2; no traceback."""
    argv = ["quickstart", "--per_device_train_batch_size", "0", "--output_dir", str(tmp_path / "out")]
    cli = subprocess.run([sys.executable, "-m", "hf_mocose.commands.cli", "train", *argv], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    script = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "train.py"), *argv], cwd=tmp_path,
                            capture_output=True, text=True, timeout=600)
    assert cli.returncode == script.returncode == 2
    assert cli.stderr.strip() == script.stderr.strip()
    line = r"train\.py: error: per_device_train_batch_size .*0.* \(HF_MOCOSE_DEBUG=1 shows the traceback\)"
    assert re.fullmatch(line, cli.stderr.strip())
    assert not (tmp_path / "out").exists()


def test_recipes_slurm_prints_the_shipped_job_script_which_the_docs_include(capsys):
    script = (REPO_ROOT / "hf_mocose" / "launch" / "mocose.sbatch").read_text(encoding="utf-8")
    code, out, _ = run_cli(["recipes", "--slurm"], capsys)
    assert (code, out) == (0, script)
    docs = (REPO_ROOT / "docs" / "distributed.md").read_text(encoding="utf-8")
    assert f"```bash\n{script}```\n" in docs  # docs/distributed.md, "SLURM": the file itself, not a drifting copy

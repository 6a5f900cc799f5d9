"""A stop request (SIGTERM, SIGUSR1, SIGINT): the step's checkpoint, exit status 75, and a resume to the same weights.

Each test sends the signal where a cluster or a user would: to a training process at a chosen step or inside a save
(tests/stop_worker.py, deterministic), to the `hf-mocose train` launcher alone, to its whole process group (Ctrl-C),
to plain `accelerate launch`, or kills the launcher outright. The launcher cases wait for the first logged step
before they signal, so the run stops at whichever step follows. Tests marked `preemption` (`-m preemption`, .ci/run)
cover the rest of the matrix: two processes with one rank signalled and resumed bit for bit, a signal during an
evaluation, SIGKILL of the launcher, Ctrl-C, plain `accelerate launch` in one and two processes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
from conftest import SENTEVAL_DIR, make_st_trainer, make_trainer, needs_senteval
from datasets import Dataset
from safetensors.torch import load_file
from test_fault_injection import subprocess_env, train_argv
from test_st_loss import _long_sentences, _losses
from transformers import TrainerCallback

from hf_mocose.launch.checkpoints import checkpoint_problems, resolve_resume_checkpoint
from hf_mocose.launch.stop_request import STOPPED_EXIT_STATUS, StopOnRequestCallback, StopRequested, requested_signal

WORKER = Path(__file__).with_name("stop_worker.py")
TIMEOUT_S = 300


def stopped_line(signal_name: str, checkpoint: Path, hint: str = "--resume_from_checkpoint last") -> str:
    return (f"Stopped on request ({signal_name}) at step {checkpoint.name.split('-')[1]}: {checkpoint} is complete; "
            f"resume with {hint} (exit status {STOPPED_EXIT_STATUS}).")


def run_worker(encoder: str, out: Path, *extra: str, steps: int = 6, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(WORKER), *train_argv(encoder, out, *extra, steps=steps)],
                          env=subprocess_env(**env), capture_output=True, text=True, timeout=TIMEOUT_S)


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "final" / "model.safetensors")


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    assert [name for name in a if not torch.equal(a[name], b[name])] == []


def assert_stopped(proc, out: Path, signal_name: str, step: int | None = None, processes: int = 1) -> Path:
    """Exit 75, one line, a complete checkpoint of the step (every rank's RNG state), no final model or export."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == STOPPED_EXIT_STATUS, output[-3000:]
    lines = [line for line in output.splitlines() if line.startswith("Stopped on request")]
    assert len(lines) == 1, output[-3000:]
    checkpoint = max((p for p in out.glob("checkpoint-*")), key=lambda p: int(p.name.split("-")[1]))
    assert lines[0] == stopped_line(signal_name, checkpoint)
    assert step is None or checkpoint.name == f"checkpoint-{step}"
    assert checkpoint_problems(checkpoint) == []
    assert sorted(p.name for p in checkpoint.glob("rng_state*.pth")) == (
        ["rng_state.pth"] if processes == 1 else [f"rng_state_{r}.pth" for r in range(processes)])
    assert not (out / "final").exists() and not (out / "sentence-transformers").exists()
    return checkpoint


# ----------------------------------------------------------------------------- one process, at a chosen step
@pytest.fixture(scope="module")
def uninterrupted(tiny_encoder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    proc = run_worker(tiny_encoder, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def stopped(tiny_encoder, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A Ctrl-C (SIGINT) as step 3 begins: checkpoint-2 (periodic) and checkpoint-3 (the stop's)."""
    out = tmp_path_factory.mktemp("stopped")
    return out, run_worker(tiny_encoder, out, STOP_AT_STEP="0:2:SIGINT")


def test_a_stop_request_saves_the_step_and_resume_last_reaches_the_uninterrupted_weights(stopped, uninterrupted,
                                                                                          tiny_encoder):
    out, proc = stopped
    assert_stopped(proc, out, "SIGINT", step=3)
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr
    resumed = run_worker(tiny_encoder, out, "--resume_from_checkpoint", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr and "checkpoint-3" in resumed.stderr
    assert_same_weights(final_weights(out), final_weights(uninterrupted))


def test_last_skips_a_folder_marked_incomplete_by_transformers(stopped, tmp_path, caplog):
    """transformers' JIT checkpoint writes checkpoint-is-incomplete.txt while it saves: such a folder is skipped."""
    out, _ = stopped
    for name in ("checkpoint-2", "checkpoint-3"):
        shutil.copytree(out / name, tmp_path / name)
    (tmp_path / "checkpoint-3" / "checkpoint-is-incomplete.txt").write_text("")
    with caplog.at_level("WARNING"):
        assert resolve_resume_checkpoint("last", tmp_path) == str(tmp_path / "checkpoint-2")
    assert "skipped checkpoint-3, it is incomplete: checkpoint-is-incomplete.txt (transformers' JIT checkpoint" in caplog.text


def test_a_signal_during_a_save_and_a_second_during_the_stop_save_cut_neither_short(tiny_encoder, tmp_path):
    """SIGTERM while checkpoint-2 is written: that save completes, the run stops after step 3; SIGUSR1 while
    checkpoint-3 (the stop's) is written: it completes too, and the run still exits 75."""
    proc = run_worker(tiny_encoder, tmp_path, STOP_IN_SAVE="checkpoint-2:SIGTERM,checkpoint-3:SIGUSR1")
    assert_stopped(proc, tmp_path, "SIGTERM", step=3)
    assert checkpoint_problems(tmp_path / "checkpoint-2") == []


def test_a_signal_during_the_final_save_lets_the_run_finish(tiny_encoder, tmp_path):
    """After the last step a request is no stop: final/ and the export are written, exit 0, and it is said."""
    proc = run_worker(tiny_encoder, tmp_path, "--export_sentence_transformers", "true", STOP_IN_SAVE="final:SIGTERM")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "final" / "model.safetensors").is_file()
    assert (tmp_path / "sentence-transformers" / "README.md").is_file()
    assert "A stop request (SIGTERM) came after the last step: the run finished." in proc.stdout


@pytest.mark.skipif(not hasattr(__import__("transformers").TrainingArguments, "enable_jit_checkpoint"),
                    reason="transformers < 5.1 has no enable_jit_checkpoint")
def test_enable_jit_checkpoint_is_refused_before_the_model_loads(tmp_path):
    from test_fault_injection import UNREACHABLE_MODEL

    proc = subprocess.run([sys.executable, str(WORKER), *train_argv(UNREACHABLE_MODEL, tmp_path),
                           "--enable_jit_checkpoint", "true"], env=subprocess_env(), capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "train.py: error: enable_jit_checkpoint=True is refused: transformers' SIGTERM checkpoint")
    assert "hf-mocose itself stops on SIGTERM, SIGUSR1 or SIGINT" in proc.stderr


class FailAtStep(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        raise RuntimeError("a failure mid-training")


def test_moco_se_trainer_gives_back_the_script_s_handlers_after_train_even_when_it_raised(tiny_encoder, tmp_path):
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    trainer = make_trainer(tiny_encoder, tmp_path, max_steps=2)
    trainer.add_callback(FailAtStep())
    with pytest.raises(RuntimeError, match="a failure mid-training"):
        trainer.train()
    assert {signum: signal.getsignal(signum) for signum in before} == before


# ----------------------------------------------------------------------------- the sentence-transformers front end
class SignalAfterStep(TrainerCallback):
    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), self.signum)  # after loss.callback's check: the next step is the stop's


def test_handlers_a_raised_train_left_in_pass_to_the_next_train_without_its_request():
    """A `train()` that raised never reaches `on_train_end` (sentence-transformers' front end gives the handlers back
    there): the next run's callback takes them over, drops the old request and gives them back at its end."""
    before = signal.getsignal(signal.SIGTERM)
    raised_run, next_run = StopOnRequestCallback(), StopOnRequestCallback()
    raised_run.on_train_begin(None, None, None)  # ... and its train() raised
    signal.raise_signal(signal.SIGTERM)
    assert requested_signal() == signal.SIGTERM and signal.getsignal(signal.SIGTERM) is not before
    next_run.on_train_begin(None, None, None)
    assert requested_signal() is None  # the raised run's request does not stop this one
    next_run.on_train_end(None, None, None)
    assert signal.getsignal(signal.SIGTERM) is before


def test_sentence_transformers_trainer_stops_through_the_loss_callback_and_resumes_exactly(tiny_encoder, tmp_path,
                                                                                          capsys):
    setup = dict(max_steps=6, save_strategy="steps", save_steps=3, dataset=Dataset.from_dict(
        {"text": _long_sentences(64)}), loss_kwargs=dict(queue_size=20, queue_init_size=3, fgsm_epsilon=0.05),
        model_kwargs=dict(max_seq_length=8))
    full = make_st_trainer(tiny_encoder, tmp_path / "full", **setup)
    full.train()
    stopped = make_st_trainer(tiny_encoder, tmp_path / "run", callbacks=[SignalAfterStep(1, signal.SIGTERM)], **setup)
    with pytest.raises(StopRequested) as raised:
        stopped.train()
    checkpoint = tmp_path / "run" / "checkpoint-2"
    assert (raised.value.code, raised.value.step, raised.value.checkpoint) == (STOPPED_EXIT_STATUS, 2, str(checkpoint))
    assert stopped_line("SIGTERM", checkpoint, "trainer.train(resume_from_checkpoint=True)") in capsys.readouterr().out
    assert (checkpoint / "mocose_loss" / "state.pt").is_file() and (checkpoint / "mocose_loss" / "fgsm_rank0.pt").is_file()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are given back with train()
    resumed = make_st_trainer(tiny_encoder, tmp_path / "run", **setup)
    resumed.train(resume_from_checkpoint=True)
    assert _losses(resumed)[-4:] == _losses(full)[-4:]
    for name, tensor in resumed.loss.state_dict().items():
        assert torch.equal(tensor, full.loss.state_dict()[name]), name


# ----------------------------------------------------------------------------- launchers
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ONE_MACHINE = ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
TWO_PROCESSES = ["--multi_gpu", "--num_processes", "2", *ONE_MACHINE]


class Launch:
    """A launch whose output is read as it comes: `wait_for` a logged step, then signal it."""

    def __init__(self, command: list[str], new_session: bool = False, **env: str):
        self.proc = subprocess.Popen(command, env=subprocess_env(OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1", **env),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=new_session)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stdout.readline, "")))
        self._reader.start()

    def wait_for(self, text: str) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while not any(text in line for line in list(self.lines)):
            assert self.proc.poll() is None and time.monotonic() < deadline, "".join(self.lines)[-3000:]
            time.sleep(0.05)

    def training_processes(self) -> list[psutil.Process]:
        def trains(command: list[str]) -> bool:  # not a launcher, whose arguments name it too
            launchers = ("hf_mocose.commands.launch", "accelerate.commands.launch")
            return bool({"hf_mocose.commands.train", str(WORKER)} & set(command) and not set(launchers) & set(command))

        return [p for p in psutil.Process(self.proc.pid).children(recursive=True) if trains(p.cmdline())]

    def finish(self) -> subprocess.CompletedProcess:
        self.proc.wait(TIMEOUT_S)
        self._reader.join(TIMEOUT_S)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, "".join(self.lines), "")


def hf_mocose_train(encoder: str, out: Path, *launch_flags: str, new_session: bool = False) -> Launch:
    """`hf-mocose train` on a long run that saves no checkpoint by itself; returned once a step is logged."""
    argv = train_argv(encoder, out, "--save_steps", "1000", "--logging_steps", "1", steps=500)
    port = ["--main_process_port", str(_free_port())] if launch_flags else []
    launch = Launch([sys.executable, "-m", "hf_mocose.commands.cli", "train", *argv, *launch_flags, *port],
                    new_session=new_session)
    launch.wait_for("'loss'")
    return launch


def test_sigterm_to_hf_mocose_train_stops_its_process_with_a_checkpoint(tiny_encoder, tmp_path):
    launch = hf_mocose_train(tiny_encoder, tmp_path)
    training = launch.training_processes()
    launch.proc.send_signal(signal.SIGTERM)
    assert_stopped(launch.finish(), tmp_path, "SIGTERM")
    assert not any(p.is_running() for p in training)


@pytest.mark.multiprocess
def test_sigusr1_to_hf_mocose_train_stops_two_processes_at_one_step_without_a_traceback(tiny_encoder, tmp_path):
    launch = hf_mocose_train(tiny_encoder, tmp_path, *TWO_PROCESSES)
    training = launch.training_processes()
    assert len(training) == 2
    launch.proc.send_signal(signal.SIGUSR1)
    proc = launch.finish()
    checkpoint = assert_stopped(proc, tmp_path, "SIGUSR1", processes=2)
    assert sorted(p.name for p in checkpoint.glob("fgsm_rank*.pt")) == ["fgsm_rank0.pt", "fgsm_rank1.pt"]
    assert "Traceback" not in proc.stdout and "SignalException" not in proc.stdout
    assert not any(p.is_running() for p in training)


@pytest.mark.preemption
@pytest.mark.multiprocess
def test_sigterm_to_every_process_of_hf_mocose_train_as_slurm_sends_it(tiny_encoder, tmp_path):
    """The launcher, its child (torch elastic's agent) and both training processes get SIGTERM: the agent leaves
    it to hf-mocose (no SignalException, no SIGKILL 30 s later), the run stops with its checkpoint."""
    launch = hf_mocose_train(tiny_encoder, tmp_path, *TWO_PROCESSES)
    for process in [psutil.Process(launch.proc.pid), *psutil.Process(launch.proc.pid).children(recursive=True)]:
        process.send_signal(signal.SIGTERM)
    proc = launch.finish()
    assert_stopped(proc, tmp_path, "SIGTERM", processes=2)
    assert "SignalException" not in proc.stdout and "Traceback" not in proc.stdout


@pytest.mark.preemption
def test_ctrl_c_to_the_process_group_of_hf_mocose_train(tiny_encoder, tmp_path):
    launch = hf_mocose_train(tiny_encoder, tmp_path, new_session=True)
    os.killpg(launch.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    proc = launch.finish()
    assert_stopped(proc, tmp_path, "SIGINT")
    assert "KeyboardInterrupt" not in proc.stdout


@pytest.mark.preemption
def test_sigkill_of_hf_mocose_train_still_saves_and_frees_the_folder(tiny_encoder, tmp_path):
    """The launcher's child gets SIGTERM from the kernel and forwards it: the training process saves, exits and
    releases the run folder's lock (a new run may take it)."""
    from hf_mocose.launch.run_folder import lock_run_folder, release_run_folder

    launch = hf_mocose_train(tiny_encoder, tmp_path)
    training = launch.training_processes()
    launch.proc.kill()
    assert launch.finish().returncode == -signal.SIGKILL
    psutil.wait_procs(training, timeout=TIMEOUT_S)
    checkpoints = list(tmp_path.glob("checkpoint-*"))
    assert len(checkpoints) == 1 and checkpoint_problems(checkpoints[0]) == []
    lock_run_folder(str(tmp_path))
    release_run_folder(str(tmp_path))


@pytest.mark.preemption
@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_plain_accelerate_launch_killed_by_a_signal_leaves_a_checkpoint(signum, tiny_encoder, tmp_path):
    """One process: accelerate's launcher dies of the signal (SIGUSR1's default action, SIGTERM's); its training
    process follows its death (PR_SET_PDEATHSIG) with a stop request."""
    argv = train_argv(tiny_encoder, tmp_path, "--save_steps", "1000", "--logging_steps", "1", steps=500)
    launch = Launch([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", *ONE_MACHINE,
                     str(WORKER), *argv])
    launch.wait_for("'loss'")
    training = launch.training_processes()
    launch.proc.send_signal(signum)
    launch.finish()
    psutil.wait_procs(training, timeout=TIMEOUT_S)
    assert "Stopped on request (SIGTERM)" in "".join(launch.lines)
    checkpoints = list(tmp_path.glob("checkpoint-*"))
    assert len(checkpoints) == 1 and checkpoint_problems(checkpoints[0]) == []


@pytest.mark.preemption
@pytest.mark.multiprocess
def test_sigterm_to_plain_accelerate_launch_of_two_processes_leaves_a_checkpoint(tiny_encoder, tmp_path):
    """torch elastic's agent sends the workers SIGTERM itself: they save within its 30 s."""
    argv = train_argv(tiny_encoder, tmp_path, "--save_steps", "1000", "--logging_steps", "1", steps=500)
    launch = Launch([sys.executable, "-m", "accelerate.commands.launch", *TWO_PROCESSES, "--main_process_port",
                     str(_free_port()), str(WORKER), *argv])
    launch.wait_for("'loss'")
    launch.proc.send_signal(signal.SIGTERM)
    launch.finish()
    checkpoints = list(tmp_path.glob("checkpoint-*"))
    assert len(checkpoints) == 1 and checkpoint_problems(checkpoints[0]) == []
    assert len(list(checkpoints[0].glob("rng_state_*.pth"))) == 2


@pytest.mark.preemption
@pytest.mark.multiprocess
def test_one_rank_signalled_stops_both_at_one_step_and_the_resume_is_bit_identical(tiny_encoder, tmp_path):
    """Rank 1 alone gets SIGTERM as step 3 begins (rank 0 never does): both save checkpoint-3 and stop; resumed
    under two processes, the final weights equal an uninterrupted two-process run's."""
    def two(out: Path, *extra: str, **env: str) -> Launch:
        argv = train_argv(tiny_encoder, out, *extra)
        return Launch([sys.executable, "-m", "accelerate.commands.launch", *TWO_PROCESSES, "--main_process_port",
                       str(_free_port()), str(WORKER), *argv], **env)

    reference = two(tmp_path / "reference").finish()
    assert reference.returncode == 0, reference.stdout[-3000:]
    stopped = two(tmp_path / "run", STOP_AT_STEP="1:2:SIGTERM").finish()
    assert [line for line in stopped.stdout.splitlines() if line.startswith("Stopped on request")] == [
        stopped_line("SIGTERM", tmp_path / "run" / "checkpoint-3")]
    assert not (tmp_path / "run" / "final").exists()
    resumed = two(tmp_path / "run", "--resume_from_checkpoint", "last").finish()
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert_same_weights(final_weights(tmp_path / "run"), final_weights(tmp_path / "reference"))


@pytest.mark.preemption
@needs_senteval
def test_a_signal_during_an_evaluation_stops_after_the_next_step(tiny_encoder, tmp_path):
    dev = SENTEVAL_DIR / "STS" / "STSBenchmark" / "sts-dev.csv"
    proc = run_worker(tiny_encoder, tmp_path, "--eval_strategy", "steps", "--eval_steps", "2", "--stsb_dev_file",
                      str(dev), STOP_IN_EVALUATION="2:SIGTERM")
    assert_stopped(proc, tmp_path, "SIGTERM", step=3)

"""SLURM: the shipped job script (`hf_mocose/launch/mocose.sbatch`) submitted to a two-host cluster on this machine.

    python -m pytest -q -m slurm      # as root, with Debian's slurm-wlm and munge (deselected from the default run)

`tests/slurm_cluster.sh` brings the cluster up: two network namespaces with their own addresses, hostnames and
`slurmd`, one `slurmctld` (docs/distributed.md, "SLURM"). Each job is 2 nodes x 2 processes on the CPU (gloo), a
tiny random BERT, a checkpoint every 2 steps, into a folder of this machine's file system (the stand-in for a cluster
file system). Checked: one run of 4 processes and one export; a second job into the same folder waits (singleton) and
is then refused, not mixed in; a node whose processes are killed mid-run fails the job at once, which is requeued
and resumes to the weights an uninterrupted run ends with (up to the all-reduce's summation order); a job whose time
limit comes before its run ends is warned (SIGUSR1), saves, requeues itself without counting a failure and ends
with the same weights; `scancel` ends a job for good, leaving its checkpoint. Not a real network, no GPU, no NCCL.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from safetensors.torch import load_file

pytestmark = pytest.mark.slurm
CLUSTER = REPO_ROOT / "tests" / "slurm_cluster.sh"
SCRIPT = REPO_ROOT / "hf_mocose" / "launch" / "mocose.sbatch"
NODES, PROCESSES_PER_NODE, PER_DEVICE, QUEUE_INIT, STEPS = 2, 2, 4, 8, 24
WORLD = NODES * PROCESSES_PER_NODE
TRAINING = ("--max_steps", str(STEPS), "--save_steps", "2", "--logging_steps", "1", "--per_device_train_batch_size",
            str(PER_DEVICE), "--queue_size", "1024", "--queue_init_size", str(QUEUE_INIT), "--use_cpu", "true",
            "--disable_tqdm", "true", "--bf16", "false")  # fp32: bf16 autocast rounds the resumed run's keys apart
EXPORT_LINE = "Saved the sentence-transformers export (with its model card) to "
# tests/slurm_hooks/sitecustomize.py: each training step of a job's first run sleeps this long first.
SLOW_STEPS = {"PYTHONPATH": str(REPO_ROOT / "tests" / "slurm_hooks")}


def slurm(*command: str, **kwargs) -> subprocess.CompletedProcess:
    """`command` where the controller is (its network namespace)."""
    return subprocess.run([str(CLUSTER), "exec", *command], capture_output=True, text=True, timeout=60, **kwargs)


@pytest.fixture(scope="module")
def cluster():
    if os.geteuid() != 0:
        pytest.skip("the SLURM cluster needs root (network namespaces, slurmd): run as root")
    missing = [tool for tool in ("slurmctld", "slurmd", "sbatch", "munged", "ip", "nsenter") if not shutil.which(tool)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not found: apt-get install -y slurm-wlm munge")
    up = subprocess.run([str(CLUSTER), "up"], capture_output=True, text=True, timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    yield
    subprocess.run([str(CLUSTER), "down"], capture_output=True, timeout=120)


def submit(workdir: Path, folder: str, encoder: str, *extra: str, **environment: str) -> int:
    """`bash mocose.sbatch` (which submits itself) for a run into `workdir/folder`, with `environment` added; the
    job's id. Its log is `workdir/folder.log`; no GPUs asked for (SBATCH_GPUS_PER_NODE wins over the file's #SBATCH
    line)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
           "SBATCH_GPUS_PER_NODE": "0", "SBATCH_OUTPUT": str(workdir / f"{folder}.log"), "MOCOSE_RECIPE": "quickstart",
           "MOCOSE_OUTPUT_DIR": folder, "MOCOSE_PROCESSES_PER_NODE": str(PROCESSES_PER_NODE), **environment}
    return submitted_job(slurm("bash", str(SCRIPT), "--model_name_or_path", encoder, *TRAINING, *extra, cwd=workdir,
                               env=env))


def submitted_job(submitted: subprocess.CompletedProcess) -> int:
    """The job id `sbatch` printed."""
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    return int(re.fullmatch(r"Submitted batch job (\d+)\n", submitted.stdout).group(1))


def job(job_id: int) -> dict[str, str]:
    """`scontrol show job`'s fields (JobState, Reason, ExitCode, Restarts, JobName, ...)."""
    shown = slurm("scontrol", "show", "job", "-o", str(job_id)).stdout
    return dict(re.findall(r"(\w+)=(\S*)", shown))


def wait_for(condition, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(poll)
    raise AssertionError(f"{what}: not within {timeout} s")


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")


def wait_until_ended(job_id: int, timeout: float = 300) -> dict[str, str]:
    return wait_for(lambda: (state := job(job_id)).get("JobState") in ENDED and state, timeout, f"job {job_id} ended")


def final_weights(output_dir: Path) -> dict:
    return load_file(output_dir / "final" / "model.safetensors")


@pytest.fixture(scope="module")
def first_run(cluster, tmp_path_factory, tiny_encoder):
    """The reference run, and a second job submitted into its folder while it runs (with what squeue said of it)."""
    workdir = tmp_path_factory.mktemp("slurm")
    first = submit(workdir, "run", tiny_encoder)
    wait_for(lambda: job(first).get("JobState") == "RUNNING", 120, f"job {first} running")
    second = submit(workdir, "run", tiny_encoder)
    waiting, first_then = job(second), job(first)["JobState"]
    # The lost node's and the stopped jobs (below) run beside the other tests: most of their time is SLURM's to wait
    # for (a time-limit check every 30 s, 11 s before a requeued job starts).
    background = ThreadPoolExecutor(2)
    lost, stopped = (background.submit(chain, workdir, tiny_encoder) for chain in (lose_a_node, stop_two_jobs))
    return {"workdir": workdir, "first": wait_until_ended(first), "second": second, "second_waiting": waiting,
            "first_state_then": first_then, "lost": lost, "stopped": stopped}


def test_two_nodes_of_two_processes_train_one_run_and_export_once(first_run):
    workdir, state = first_run["workdir"], first_run["first"]
    log = (workdir / "run.log").read_text()
    assert state["JobState"] == "COMPLETED" and state["NumNodes"] == str(NODES), (state, log[-3000:])
    assert f"{NODES} nodes x {PROCESSES_PER_NODE} processes, main process at node1:" in log
    output_dir = workdir / "run"
    trainer_state = json.loads((output_dir / "trainer_state.json").read_text())
    assert trainer_state["global_step"] == STEPS
    # One queue of every rank's keys: each step enqueues the 4 processes' batches.
    fills = [entry["queue_fill"] for entry in trainer_state["log_history"] if "queue_fill" in entry]
    assert fills == [QUEUE_INIT + step * PER_DEVICE * WORLD for step in range(1, STEPS + 1)]
    newest = output_dir / f"checkpoint-{STEPS}"
    assert {f"rng_state_{rank}.pth" for rank in range(WORLD)} <= {path.name for path in newest.iterdir()}
    assert not (newest / f"rng_state_{WORLD}.pth").exists()
    # The export, written once (by the main process on node1).
    assert log.count(EXPORT_LINE) == 1 and (output_dir / "sentence-transformers" / "modules.json").is_file()


def test_a_second_job_into_the_same_folder_waits_then_is_refused(first_run):
    waiting, second = first_run["second_waiting"], first_run["second"]
    # While the first ran, the second was held by --dependency=singleton (the same job name: the folder's).
    assert first_run["first_state_then"] == "RUNNING"
    assert (waiting["JobState"], waiting["Reason"]) == ("PENDING", "Dependency"), waiting
    assert waiting["JobName"] == f"hf-mocose:{first_run['workdir'] / 'run'}"
    # Then it started, found the finished run's checkpoints and was refused in one line, without a requeue.
    state = wait_until_ended(second)
    log = (first_run["workdir"] / "run.log").read_text()
    assert (state["JobState"], state["ExitCode"], state["Restarts"]) == ("FAILED", "2:0", "0"), state
    assert "holds another run's checkpoints" in log and "requeued" not in log
    assert json.loads((first_run["workdir"] / "run" / "trainer_state.json").read_text())["global_step"] == STEPS


def test_a_job_under_another_name_is_refused(cluster, tmp_path):
    env = {**os.environ, "SBATCH_GPUS_PER_NODE": "0", "SBATCH_OUTPUT": str(tmp_path / "named.log"),
           "MOCOSE_OUTPUT_DIR": str(tmp_path / "out")}
    job_id = submitted_job(slurm("sbatch", str(SCRIPT), cwd=tmp_path, env=env))  # the file's own name, hf-mocose
    state = wait_until_ended(job_id, 60)
    assert (state["JobState"], state["ExitCode"]) == ("FAILED", "2:0"), state
    assert (tmp_path / "named.log").read_text() == (
        f"mocose.sbatch: job name 'hf-mocose' is not 'hf-mocose:{tmp_path}/out', so --dependency=singleton cannot keep "
        f"a second job out of {tmp_path}/out: submit with 'MOCOSE_OUTPUT_DIR={tmp_path}/out bash mocose.sbatch' or "
        f"sbatch --job-name='hf-mocose:{tmp_path}/out'.\n")


def node_training_processes(node: str, output_dir: Path) -> list[int]:
    """The training processes (not the launchers) of the run into `output_dir` on `node`."""
    listed = subprocess.run(["ip", "netns", "pids", f"mocose-{node}"], capture_output=True, text=True).stdout.split()
    found = []
    for pid in map(int, listed):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:  # ended meanwhile
            continue
        if b"-m hf_mocose.commands.train " in command and f" {output_dir} ".encode() in command:
            found.append(pid)
    return found


def lose_a_node(workdir: Path, tiny_encoder: str) -> dict:
    """A job whose node2 loses its training processes (SIGKILL) once checkpoint-4 is begun: what was killed, the
    processes left once the job was requeued, its end state and log."""
    lost = submit(workdir, "lost", tiny_encoder)
    # After a complete checkpoint (checkpoint-2 is whole once checkpoint-4 is begun), node2's processes die.
    wait_for(lambda: (workdir / "lost" / "checkpoint-4").exists(), 240, "checkpoint-4", poll=0.05)
    killed = node_training_processes("node2", workdir / "lost")
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    # The job fails at once (srun --kill-on-bad-exit ends node1's processes) and requeues itself.
    requeued = wait_for(lambda: (state := job(lost))["Restarts"] == "1" and state["JobState"] == "PENDING" and state,
                        60, f"job {lost} requeued")
    left = [pid for node in ("node1", "node2") for pid in node_training_processes(node, workdir / "lost")]
    # SLURM starts it again by itself, cred_expire + 1 s later (tests/slurm_cluster.sh sets 10 s; 120 by default).
    return {"killed": killed, "requeued": requeued, "left": left, "state": wait_until_ended(lost),
            "log": (workdir / "lost.log").read_text()}


def test_a_lost_node_fails_the_job_which_is_requeued_and_resumes_to_the_same_weights(first_run):
    workdir, lost = first_run["workdir"], first_run["lost"].result(timeout=600)
    assert len(lost["killed"]) == PROCESSES_PER_NODE, lost["killed"]
    assert not lost["left"], lost["requeued"]
    state, log = lost["state"], lost["log"]
    assert (state["JobState"], state["Restarts"]) == ("COMPLETED", "1"), (state, log[-3000:])
    assert "requeued (restart 1 of 3) to resume from the newest complete checkpoint" in log
    assert re.search(r"resuming from \S*/lost/checkpoint-(\d+), the newest complete checkpoint", log), log[-3000:]
    assert log.count(EXPORT_LINE) == 1
    # The resumed run ends where the uninterrupted one did, up to float summation order: DDP rebuilds its gradient
    # buckets after a run's first step, so the restart's first all-reduce sums 4 processes' gradients in another
    # order; AdamW, on gradients near 0 (attention key biases), grows that to ~7e-6 by step 24 (docs/distributed.md,
    # "Why not bit for bit"). 2 processes sum commutatively: exact (tests/test_distributed.py).
    resumed, uninterrupted = final_weights(workdir / "lost"), final_weights(workdir / "run")
    assert resumed.keys() == uninterrupted.keys()
    for name, weight in uninterrupted.items():
        assert (resumed[name] - weight).abs().max() <= 1e-4, name


def stop_two_jobs(workdir: Path, tiny_encoder: str) -> dict[str, dict]:
    """Two jobs at once, their first runs slowed (tests/slurm_hooks): "timed", a 10 minute job whose limit is cut to
    5 minutes once checkpoint-2 is written, with no requeue after a failure (MOCOSE_MAX_RESTARTS=0), and "cancelled",
    scancel-ed once checkpoint-2 is written. Their end states, logs and folders."""
    timed = submit(workdir, "timed", tiny_encoder, SBATCH_TIMELIMIT="10", MOCOSE_MAX_RESTARTS="0",
                   MOCOSE_TEST_STEP_SECONDS="2", **SLOW_STEPS)
    cancelled = submit(workdir, "cancelled", tiny_encoder, MOCOSE_TEST_STEP_SECONDS="1", **SLOW_STEPS)
    jobs = {"timed": timed, "cancelled": cancelled}
    written = {name: workdir / name / "checkpoint-2" / "trainer_state.json" for name in jobs}
    to_do, deadline = ["limit", "cancel", "restore"], time.monotonic() + 300
    while to_do:
        states = {name: job(job_id) for name, job_id in jobs.items()}
        waited_on = {"timed": "restore" in to_do, "cancelled": "cancel" in to_do}  # a job that may not end yet
        early = [name for name, state in states.items() if state["JobState"] in ENDED and waited_on[name]]
        assert not early and time.monotonic() < deadline, (early, to_do, states)
        if "limit" in to_do and written["timed"].exists():
            # 300 s left: the script's `--signal=B:USR1@300` is due, and SLURM sends it at its next time-limit check
            # (every 30 s) while the run trains on.
            assert slurm("scontrol", "update", f"JobId={timed}", "TimeLimit=5").returncode == 0
            to_do.remove("limit")
        if "cancel" in to_do and written["cancelled"].exists():  # SIGTERM to the script and every process
            assert slurm("scancel", str(cancelled)).returncode == 0
            to_do.remove("cancel")
        if "restore" in to_do and states["timed"]["Restarts"] == "1":
            # The requeued job starts with the limit it was submitted with (else its warning would be due at once).
            assert slurm("scontrol", "update", f"JobId={timed}", "TimeLimit=10").returncode == 0
            to_do.remove("restore")
        time.sleep(0.2)
    return {name: {"state": wait_until_ended(job_id), "log": (workdir / f"{name}.log").read_text(),
                   "output_dir": workdir / name} for name, job_id in jobs.items()}


def test_a_time_limit_stops_the_job_which_saves_requeues_and_resumes_to_the_same_weights(first_run):
    state, log, output_dir = first_run["stopped"].result(timeout=600)["timed"].values()
    assert (state["JobState"], state["Restarts"]) == ("COMPLETED", "1"), (state, log[-3000:])
    stopped = re.search(r"Stopped on request \(SIGUSR1\) at step (\d+): (\S+) is complete; resume with "
                        r"--resume_from_checkpoint last \(exit status 75\)\.", log)
    assert stopped and 2 <= int(stopped[1]) < STEPS, log[-3000:]
    assert stopped[2] == str(output_dir / f"checkpoint-{stopped[1]}")
    assert ("the run stopped before the time limit (SIGUSR1) and saved: requeued to resume from the newest complete "
            f"checkpoint in {output_dir} (not counted against MOCOSE_MAX_RESTARTS).") in log
    assert f"resuming from {stopped[2]}, the newest complete checkpoint" in log and "run failed" not in log
    assert log.count(EXPORT_LINE) == 1 and not list(output_dir.glob(".hf-mocose-slurm-job-*.failures"))
    resumed, uninterrupted = final_weights(output_dir), final_weights(first_run["workdir"] / "run")
    assert resumed.keys() == uninterrupted.keys()
    for name, weight in uninterrupted.items():  # within the lost node's tolerance (above)
        assert (resumed[name] - weight).abs().max() <= 1e-4, name


def test_scancel_ends_a_job_for_good_and_leaves_its_checkpoint(first_run):
    from hf_mocose.launch.checkpoints import checkpoint_problems

    state, log, output_dir = first_run["stopped"].result(timeout=600)["cancelled"].values()
    assert (state["JobState"], state["Restarts"]) == ("CANCELLED", "0"), (state, log[-3000:])
    stopped = re.search(r"Stopped on request \(SIGTERM\) at step (\d+): (\S+) is complete", log)
    assert stopped and stopped[2] == str(output_dir / f"checkpoint-{stopped[1]}"), log[-3000:]
    assert not checkpoint_problems(stopped[2]) and not (output_dir / "final").exists()
    assert "requeued to resume" not in log

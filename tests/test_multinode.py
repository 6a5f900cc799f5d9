"""Several machines: two "machines" on localhost, each `hf-mocose train` with `--num_machines 2` and one process, gloo.

    hf-mocose train quickstart --multi_gpu --num_machines 2 --machine_rank R --num_processes 2 \
        --main_process_ip 127.0.0.1 --main_process_port P ... --use_cpu true

Checked: one run (both machines' keys in one queue), both ranks' state in every checkpoint, the export written once.
Each machine runs in its own folder with the same relative `--output_dir` for node-local disks, in one folder for
shared storage (docs/distributed.md, "Several machines"). Not a real network: no NCCL, no second host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
from conftest import free_port

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
PER_DEVICE, QUEUE_INIT, STEPS = 4, 8, 2
SAVED = ("Saved the final MoCoSE checkpoint to out/final",
         "Saved the sentence-transformers export (with its model card) to out/sentence-transformers")
# Written once per checkpoint by the process that saves (the main process, or each machine's with save_on_each_node).
WEIGHTS_ON_EACH_NODE = int(transformers.__version__.split(".")[0]) < 5
WHOLE = {"config.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", "training_args.bin"}


def rank_files(rank: int) -> set[str]:
    """What every process writes into every checkpoint itself: its RNG state and FGSM's "previous" gradient."""
    return {f"rng_state_{rank}.pth", f"fgsm_rank{rank}.pt"}


def launch_two_machines(tmp_path: Path, encoder: str, folders: tuple[str, str], extra: tuple[str, ...] = ()):
    """Starts machine 0 and machine 1 (one process each) at once and waits for both; their stdouts."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    machines = []
    for rank, folder in enumerate(folders):
        (tmp_path / folder).mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "hf_mocose.commands.cli", "train", "quickstart", "--multi_gpu", "--num_machines",
               "2", "--machine_rank", str(rank), "--num_processes", "2", "--main_process_ip", "127.0.0.1",
               "--main_process_port", str(port), "--model_name_or_path", encoder, "--output_dir", "out",
               "--max_steps", str(STEPS), "--save_steps", "1", "--logging_steps", "1", "--per_device_train_batch_size",
               str(PER_DEVICE), "--queue_size", "64", "--queue_init_size", str(QUEUE_INIT), "--use_cpu", "true",
               "--disable_tqdm", "true", *extra]
        machines.append(subprocess.Popen(cmd, cwd=tmp_path / folder, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True))
    results = [machine.communicate(timeout=900) for machine in machines]
    for machine, (out, err) in zip(machines, results):
        assert machine.returncode == 0 and "Traceback" not in err, f"{out[-2000:]}\n{err[-6000:]}"
    return [out for out, _ in results]


def checkpoint_files(output_dir: Path) -> dict[str, set[str]]:
    return {folder.name: {path.name for path in folder.iterdir()} for folder in sorted(output_dir.glob("checkpoint-*"))}


@pytest.mark.parametrize("storage", ["shared", "node-local", "node-local, save_on_each_node"])
def test_two_machines_train_one_run(storage, tiny_encoder, tmp_path):
    shared = storage == "shared"
    on_each_node = storage.endswith("save_on_each_node")
    folders = ("shared", "shared") if shared else ("machine0", "machine1")
    extra = ("--save_on_each_node", "true") if on_each_node else ()
    stdouts = launch_two_machines(tmp_path, tiny_encoder, folders, extra)
    node0, node1 = (tmp_path / folder / "out" for folder in folders)

    # One run: the main process (machine 0) speaks, and the queue holds both machines' keys of every step.
    assert all(line in stdouts[0].splitlines() for line in SAVED) and not any(line in stdouts[1] for line in SAVED)
    state = json.loads((node0 / "trainer_state.json").read_text())
    assert state["global_step"] == STEPS
    fills = [entry["queue_fill"] for entry in state["log_history"] if "queue_fill" in entry]
    assert fills == [QUEUE_INIT + step * PER_DEVICE * 2 for step in range(1, STEPS + 1)]

    # Both ranks' state in every checkpoint, on the storage each machine writes to.
    checkpoints = ["checkpoint-1", "checkpoint-2"]
    first, second = checkpoint_files(node0), checkpoint_files(node1)
    assert list(first) == list(second) == checkpoints
    for name in checkpoints:
        if shared:
            assert WHOLE | rank_files(0) | rank_files(1) <= first[name], sorted(first[name])
            continue
        assert WHOLE | rank_files(0) <= first[name] and not rank_files(1) & first[name], sorted(first[name])
        if on_each_node:  # machine 1's disk holds the checkpoint too, with its own rank's state, but the weights
            # and config only where transformers' save_pretrained honours is_main_process (< 5; 5 writes on rank 0 only)
            expected = WHOLE - (set() if WEIGHTS_ON_EACH_NODE else {"config.json", "model.safetensors"})
            assert expected | rank_files(1) <= second[name] and not rank_files(0) & second[name], sorted(second[name])
            assert WEIGHTS_ON_EACH_NODE or not {"config.json", "model.safetensors"} & second[name]
        else:  # only its own rank's files: not a checkpoint machine 1 can resume from
            assert second[name] == rank_files(1)

    # The final model where the saving processes write; the export written once, by the main process.
    assert (node0 / "sentence-transformers" / "modules.json").is_file() and (node0 / "final" / "config.json").is_file()
    if not shared:
        assert not (node1 / "sentence-transformers").exists()
        assert (node1 / "final" / "training_args.bin").is_file() == on_each_node
        assert (node1 / "final" / "config.json").is_file() == (on_each_node and WEIGHTS_ON_EACH_NODE)

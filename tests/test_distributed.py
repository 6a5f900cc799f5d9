"""Two CPU processes (DDP over gloo) through `accelerate launch`, compared with one process.

On CPU, `accelerate launch --cpu --num_processes 2` silently starts ONE process; `--multi_gpu`
with `use_cpu` starts two. Assertions read what each rank wrote (a rare SIGABRT at interpreter
exit after correct output has been seen, so the exit code alone is not trusted).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("ddp_worker.py")
ST_WORKER = Path(__file__).with_name("st_ddp_worker.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args, n_proc, worker=WORKER, dynamo_backend="no", **extra_env) -> subprocess.CompletedProcess:
    """`worker` with `args` in one process, or in two under `accelerate launch`."""
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra_env}
    if n_proc == 1:
        cmd = [sys.executable, str(worker), *args]
    else:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", dynamo_backend,
               "--main_process_port", str(_free_port()), str(worker), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _run(args, n_proc, out_dir, worker=WORKER, dynamo_backend="no", **extra_env):
    proc = _launch(args, n_proc, worker, dynamo_backend, **extra_env)
    results = [torch.load(out_dir / f"rank{r}.pt") for r in range(n_proc) if (out_dir / f"rank{r}.pt").is_file()]
    assert len(results) == n_proc, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return results


def _assert_states_close(a, b, atol):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name].float(), b[name].float(), atol=atol), name


@pytest.fixture(scope="module")
def runs(tiny_encoder, tmp_path_factory):
    two = tmp_path_factory.mktemp("two")
    one = tmp_path_factory.mktemp("one")
    return {
        "two": _run([tiny_encoder, str(two), "4", "4"], 2, two),
        "one": _run([tiny_encoder, str(one), "8", "4"], 1, one),
        "two_dir": two,
    }


def test_two_processes_started(runs):
    assert [r["world_size"] for r in runs["two"]] == [2, 2]


def test_ranks_hold_identical_targets_and_queues(runs):
    rank0, rank1 = (r["state"] for r in runs["two"])
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    assert int(rank0["queue.queue_fill"]) == 4 + 4 * 8  # K_s + steps x global batch: both ranks' keys


def test_two_processes_match_one_process_with_same_global_batch(runs):
    _assert_states_close(runs["two"][0]["state"], runs["one"][0]["state"], atol=1e-5)
    assert runs["two"][0]["losses"] == pytest.approx(runs["one"][0]["losses"], abs=1e-5)


def test_resume_in_two_processes(runs, tiny_encoder, tmp_path):
    checkpoint = runs["two_dir"] / "checkpoint-2"
    assert checkpoint.is_dir()
    resumed = _run([tiny_encoder, str(tmp_path), "4", "4", str(checkpoint)], 2, tmp_path)
    _assert_states_close(resumed[0]["state"], runs["two"][0]["state"], atol=1e-6)
    assert resumed[0]["losses"][-2:] == pytest.approx(runs["two"][0]["losses"][-2:], abs=1e-6)


@pytest.mark.parametrize("fgsm_mode", ["previous", "exact"])
def test_resume_in_two_processes_with_fgsm(fgsm_mode, tiny_encoder, tmp_path):
    """FGSM on (epsilon large enough to change the losses): each rank's "previous" gradient travels in the
    checkpoint and is loaded back on every rank's device ("cpu:0" under DDP on CPU)."""
    options = json.dumps({"fgsm_mode": fgsm_mode, "fgsm_epsilon": 0.05})
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    full.mkdir()
    resumed.mkdir()
    full_runs = _run([tiny_encoder, str(full), "4", "4", "-", "mocose", options], 2, full)
    checkpoint = full / "checkpoint-2"
    has_state = [(checkpoint / f"fgsm_rank{rank}.pt").is_file() for rank in (0, 1)]
    assert has_state == [fgsm_mode == "previous"] * 2
    resumed_runs = _run([tiny_encoder, str(resumed), "4", "4", str(checkpoint), "mocose", options], 2, resumed)
    for runs in (full_runs, resumed_runs):  # DDP kept the ranks equal (the embeddings are looked up outside forward)
        for name, tensor in runs[0]["state"].items():
            assert torch.equal(tensor, runs[1]["state"][name]), name
    _assert_states_close(resumed_runs[0]["state"], full_runs[0]["state"], atol=1e-6)
    assert resumed_runs[0]["losses"][-2:] == pytest.approx(full_runs[0]["losses"][-2:], abs=1e-6)


def test_a_checkpoint_is_marked_complete_only_after_every_process_wrote_its_rng_state(tiny_encoder, tmp_path):
    """trainer_state.json (rank 0's, written last) marks a checkpoint complete for `--resume_from_checkpoint last`:
    rank 1 writing its RNG state 1.5 s late must still come first (a node lost in between otherwise left a
    "complete" checkpoint without that node's RNG states: tests/test_slurm.py's resume drifted)."""
    options = json.dumps({"slow_rank1_rng_save": 1.5})
    results = _run([tiny_encoder, str(tmp_path), "4", "4", "-", "mocose", options], 2, tmp_path)
    assert results[0]["rng_files_when_marked"] == [["rng_state_0.pth", "rng_state_1.pth"]] * 2


def test_ddp_find_unused_parameters_under_fgsm_previous_is_refused_in_one_line(tiny_encoder, tmp_path):
    options = json.dumps({"fgsm_mode": "previous", "ddp_find_unused_parameters": True})
    proc = _launch([tiny_encoder, str(tmp_path), "4", "2", "-", "mocose", options], 2)
    assert proc.returncode != 0
    assert "ValueError: ddp_find_unused_parameters=True: DDP then hands the loss copies" in proc.stderr, proc.stderr[-3000:]
    assert "'NoneType' object has no attribute 'detach'" not in proc.stderr
    assert not list(tmp_path.glob("checkpoint-*"))


def _two_vs_one(tiny_encoder, tmp_path, steps, method, options=None, loss_rel=None):
    """Trains 2 processes x 4 sentences and 1 process x 8 with the same settings: they must agree (the losses to
    1e-5, or to `loss_rel` of their size where a loss sums several terms)."""
    extra = [json.dumps(options)] if options else []
    two, one = tmp_path / "two", tmp_path / "one"
    two.mkdir()
    one.mkdir()
    two_runs = _run([tiny_encoder, str(two), "4", str(steps), "-", method, *extra], 2, two)
    one_run = _run([tiny_encoder, str(one), "8", str(steps), "-", method, *extra], 1, one)
    _assert_states_close(two_runs[0]["state"], one_run[0]["state"], atol=1e-5)
    assert two_runs[0]["losses"] == pytest.approx(one_run[0]["losses"], abs=1e-5, rel=loss_rel)


def test_simcse_gathers_second_views_with_gradient(tiny_encoder, tmp_path):
    """SimCSE mode's in-batch negatives come from all ranks, with gradient: 2 x 4 equals 1 x 8."""
    _two_vs_one(tiny_encoder, tmp_path, 3, "simcse")


def test_ifcl_without_in_batch_negatives_with_fraternal_view(tiny_encoder, tmp_path):
    """IFCL, in_batch_negatives false: l_F pairs each anchor with its own fraternal view on every rank."""
    from conftest import build_tiny_encoder

    fraternal = build_tiny_encoder(tmp_path / "fraternal", model_type="distilbert", seed=1)
    _two_vs_one(tiny_encoder, tmp_path, 3, "ifcl", {"in_batch_negatives": False, "queue_init_size": 0,
                                                    "fraternal_encoder": fraternal})


def test_una_as_in_its_paper(tiny_encoder, tmp_path):
    """UNA sentences as anchors: each is matched with its own key (rank offsets) and sits in every denominator."""
    _two_vs_one(tiny_encoder, tmp_path, 3, "mocose", {"reversed_una": True, "una_frequency": 2, "una_usage": "paper"})


@pytest.mark.parametrize("method", ["mocose", "simcse"])
def test_matryoshka_cuts_the_other_processes_keys_as_the_local_ones(tiny_encoder, tmp_path, method):
    """matryoshka_dims: every width's InfoNCE sees the gathered keys (SimCSE mode: the gathered second views, with
    gradient) cut as the local ones; 2 x 4 equals 1 x 8 only if they are (weights give each width its own scale; the
    loss, a sum of three terms near 8.5, was seen 1.4e-5 apart in float32: a relative 1.7e-6)."""
    _two_vs_one(tiny_encoder, tmp_path, 3, method, {"matryoshka_dims": [32, 16, 8], "matryoshka_weights": [1, 2, 4]},
                loss_rel=1e-5)


# ----------------------------------------------------------------- MoCoSELoss under SentenceTransformerTrainer
# 4 optimizer steps of 2 micro-batches, max_grad_norm 1.0 (the tiny model's gradients are larger: every step clips).
ST_SETTINGS = ["4", "2", "1.0"]  # MAX_STEPS ACCUMULATION MAX_GRAD_NORM


@pytest.fixture(scope="module")
def st_runs(tiny_encoder, tmp_path_factory):
    two, one, raw = (tmp_path_factory.mktemp(name) for name in ("st_two", "st_one", "st_raw"))
    return {
        "two": _run([tiny_encoder, str(two), "4", *ST_SETTINGS], 2, two, worker=ST_WORKER),
        "one": _run([tiny_encoder, str(one), "8", *ST_SETTINGS], 1, one, worker=ST_WORKER),
        "raw": _run([tiny_encoder, str(raw), "8", "1", "2", "0"], 1, raw, worker=ST_WORKER),  # step 1, no clip
        "two_dir": two,
    }


def _norm(grads, prefix=""):
    return torch.linalg.vector_norm(torch.stack([g.norm() for k, g in grads.items() if k.startswith(prefix)])).item()


def test_st_loss_ranks_hold_identical_targets_queues_and_heads(st_runs):
    rank0, rank1 = st_runs["two"]
    assert [rank0["world_size"], rank1["world_size"]] == [2, 2]
    for name in rank0["state"]:
        assert torch.equal(rank0["state"][name], rank1["state"][name]), name
    assert int(rank0["state"]["queue.queue_fill"]) == 4 + 4 * 2 * 8  # K_s + micro-batches x global batch


def test_st_loss_head_gradients_are_averaged_once_per_optimizer_step(st_runs):
    """One all-reduce of the heads per optimizer step (not per micro-batch), and then equal on both ranks."""
    rank0, rank1, single = st_runs["two"][0], st_runs["two"][1], st_runs["one"][0]
    assert rank0["head_reductions"] == rank1["head_reductions"] == 4 and single["head_reductions"] == 0
    # The only Python-level all-reduces: the heads' (one per step), the step metrics' (one per logging step) and the
    # stop request's flag (one per step but the last, after which a request lets the run finish: launch.stop_request).
    assert rank0["all_reduces"] == rank1["all_reduces"] == 4 + rank0["logged_steps"] + (4 - 1)
    assert rank0["logged_steps"] == 4
    for step0, step1 in zip(rank0["grads"], rank1["grads"]):
        for name in step0:
            assert torch.equal(step0[name], step1[name]), name


def test_st_loss_clips_heads_with_the_model_as_mocose_trainer_does(st_runs):
    """2 x 4 equals 1 x 8 under accumulation and clipping, step by step; and step 1 equals the unclipped
    gradients x max_grad_norm / (joint norm of model and heads + 1e-6), the clip MoCoSETrainer applies."""
    two, single, raw = st_runs["two"][0], st_runs["one"][0], st_runs["raw"][0]
    assert len(two["grads"]) == len(single["grads"]) == 4
    for step_two, step_single in zip(two["grads"], single["grads"]):
        assert step_two.keys() == step_single.keys()
        for name in step_two:
            assert torch.allclose(step_two[name], step_single[name], atol=1e-5), name
        assert _norm(step_single) == pytest.approx(1.0, rel=1e-4)  # clipped jointly to max_grad_norm
    joint = _norm(raw["grads"][0])
    assert joint > 1.0 and raw["joint_norm"] is None
    for name, gradient in raw["grads"][0].items():
        expected = gradient * 1.0 / (joint + 1e-6)
        assert torch.allclose(two["grads"][0][name], expected, atol=1e-6, rtol=1e-4), name


def test_st_loss_two_processes_match_one_process_with_same_global_batch(st_runs):
    _assert_states_close(st_runs["two"][0]["state"], st_runs["one"][0]["state"], atol=1e-5)
    assert st_runs["two"][0]["losses"] == pytest.approx(st_runs["one"][0]["losses"], abs=1e-5)


def test_st_loss_matryoshka_two_processes_match_one_process(st_runs, tiny_encoder, tmp_path):
    """`MoCoSELoss(model, matryoshka_dims=...)` under SentenceTransformerTrainer and DDP: every width's InfoNCE sees
    the other rank's keys cut as the local ones, so 2 x 4 trains as 1 x 8 (weights and loss)."""
    dims = {"MATRYOSHKA_DIMS": "[32, 16, 8]"}
    two = _run([tiny_encoder, str(tmp_path / "two"), "4", *ST_SETTINGS], 2, tmp_path / "two", ST_WORKER, **dims)
    one = _run([tiny_encoder, str(tmp_path / "one"), "8", *ST_SETTINGS], 1, tmp_path / "one", ST_WORKER, **dims)
    assert two[0]["losses"][0] > 2 * st_runs["two"][0]["losses"][0]  # three widths' InfoNCE, not one
    assert two[0]["losses"] == pytest.approx(one[0]["losses"], rel=1e-5)
    _assert_states_close(two[0]["state"], one[0]["state"], atol=1e-5)


def test_st_loss_under_ddp_compiled_by_accelerate_trains_as_the_eager_run(st_runs, tiny_encoder, tmp_path):
    """accelerate's dynamo_backend compiles the DDP model: FGSM ("previous") takes its word embeddings as inputs."""
    compiled = _run([tiny_encoder, str(tmp_path), "4", *ST_SETTINGS], 2, tmp_path, ST_WORKER, "aot_eager")
    assert compiled[0]["losses"] == pytest.approx(st_runs["two"][0]["losses"], abs=1e-5)
    _assert_states_close(compiled[0]["state"], st_runs["two"][0]["state"], atol=1e-5)


def test_st_loss_resume_in_two_processes(st_runs, tiny_encoder, tmp_path):
    checkpoint = st_runs["two_dir"] / "checkpoint-2"
    assert (checkpoint / "mocose_loss" / "state.pt").is_file()
    resumed = _run([tiny_encoder, str(tmp_path), "4", *ST_SETTINGS, str(checkpoint)], 2, tmp_path, worker=ST_WORKER)
    _assert_states_close(resumed[0]["state"], st_runs["two"][0]["state"], atol=1e-6)
    assert resumed[0]["losses"][-2:] == pytest.approx(st_runs["two"][0]["losses"][-2:], abs=1e-6)


# ----------------------------------------------------------------- labelled data: (anchor, positive, negative_1..n)
def test_triplets_in_two_processes_match_one_process_with_the_trainer(tiny_encoder, tmp_path):
    """MoCoSETrainer on a raw (anchor, positive, negative_1, negative_2) table: every anchor sees the hard negatives
    of both ranks (gathered like keys), so 2 x 4 trains as 1 x 8."""
    _two_vs_one(tiny_encoder, tmp_path, 3, "mocose", {"n_negatives": 2})


def test_triplets_in_two_processes_match_one_process_and_resume_with_mocose_loss(tiny_encoder, tmp_path):
    """The same under SentenceTransformerTrainer (2 micro-batches per step), then a resume in two processes from the
    two-process run's checkpoint ends where that run ended."""
    triplets = {"HARD_NEGATIVES": "2"}
    for name in ("two", "one", "resumed"):
        (tmp_path / name).mkdir()
    two = _run([tiny_encoder, str(tmp_path / "two"), "4", *ST_SETTINGS], 2, tmp_path / "two", ST_WORKER, **triplets)
    one = _run([tiny_encoder, str(tmp_path / "one"), "8", *ST_SETTINGS], 1, tmp_path / "one", ST_WORKER, **triplets)
    assert int(two[0]["state"]["queue.queue_fill"]) == 4 + 4 * 2 * 8  # the positives' keys only
    assert two[0]["losses"] == pytest.approx(one[0]["losses"], abs=1e-5)
    _assert_states_close(two[0]["state"], one[0]["state"], atol=1e-5)
    checkpoint = tmp_path / "two" / "checkpoint-2"
    resumed = _run([tiny_encoder, str(tmp_path / "resumed"), "4", *ST_SETTINGS, str(checkpoint)], 2,
                   tmp_path / "resumed", ST_WORKER, **triplets)
    _assert_states_close(resumed[0]["state"], two[0]["state"], atol=1e-6)
    assert resumed[0]["losses"][-2:] == pytest.approx(two[0]["losses"][-2:], abs=1e-6)

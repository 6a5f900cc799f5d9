"""MoCoSETrainer under FSDP2 (accelerate's plugin, `fully_shard`), 2 CPU processes over gloo, against DDP.

The workers (tests/fsdp_worker.py) run under torchrun; FSDP on CPU needs the test-only shim described
there (accelerate only attaches its FSDP plugin on accelerator devices). Three launches, shared by the tests
(and one of scripts/train.py with configs/accelerate/fsdp2.yaml, last):

  - `sharded`: FSDP2, SHARDED_STATE_DICT (DCP) checkpoints, FGSM "previous", the paper recipes'
    `shared_embeddings: module`, 2 micro-batches per optimizer step (gradient accumulation), resumed from
    checkpoint-2, pushed to a fake Hub;
  - `unsharded`: the same run under DDP (the reference), pushed too;
  - `sharded_adamw`: FSDP2, SHARDED_STATE_DICT, AdamW, `shared_embeddings: module`, resumed from checkpoint-2
    (AdamW's moments travel through DCP);
  - `full_bf16`: FSDP2, FULL_STATE_DICT checkpoints, bf16 mixed precision with parameters loaded in bf16,
    FGSM "exact", AdamW, resumed from checkpoint-2.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT as REPO
from conftest import free_port, launch_train_script
from fake_hub import TOKEN, FakeHub

WORKER = Path(__file__).with_name("fsdp_worker.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
STS_ROWS = [
    ("5.0", "A man is playing a guitar.", "A man plays the guitar."),
    ("0.5", "A woman is slicing an onion.", "A dog runs in a field."),
    ("3.2", "Kids play in the park.", "Children are playing outside."),
    ("1.0", "The stock market fell.", "A cat sleeps on the sofa."),
    ("4.2", "A plane is taking off.", "An airplane departs."),
]


def _launch(encoder, out_dir: Path, sts_dev, options: dict, hub: FakeHub | None = None) -> list[dict]:
    out_dir.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    if hub is not None:
        env.update(HF_ENDPOINT=hub.url, HF_TOKEN=TOKEN, HF_HUB_OFFLINE="0")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(WORKER), encoder, str(out_dir), str(sts_dev), json.dumps(options)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    results = [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(2)
               if (out_dir / f"rank{r}.pt").is_file()]
    assert len(results) == 2, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return results


@pytest.fixture(scope="module")
def sts_dev(tmp_path_factory):
    path = tmp_path_factory.mktemp("sts") / "sts-dev.csv"
    path.write_text("".join(f"g\tf\t2012\t{i}\t{s}\t{a}\t{b}\n" for i, (s, a, b) in enumerate(STS_ROWS)))
    return path


@pytest.fixture(scope="module")
def hub():
    server = FakeHub()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


# What the paper recipes set (shared_embeddings) and gradient accumulation: the FSDP2 vs DDP comparison covers both.
PAPER_SHARING_ACCUMULATED = {"shared_embeddings": "module", "accumulation": 2}


@pytest.fixture(scope="module")
def sharded(tiny_encoder, tmp_path_factory, sts_dev, hub):
    out = tmp_path_factory.mktemp("fsdp") / "run"  # same run name as `unsharded`: the model cards name it
    options = {"resume": True, "push_repo": "sharded/run", **PAPER_SHARING_ACCUMULATED}
    return {"ranks": _launch(tiny_encoder, out, sts_dev, options, hub), "dir": out}


@pytest.fixture(scope="module")
def unsharded(tiny_encoder, tmp_path_factory, sts_dev, hub):
    out = tmp_path_factory.mktemp("ddp") / "run"
    options = {"ddp": True, "push_repo": "unsharded/run", **PAPER_SHARING_ACCUMULATED}
    return {"ranks": _launch(tiny_encoder, out, sts_dev, options, hub), "dir": out}


@pytest.fixture(scope="module")
def sharded_adamw(tiny_encoder, tmp_path_factory, sts_dev):
    out = tmp_path_factory.mktemp("adamw") / "run"
    options = {"resume": True, "optim": "adamw_torch", "learning_rate": 1e-3, "shared_embeddings": "module"}
    return {"ranks": _launch(tiny_encoder, out, sts_dev, options), "dir": out}


@pytest.fixture(scope="module")
def full_bf16(tiny_encoder, tmp_path_factory, sts_dev):
    out = tmp_path_factory.mktemp("full") / "run"
    options = {"resume": True, "state_dict_type": "FULL_STATE_DICT", "bf16": True, "load_bf16": True,
               "fgsm_mode": "exact", "optim": "adamw_torch", "learning_rate": 1e-3}
    return {"ranks": _launch(tiny_encoder, out, sts_dev, options), "dir": out}


def _assert_states_close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name].float(), b[name].float(), atol=atol), name


def test_online_and_target_are_sharded_alike(sharded, full_bf16):
    for run in (sharded, full_bf16):
        rank0 = run["ranks"][0]
        assert rank0["world_size"] == 2 and rank0["fsdp"]
        layout = rank0["layout"]
        for branch in ("online", "target"):  # accelerate wraps both encoders' layers (BertLayer), the root the rest
            assert {f"{branch}_encoder.encoder.layer.0", f"{branch}_encoder.encoder.layer.1"} <= set(layout["fsdp_units"])
        assert layout["placements"] == ["(Shard(dim=0),)"] and layout["unsharded"] == []


def test_fsdp2_matches_ddp(sharded, unsharded):
    """Online and target weights, heads, predictor and queue after 4 optimizer steps of 2 accumulated micro-batches
    (FGSM on, the embedding module shared), and every loss: FSDP2 equals DDP within 1e-5."""
    fsdp, ddp = sharded["ranks"][0], unsharded["ranks"][0]
    assert not ddp["fsdp"] and ddp["world_size"] == 2
    _assert_states_close(fsdp["state"], ddp["state"], atol=1e-5)
    assert any(name.startswith("target_encoder.") for name in fsdp["state"])
    assert fsdp["losses"] == pytest.approx(ddp["losses"], abs=1e-5)
    assert fsdp["eval"] == pytest.approx(ddp["eval"], abs=1e-6)  # evaluate() through the sharded `embed`


def test_ranks_hold_the_same_replicated_queue(sharded):
    """Rank 1 was given another initial queue: it is replaced by rank 0's, then fed the same gathered keys."""
    rank0, rank1 = sharded["ranks"]
    for name in rank0["queue"]:
        assert torch.equal(rank0["queue"][name], rank1["queue"][name]), name
    assert int(rank0["queue"]["queue_fill"]) == 4 + 4 * 8  # K_s + steps x global batch
    for name in rank0["state"]:
        assert torch.equal(rank0["state"][name], rank1["state"][name]), name


def test_ema_lerps_local_shards_without_communication(sharded, sharded_adamw, full_bf16):
    for run in (sharded, sharded_adamw, full_bf16):
        for rank in run["ranks"]:
            target_elements = sum(t.numel() for n, t in rank["state"].items() if n.startswith("target_"))
            assert rank["control_collectives"] >= 1  # CommDebugMode does see a collective
            steps = rank["ema"] + rank["resumed"]["ema"]
            assert len(steps) == 4 + 2
            for step in steps:
                assert step["collectives"] == 0 and step["all_sharded"], step
                assert step["in_place"] and step["exact"] and step["moved"], step
                assert step["dtypes"] == ["torch.float32"], step
                assert step["local_elements"] < 0.6 * target_elements  # this rank's half, not the whole target
                assert step["copied_exact"], step  # buffers and, with shared_embeddings "module", the embedding module
                # The embedding module's position/type tables and LayerNorm are DTensors: copied shard by shard.
                assert (step["copied_sharded"] > 0) == (run is not full_bf16), step


def test_sharded_state_dict_resume_is_exact(sharded):
    checkpoint = sharded["dir"] / "checkpoint-2"
    assert (checkpoint / "pytorch_model_fsdp_0").is_dir() and not (checkpoint / "model.safetensors").exists()
    assert {"config.json", "tokenizer.json", "fgsm_rank0.pt", "fgsm_rank1.pt"} <= {
        p.name for p in checkpoint.iterdir()}
    run = sharded["ranks"][0]
    _assert_states_close(run["resumed"]["state"], run["state"], atol=1e-6)
    assert run["resumed"]["losses"][-2:] == pytest.approx(run["losses"][-2:], abs=1e-6)


def test_sharded_state_dict_resume_restores_adamw_moments_exactly(sharded_adamw):
    """AdamW's step count and both moments, each rank's shards, as saved in checkpoint-2 (DCP) and as loaded back;
    then the resumed run ends where the uninterrupted one did."""
    checkpoint = sharded_adamw["dir"] / "checkpoint-2"
    assert (checkpoint / "optimizer_0").is_dir() and not (checkpoint / "optimizer.pt").exists()
    for rank in sharded_adamw["ranks"]:
        saved, loaded = rank["resumed"]["optimizer_saved"], rank["resumed"]["optimizer_loaded"]
        assert saved and len(saved) == len(loaded)
        for before, after in zip(saved, loaded):
            assert before.keys() == after.keys() == {"step", "exp_avg", "exp_avg_sq"}
            for name in before:
                assert torch.equal(before[name], after[name]), name
        assert any(state["exp_avg_sq"].abs().sum() > 0 for state in saved)  # moments that matter
    run = sharded_adamw["ranks"][0]
    _assert_states_close(run["resumed"]["state"], run["state"], atol=1e-6)
    assert run["resumed"]["losses"][-2:] == pytest.approx(run["losses"][-2:], abs=1e-6)


def test_full_state_dict_resume_is_exact_under_bf16_mixed_precision(full_bf16):
    checkpoint = full_bf16["dir"] / "checkpoint-2"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "pytorch_model_fsdp.bin").is_file()
    run = full_bf16["ranks"][0]
    # Parameters were loaded in bf16; accelerate upcasts the trainable ones, hf_mocose the frozen target.
    assert run["layout"]["param_dtype"] == "torch.bfloat16" and run["layout"]["target_dtypes"] == ["torch.float32"]
    _assert_states_close(run["resumed"]["state"], run["state"], atol=1e-6)
    assert run["resumed"]["losses"][-2:] == pytest.approx(run["losses"][-2:], abs=1e-6)


def _card_without_run_facts(text: str) -> str:
    """The card but for the repo id, the wall time and the arguments that say how the run was sharded."""
    return "\n".join(line.replace("unsharded/run", "REPO").replace("sharded/run", "REPO") for line in text.splitlines()
                     if "Wall time" not in line and not line.startswith("- `fsdp"))


def _facts_without_run_specifics(data: bytes) -> dict:
    """card_facts.json but for the wall time and the arguments that say how the run was sharded (all in the card)."""
    facts = json.loads(data)
    facts["training_args"]["arguments"] = {k: v for k, v in facts["training_args"]["arguments"].items()
                                           if not k.startswith("fsdp")}
    facts.pop("train_runtime")
    return facts


def test_push_from_a_sharded_run_equals_an_unsharded_push(sharded, unsharded, hub):
    """Same files at the repo root (the sentence-transformers export) and in mocose/; configs and tokenizer
    byte for byte, weights within float tolerance, the card identical but for the repo id and wall time
    (mocose/training_args.bin records each run's own arguments: FSDP or not, the repo id; card_facts.json and
    the card's list of arguments, FSDP or not; card_facts.json the wall time too)."""
    fsdp, ddp = hub.files[("sharded/run", "main")], hub.files[("unsharded/run", "main")]
    assert fsdp.keys() == ddp.keys() and {"modules.json", "model.safetensors", "mocose/model.safetensors"} <= fsdp.keys()
    from safetensors.torch import load

    for name in fsdp:
        if name.endswith(".safetensors"):
            _assert_states_close(load(fsdp[name]), load(ddp[name]), atol=1e-5)
        elif name == "mocose/training_args.bin":
            continue
        elif name == "mocose/card_facts.json":
            assert _facts_without_run_specifics(fsdp[name]) == _facts_without_run_specifics(ddp[name])
        elif name.endswith("README.md"):
            assert _card_without_run_facts(fsdp[name].decode()) == _card_without_run_facts(ddp[name].decode())
        else:
            assert fsdp[name] == ddp[name], name
    export = sharded["dir"] / "sentence-transformers"
    assert (export / "model.safetensors").read_bytes() == fsdp["model.safetensors"]


def test_fsdp2_config_runs_scripts_train_end_to_end(tiny_encoder, tmp_path, sts_dev):
    """configs/accelerate/fsdp2.yaml as shipped (bf16, SHARDED_STATE_DICT) with the quickstart recipe through
    scripts/train.py's main: DCP checkpoints that `--resume_from_checkpoint last` accepts, the best checkpoint
    loaded back from DCP at the end, the final model saved whole and exported."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from hf_mocose.launch.checkpoints import checkpoint_problems

    out = tmp_path / "run"
    argv = [str(REPO / "training_args/quickstart.yaml"), "--model_name_or_path", tiny_encoder, "--output_dir", str(out),
            "--stsb_dev_file", str(sts_dev), "--max_train_samples", "64", "--max_steps", "4", "--eval_steps", "2",
            "--save_steps", "2", "--per_device_train_batch_size", "4", "--queue_size", "32", "--queue_init_size", "4",
            "--max_seq_length", "16", "--use_cpu", "true"]
    proc = launch_train_script("fsdp2", argv, tmp_path / "logs")
    assert (out / "sentence-transformers" / "modules.json").is_file(), f"exit {proc.returncode}\n{proc.stderr[-6000:]}"
    # accelerate's FSDP save ran (its "Model saved to" log line is silenced now): DCP shards in every checkpoint
    assert all((out / f"checkpoint-{step}" / "pytorch_model_fsdp_0" / ".metadata").is_file() for step in (2, 4))
    for step in (2, 4):
        assert checkpoint_problems(out / f"checkpoint-{step}") == []  # complete: what `last` resumes from
    best = json.loads((out / "trainer_state.json").read_text())["best_model_checkpoint"]
    dcp_to_torch_save(Path(best) / "pytorch_model_fsdp_0", tmp_path / "best.pt")
    best_state = torch.load(tmp_path / "best.pt", weights_only=True)["model"]
    final_state = load_file(out / "final" / "model.safetensors")
    _assert_states_close(final_state, best_state, atol=0.0)  # every tensor: online, target, heads, queue

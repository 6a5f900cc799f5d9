"""Streamed corpora (`IterableDataset`, read as training goes) through both front doors and `scripts/train.py`.

Under two processes each rank must train on its own part of the stream: accelerate's dispatching (the
default for an `IterableDataset` in `Trainer`) reads each global batch once and hands every rank its slice.
"""

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import make_st_trainer, tiny_training_args
from stream_worker import streamed_sentences

WORKER = Path(__file__).with_name("stream_worker.py")


def _streamed(n=64, num_shards=4):
    from datasets import Dataset

    from hf_mocose.data.corpus import python_docs_sentences

    return Dataset.from_dict({"text": python_docs_sentences()[:n]}).to_iterable_dataset(num_shards=num_shards)


def test_mocose_trainer_trains_on_a_stream(tiny_encoder, tmp_path):
    from hf_mocose import MoCoSETrainer

    trainer = MoCoSETrainer(model=tiny_encoder, args=tiny_training_args(tmp_path, max_steps=3), train_dataset=_streamed())
    assert trainer.train_dataset.column_names == ["input_ids", "token_type_ids", "attention_mask"]
    trainer.train()
    assert trainer.state.global_step == 3


def test_st_loss_trains_on_a_stream(tiny_encoder, tmp_path):
    from hf_mocose.compat import SENTENCE_TRANSFORMERS_5

    dispatch = {"accelerator_config": {"dispatch_batches": False}} if SENTENCE_TRANSFORMERS_5 else {}
    trainer = make_st_trainer(tiny_encoder, tmp_path, dataset=_streamed(), max_steps=3, **dispatch)
    trainer.train()
    assert trainer.state.global_step == 3


def test_st_loss_names_dispatch_batches_for_a_stream_under_sentence_transformers_5(tiny_encoder, tmp_path, monkeypatch):
    from hf_mocose.st_loss import inputs

    monkeypatch.setattr(inputs, "SENTENCE_TRANSFORMERS_5", True)  # what a run there meets (accelerate fails mid-step)
    trainer = make_st_trainer(tiny_encoder, tmp_path, dataset=_streamed(), max_steps=3)
    with pytest.raises(ValueError, match=r"^A streamed train_dataset under sentence-transformers < 6: pass "
                                         r"accelerator_config=\{'dispatch_batches': False\}"):
        trainer.train()
    assert trainer.state.global_step == 0


@pytest.mark.parametrize("overrides, message", [
    (dict(max_steps=-1), "train_dataset is streamed .* set max_steps"),
    (dict(hard_negatives="una"), "hard_negatives='una' counts the whole corpus"),
])
def test_a_stream_without_what_it_needs_is_refused_before_the_model_loads(tmp_path, monkeypatch, overrides, message):
    from hf_mocose import MoCoSETrainer
    from hf_mocose.trainer import inputs

    monkeypatch.setattr(inputs, "build_mocose_model", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(ValueError, match=message):
        MoCoSETrainer(model="unused", args=tiny_training_args(tmp_path, **overrides), train_dataset=_streamed())


def test_train_script_streams_with_max_steps(tiny_encoder, tmp_path, capsys):
    from hf_mocose.commands.train import cli_main

    base = ["--model_name_or_path", tiny_encoder, "--train_file", "builtin:python_docs", "--output_dir",
            str(tmp_path / "run"), "--use_cpu", "true", "--eval_strategy", "no", "--save_strategy", "no",
            "--per_device_train_batch_size", "4", "--queue_size", "8", "--report_to", "none",
            "--export_sentence_transformers", "false", "--streaming", "true", "--max_train_samples", "40"]
    assert cli_main(base) == 2
    assert "--streaming true reads the corpus as training goes" in capsys.readouterr().err
    assert cli_main([*base, "--max_steps", "2"]) == 0
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert state["global_step"] == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("front", ["trainer", "st"])
def test_each_rank_trains_on_its_own_part_of_the_stream(tiny_encoder, tmp_path, front):
    from transformers import AutoTokenizer

    from hf_mocose.data.corpus import python_docs_sentences

    batch, steps = 4, 3
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
               str(_free_port()), str(WORKER), tiny_encoder, str(tmp_path), front, str(batch), str(steps)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)
             if (tmp_path / f"rank{r}.json").is_file()]
    assert len(ranks) == 2, f"exit {result.returncode}\n{result.stderr[-4000:]}"
    assert [r["world_size"] for r in ranks] == [2, 2] and [r["steps"] for r in ranks] == [steps, steps]
    seen = [Counter(map(tuple, r["rows"])) for r in ranks]
    assert all(sum(c.values()) == batch * steps for c in seen)
    assert not set(seen[0]) & set(seen[1])  # no sentence trained on by both ranks
    tokenizer = AutoTokenizer.from_pretrained(tiny_encoder)

    def tokens(sentences):
        return Counter(tuple(ids) for ids in tokenizer(list(sentences), truncation=True, max_length=32)["input_ids"])

    if front == "trainer":  # accelerate's dispatching: the stream's first global batches, each split between the ranks
        assert seen[0] + seen[1] == tokens(python_docs_sentences()[:2 * batch * steps])
    else:  # dispatch_batches=False: accelerate gives each rank its own shards of the stream (datasets' shard)
        for rank in range(2):
            own = streamed_sentences().shard(num_shards=2, index=rank).take(batch * steps)
            assert seen[rank] == tokens(row["text"] for row in own)
    assert "broadcast_buffers` is deprecated" not in result.stderr  # hf-mocose's ddp_broadcast_buffers=False, quiet


def test_st_loss_tells_how_to_stream_under_several_processes(tiny_encoder, tmp_path, monkeypatch):
    from sentence_transformers import SentenceTransformerTrainingArguments

    from hf_mocose.st_loss import inputs

    monkeypatch.setattr(inputs, "get_world_size", lambda: 2)
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    with pytest.raises(ValueError, match=r"pass accelerator_config=\{'dispatch_batches': False\}"):
        inputs.check_streamed_data(_streamed(), args)
    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path), use_cpu=True, dataloader_drop_last=True,
                                                accelerator_config={"dispatch_batches": False})
    inputs.check_streamed_data(_streamed(num_shards=4), args)
    with pytest.raises(ValueError, match="has 3 shards, which 2 processes cannot share"):
        inputs.check_streamed_data(_streamed(num_shards=3), args)

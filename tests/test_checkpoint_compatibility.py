"""Checkpoints of earlier versions still load, export and resume: those written before the modules moved into
sub-packages.

`tests/fixtures/saved_before_move/` was written by `tests/fixtures/make_saved_before_move.py` run at the commit
before the move (da726eb): a `MoCoSETrainer` checkpoint and final model, and a `MoCoSELoss` checkpoint, from a tiny
random BERT. Nothing here may rewrite those files: each test copies what it resumes.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "saved_before_move"


def _generator():
    spec = importlib.util.spec_from_file_location("make_saved_before_move", FIXTURE.parent / "make_saved_before_move.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _embed(model, tokenizer, sentences):
    model.eval()
    with torch.no_grad():
        return model.embed(**tokenizer(sentences, padding=True, return_tensors="pt"))


def test_a_final_model_saved_before_the_move_loads_with_both_auto_classes():
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from hf_mocose import MoCoSEConfig, MoCoSEModel

    final = FIXTURE / "mocose" / "final"
    model = MoCoSEModel.from_pretrained(final)
    assert isinstance(AutoConfig.from_pretrained(final), MoCoSEConfig)
    auto = AutoModel.from_pretrained(final)
    assert type(auto) is MoCoSEModel
    tokenizer = AutoTokenizer.from_pretrained(final)
    sentences = _generator().sentences()[:4]
    assert torch.equal(_embed(model, tokenizer, sentences), _embed(auto, tokenizer, sentences))
    assert int(model.queue.queue_fill) == 8 and model.config.queue_size == 8  # 4 random keys + 2 steps of 4 keys: full


def test_a_checkpoint_saved_before_the_move_exports_to_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    from hf_mocose import MoCoSEModel
    from hf_mocose.publishing.export import export_to_sentence_transformers

    final = FIXTURE / "mocose" / "final"
    export_to_sentence_transformers(final, tmp_path / "st")
    sentences = _generator().sentences()[:4]
    exported = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(sentences, convert_to_tensor=True)
    expected = _embed(MoCoSEModel.from_pretrained(final), AutoTokenizer.from_pretrained(final), sentences)
    torch.testing.assert_close(exported, expected, atol=1e-5, rtol=1e-4)


def plan_three_steps(checkpoint):
    """The fixture's run finished at its planned 2 steps; a resume for 3 is refused, so its copy planned 3."""
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    (checkpoint / "trainer_state.json").write_text(json.dumps({**state, "max_steps": 3}))


def test_a_mocose_trainer_checkpoint_saved_before_the_move_resumes(tmp_path):
    from datasets import Dataset

    from hf_mocose import MoCoSETrainer, MoCoSETrainingArguments

    run = tmp_path / "mocose"
    shutil.copytree(FIXTURE / "mocose", run)
    plan_three_steps(run / "checkpoint-2")
    args = MoCoSETrainingArguments(output_dir=str(run), queue_size=8, queue_init_size=4, max_seq_length=16,
                                   per_device_train_batch_size=4, max_steps=3, learning_rate=1e-3, save_strategy="no",
                                   eval_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True)
    trainer = MoCoSETrainer(model=str(FIXTURE / "encoder"), args=args,
                            train_dataset=Dataset.from_dict({"text": _generator().sentences()}))
    trainer.train(resume_from_checkpoint=str(run / "checkpoint-2"))
    assert trainer.state.global_step == 3
    saved = json.loads((FIXTURE / "mocose" / "checkpoint-2" / "trainer_state.json").read_text())
    logged = [(entry["step"], entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]
    assert logged[:2] == [(entry["step"], entry["loss"]) for entry in saved["log_history"] if "loss" in entry]
    assert [step for step, _ in logged] == [1, 2, 3]  # steps 1-2 restored from the checkpoint, step 3 trained


def test_a_mocose_loss_checkpoint_saved_before_the_move_resumes(tmp_path):
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from hf_mocose import MoCoSELoss

    run = tmp_path / "st"
    shutil.copytree(FIXTURE / "st", run)
    plan_three_steps(run / "checkpoint-2")
    transformer = Transformer(str(FIXTURE / "encoder"), max_seq_length=16)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")])
    loss = MoCoSELoss(model, queue_size=8, queue_init_size=4)
    args = SentenceTransformerTrainingArguments(output_dir=str(run), per_device_train_batch_size=4, max_steps=3,
                                                learning_rate=1e-3, save_strategy="no", report_to="none", use_cpu=True,
                                                seed=0, disable_tqdm=True)
    trainer = SentenceTransformerTrainer(model=model, args=args, loss=loss, callbacks=[loss.callback],
                                         train_dataset=Dataset.from_dict({"text": _generator().sentences()}))
    trainer.train(resume_from_checkpoint=str(run / "checkpoint-2"))
    assert trainer.state.global_step == 3
    saved = torch.load(FIXTURE / "st" / "checkpoint-2" / "mocose_loss" / "state.pt", weights_only=True)["queue"]
    # The resumed step wrote 4 keys after the saved pointer; the other 4 rows are the saved queue's, restored.
    written = {(int(saved["queue_ptr"]) + i) % 8 for i in range(4)}
    kept = sorted(set(range(8)) - written)
    assert int(loss.queue.queue_ptr) == (int(saved["queue_ptr"]) + 4) % 8
    torch.testing.assert_close(loss.queue.keys[kept], saved["keys"][kept])


@pytest.mark.parametrize("name", ["mocose/checkpoint-2/training_args.json", "mocose/final/config.json"])
def test_the_fixture_is_the_pre_move_one(name):
    """The fixture files exist as committed (a test that silently regenerated them would prove nothing)."""
    assert (FIXTURE / name).is_file()

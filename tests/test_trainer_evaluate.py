"""`MoCoSETrainer.evaluate` keeps `Trainer.evaluate`'s contract and encodes whole sentences."""

from __future__ import annotations

import math

import pytest
from conftest import make_trainer
from datasets import Dataset
from transformers import TrainerCallback

PAIRS = [
    ("A man is playing a guitar.", "A man plays the guitar.", 5.0),
    ("A woman is slicing an onion.", "A dog runs in a field.", 0.5),
    ("Kids play in the park.", "Children are playing outside.", 3.2),
    ("The stock market fell.", "A cat sleeps on the sofa.", 1.0),
    ("A girl is riding a horse.", "A horse is ridden by a girl.", 4.6),
]


def write_stsb(path, pairs=PAIRS):
    path.write_text("".join(f"g\tf\t2012\t{i}\t{score}\t{a}\t{b}\n" for i, (a, b, score) in enumerate(pairs)))
    return str(path)


class RecordEvaluations(TrainerCallback):
    def __init__(self):
        self.metrics = []

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.metrics.append(dict(metrics))


def test_evaluate_keeps_the_trainer_contract(tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path / "out", stsb_dev_file=write_stsb(tmp_path / "sts-dev.csv"),
                           eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2, max_steps=4,
                           load_best_model_at_end=True, save_total_limit=None)
    recorder = RecordEvaluations()
    trainer.add_callback(recorder)
    trainer.train()
    speed = {"eval_runtime", "eval_samples_per_second", "eval_steps_per_second"}
    assert len(recorder.metrics) == 2  # on_evaluate once per evaluation
    for metrics in recorder.metrics:
        assert {"eval_stsb_spearman", "eval_stsb_pearson"} | speed <= set(metrics)
    logged = [h for h in trainer.state.log_history if "eval_stsb_spearman" in h]
    assert len(logged) == 2 and all(speed <= set(h) for h in logged)  # logged once per evaluation
    # metric_for_best_model = stsb_spearman with load_best_model_at_end
    best = max(h["eval_stsb_spearman"] for h in logged)
    assert trainer.state.best_metric == pytest.approx(best)
    assert trainer.state.best_model_checkpoint.endswith(("checkpoint-2", "checkpoint-4"))
    # metric_key_prefix, and the same number as during training for the loaded best model
    test = trainer.evaluate(metric_key_prefix="test")
    assert {"test_stsb_spearman", "test_stsb_pearson", "test_runtime", "test_samples_per_second"} <= set(test)
    assert test["test_stsb_spearman"] == pytest.approx(best, abs=1e-4)
    assert not any(key.startswith("eval_") for key in test)
    # sentence-transformers' evaluator writes its CSV as in SentenceTransformerTrainer
    csv = (tmp_path / "out" / "eval" / "similarity_evaluation_stsb_results.csv").read_text().splitlines()
    assert csv[0] == "epoch,steps,cosine_pearson,cosine_spearman" and len(csv) == 4


def test_a_dict_of_sts_datasets_prefixes_each(tiny_encoder, tmp_path):
    pairs = Dataset.from_dict({"sentence1": [a for a, _, _ in PAIRS], "sentence2": [b for _, b, _ in PAIRS],
                               "score": [s for _, _, s in PAIRS]})
    trainer = make_trainer(tiny_encoder, tmp_path)
    metrics = trainer.evaluate({"stsb": pairs, "other": pairs.select(range(4))})
    assert {"eval_stsb_stsb_spearman", "eval_other_stsb_spearman", "eval_other_runtime"} <= set(metrics)


def test_wrong_eval_columns_fail_before_training(tiny_encoder, tmp_path):
    from hf_mocose.trainer.mocose_trainer import MoCoSETrainer

    base = make_trainer(tiny_encoder, tmp_path)
    bad = Dataset.from_dict({"text": ["a", "b"], "label": [1, 0]})
    with pytest.raises(ValueError, match="needs the columns sentence1, sentence2, score; missing sentence1"):
        MoCoSETrainer(model=base.model, args=base.args, train_dataset=base.train_dataset, eval_dataset=bad,
                      processing_class=base.processing_class)


def test_evaluation_encodes_whole_sentences_by_default(tiny_encoder, tmp_path):
    """Pairs that differ only after the training length (16 tokens) are told apart unless eval truncates."""
    prefix = "the quick brown fox jumps over the lazy dog near the river bank while the sun sets slowly"
    tails = [("a man plays guitar", "a man is playing a guitar", 4.8), ("stocks fell", "a cat sleeps", 0.2),
             ("kids run", "children are running", 4.0), ("it rains", "the market opened", 1.1)]
    pairs = [(f"{prefix} {a}", f"{prefix} {b}", score) for a, b, score in tails]
    dev = write_stsb(tmp_path / "sts-dev.csv", pairs)
    whole = make_trainer(tiny_encoder, tmp_path / "whole", stsb_dev_file=dev)
    assert len(whole.processing_class(prefix)["input_ids"]) > whole.model.config.max_seq_length
    full = whole.evaluate()["eval_stsb_spearman"]
    assert not math.isnan(full)
    cut = make_trainer(tiny_encoder, tmp_path / "cut", stsb_dev_file=dev, eval_max_seq_length=16)
    assert math.isnan(cut.evaluate()["eval_stsb_spearman"])  # every pair truncated to the same prefix


def test_eval_max_seq_length_is_checked(tiny_encoder, tmp_path):
    with pytest.raises(ValueError, match="eval_max_seq_length must be >= 2"):
        make_trainer(tiny_encoder, tmp_path, eval_max_seq_length=1)
    # Beyond the encoder's limit: refused by the trainer's construction (tests/test_trainer_switches.py), and by
    # evaluate() for arguments changed afterwards.
    trainer = make_trainer(tiny_encoder, tmp_path, stsb_dev_file=write_stsb(tmp_path / "d.csv"))
    trainer.args.eval_max_seq_length = 999
    with pytest.raises(ValueError, match="encoder's limit 128, got 999"):
        trainer.evaluate()

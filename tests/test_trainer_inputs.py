"""`MoCoSETrainer`'s front doors (`hf_mocose.trainer.inputs`): a model id/folder or a loaded encoder, no tokenizer,
raw sentences -- as TRL's trainers take them -- and `evaluate`/`predict` with `compute_metrics`."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from conftest import make_trainer, tiny_training_args
from datasets import Dataset
from scipy.stats import kendalltau
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

from hf_mocose import MoCoSEModel, MoCoSETrainer
from hf_mocose.data.corpus import python_docs_sentences

SENTENCES = python_docs_sentences()[:24]
PAIRS = Dataset.from_dict({
    "sentence1": ["A man is playing a guitar.", "A woman is slicing an onion.", "Kids play in the park.",
                  "The stock market fell."],
    "sentence2": ["A man plays the guitar.", "A dog runs in a field.", "Children are playing outside.",
                  "A cat sleeps on the sofa."],
    "score": [5.0, 0.5, 3.2, 1.0],
})


def raw(sentences=SENTENCES) -> Dataset:
    return Dataset.from_dict({"text": list(sentences)})


def test_folder_and_loaded_encoder_build_the_same_model_with_the_args_settings(tiny_encoder, tmp_path):
    args = tiny_training_args(tmp_path)
    from_folder = MoCoSETrainer(model=tiny_encoder, args=args, train_dataset=raw())
    from_model = MoCoSETrainer(model=AutoModel.from_pretrained(tiny_encoder), args=args, train_dataset=raw())
    with_head = MoCoSETrainer(model=AutoModelForMaskedLM.from_pretrained(tiny_encoder), args=args)  # base_model used
    assert from_folder.model.config.queue_size == 10 and from_folder.model.config.max_seq_length == 16
    state, other = from_folder.model.state_dict(), from_model.model.state_dict()
    for name in ("online_encoder.embeddings.word_embeddings.weight", "online_pooler.weight",
                 "target_encoder.encoder.layer.1.output.dense.weight"):
        assert torch.equal(state[name], other[name]), name
    assert torch.equal(with_head.model.online_encoder.embeddings.word_embeddings.weight,
                       state["online_encoder.embeddings.word_embeddings.weight"])
    # No processing_class: the tokenizer comes from the folder, or from the loaded model's _name_or_path.
    for trainer in (from_folder, from_model, with_head):
        assert trainer.processing_class("A sentence.")["input_ids"] == AutoTokenizer.from_pretrained(tiny_encoder)(
            "A sentence.")["input_ids"]


def test_raw_sentences_are_tokenised_and_tokenised_datasets_pass(tiny_encoder, tmp_path):
    long = " ".join(["word"] * 40)
    trainer = MoCoSETrainer(model=tiny_encoder, args=tiny_training_args(tmp_path), train_dataset=raw([long, "Short."]))
    assert trainer.train_dataset.column_names == ["input_ids", "token_type_ids", "attention_mask"]
    assert len(trainer.train_dataset[0]["input_ids"]) == 16  # truncated at max_seq_length
    tokenised = trainer.train_dataset
    again = MoCoSETrainer(model=trainer.model, args=trainer.args, train_dataset=tokenised,
                          processing_class=trainer.processing_class)
    assert again.train_dataset is tokenised


@pytest.mark.parametrize("columns, message", [
    ({"sentence": ["a", "b"]}, "train_dataset has the columns sentence; MoCoSETrainer needs raw sentences in a `text`"),
    ({"text": ["a", "b"], "fraternal_text": ["A", "B"]}, "fraternal_text column: IFCL's fraternal view"),
])
def test_other_dataset_shapes_are_refused_naming_the_columns(tiny_encoder, tmp_path, columns, message):
    with pytest.raises(ValueError, match=message):
        MoCoSETrainer(model=tiny_encoder, args=tiny_training_args(tmp_path), train_dataset=Dataset.from_dict(columns))


def test_model_init_kwargs_reach_from_pretrained(tiny_encoder, tmp_path, caplog):
    args = tiny_training_args(tmp_path, model_init_kwargs={"dtype": "bfloat16"})
    trainer = MoCoSETrainer(model=tiny_encoder, args=args, train_dataset=raw())
    assert trainer.model.dtype == torch.bfloat16 and trainer.model.online_pooler.weight.dtype == torch.bfloat16
    assert trainer.model.queue.keys.dtype == torch.float32  # the queue stays fp32 by design (queue.py)
    assert MoCoSETrainer(model=tiny_encoder, args=tiny_training_args(tmp_path)).model.dtype == torch.float32
    with pytest.raises(ValueError, match="model_init_kwargs dtype 'bf16' is not a dtype"):
        MoCoSETrainer(model=tiny_encoder, args=tiny_training_args(tmp_path, model_init_kwargs={"dtype": "bf16"}))
    with caplog.at_level(logging.WARNING, logger="hf_mocose.trainer.inputs"):
        MoCoSETrainer(model=trainer.model, args=args, processing_class=trainer.processing_class)
    assert "model_init_kwargs are for a model id or folder" in caplog.text


def test_a_mocose_checkpoint_folder_continues_with_its_own_tokenizer_and_config(tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path / "run", n_sentences=8, queue_size=12)
    trainer.save_model(str(tmp_path / "final"))
    again = MoCoSETrainer(model=str(tmp_path / "final"), args=tiny_training_args(tmp_path / "again"), train_dataset=raw())
    assert again.model.config.queue_size == 12  # the checkpoint's, not the arguments' 10
    assert torch.equal(again.model.queue.keys, trainer.model.queue.keys)
    assert again.processing_class.name_or_path == str(tmp_path / "final")


def test_mocose_subfolder_of_a_published_repo_loads_the_mocose_model(tiny_encoder, tmp_path):
    """`MoCoSEModel.from_pretrained(repo, subfolder="mocose")`: the root holds the export's BERT config."""
    AutoModel.from_pretrained(tiny_encoder).save_pretrained(tmp_path / "repo")  # the root: a plain encoder
    make_trainer(tiny_encoder, tmp_path / "run", n_sentences=8, queue_size=12).save_model(str(tmp_path / "repo/mocose"))
    model = MoCoSEModel.from_pretrained(tmp_path / "repo", subfolder="mocose")
    assert model.config.queue_size == 12


def test_bad_models_and_arguments_are_refused_in_one_line(tiny_encoder, tmp_path):
    from transformers import TrainingArguments

    with pytest.raises(FileNotFoundError, match="model 'no/such-model-here'"):
        MoCoSETrainer(model="no/such-model-here", args=tiny_training_args(tmp_path))
    with pytest.raises(TypeError, match="got int"):
        MoCoSETrainer(model=3, args=tiny_training_args(tmp_path))
    with pytest.raises(TypeError, match="needs args=MoCoSETrainingArguments"):
        MoCoSETrainer(model=tiny_encoder, args=TrainingArguments(output_dir=str(tmp_path), report_to="none"))


def test_builtin_minilm_names_its_hub_id(tmp_path):
    from hf_mocose.trainer.inputs import MINILM_HUB_ID, build_mocose_model

    model = build_mocose_model("builtin:all-MiniLM-L6-v2", tiny_training_args(tmp_path, method="simcse"))
    assert model.config.base_model_name_or_path == MINILM_HUB_ID and model.config.base_max_seq_length == 256


def test_compute_metrics_gets_similarities_and_gold_scores(tiny_encoder, tmp_path):
    """Trainer's contract: `compute_metrics(EvalPrediction)` at each evaluation, its keys prefixed."""
    from hf_mocose.models.encoding import encode_with_model

    seen = []

    def kendall(prediction):
        seen.append(prediction)
        return {"kendall": kendalltau(prediction.predictions, prediction.label_ids).statistic}

    trainer = make_trainer(tiny_encoder, tmp_path, n_sentences=8)
    trainer.compute_metrics = kendall
    metrics = trainer.evaluate(PAIRS)
    assert "eval_kendall" in metrics and "eval_stsb_spearman" in metrics
    (prediction,) = seen
    assert prediction.label_ids.tolist() == PAIRS["score"]
    first, second = (encode_with_model(trainer.model, trainer.processing_class, PAIRS[column], max_length=128)
                     for column in ("sentence1", "sentence2"))
    want = torch.nn.functional.cosine_similarity(first, second).numpy()
    assert prediction.predictions.shape == (4,) and np.allclose(prediction.predictions, want, atol=1e-6)


def test_predict_scores_pairs_and_embeds_sentences(tiny_encoder, tmp_path):
    from hf_mocose.models.encoding import encode_with_model

    trainer = make_trainer(tiny_encoder, tmp_path, n_sentences=8)
    pairs = trainer.predict(PAIRS)
    assert pairs.predictions.shape == (4,) and pairs.label_ids.tolist() == PAIRS["score"]
    assert pairs.metrics["test_stsb_spearman"] == pytest.approx(trainer.evaluate(PAIRS)["eval_stsb_spearman"])
    sentences = trainer.predict(Dataset.from_dict({"text": SENTENCES[:5]}))
    want = encode_with_model(trainer.model, trainer.processing_class, SENTENCES[:5], max_length=128).numpy()
    assert sentences.predictions.shape == (5, 32) and np.allclose(sentences.predictions, want, atol=1e-6)
    with pytest.raises(ValueError, match="predict\\(\\) takes STS pairs .* or sentences .*; got label"):
        trainer.predict(Dataset.from_dict({"label": [1, 0]}))


def test_default_evaluation_is_turned_off_when_there_is_nothing_to_score(tiny_encoder, tmp_path, caplog):
    """`eval_strategy="steps"` is MoCoSE's default (STS-B dev every 100 steps); without STS pairs the Trainer would
    refuse to start, so evaluation is turned off, saying so; `load_best_model_at_end` cannot be, and is refused."""
    from hf_mocose import MoCoSETrainingArguments

    with caplog.at_level(logging.WARNING, logger="hf_mocose.trainer.inputs"):
        trainer = MoCoSETrainer(model=tiny_encoder, args=MoCoSETrainingArguments(output_dir=str(tmp_path)))
    assert trainer.args.eval_strategy == "no" and "training without evaluation" in caplog.text
    with_pairs = MoCoSETrainer(model=tiny_encoder, args=MoCoSETrainingArguments(output_dir=str(tmp_path)),
                               eval_dataset=PAIRS)
    assert with_pairs.args.eval_strategy == "steps"
    with pytest.raises(ValueError, match="load_best_model_at_end needs STS pairs"):
        MoCoSETrainer(model=tiny_encoder, args=MoCoSETrainingArguments(output_dir=str(tmp_path),
                                                                       load_best_model_at_end=True, save_steps=100))


def test_the_model_source_is_checked_once_with_its_location(tiny_encoder, tmp_path, monkeypatch):
    """The id or folder is checked once, with `model_init_kwargs`' location (revision, subfolder, token): the
    tokenizer lookup that follows must not check it again without them (a private repo whose token is only in
    `model_init_kwargs`, or a cached pinned revision offline, would then fail after the model loaded)."""
    from hf_mocose.trainer import inputs

    calls = []
    monkeypatch.setattr(inputs, "check_model_source", lambda name, field="", location=None: calls.append(
        (name, dict(location or {}))))
    MoCoSETrainer(model=tiny_encoder, args=tiny_training_args(tmp_path, model_init_kwargs={"revision": "main"}))
    assert calls == [(tiny_encoder, {"revision": "main"})]

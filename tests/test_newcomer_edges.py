"""What a first-day user trips on (issue 30): each edge answered with one clear line or made to work."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_training_args


# ----------------------------------------------------------------------------- empty data, through Python
@pytest.mark.parametrize("texts, message", [
    ([], "train_dataset has no rows"),
    (["", "   ", "\n"], r"train_dataset has no non-empty sentences \(3 rows, all empty or blank\)"),
])
def test_python_door_refuses_empty_data_before_any_work(tiny_encoder, tmp_path, texts, message, monkeypatch):
    from datasets import Dataset

    from hf_mocose import MoCoSETrainer
    from hf_mocose.trainer import inputs

    loaded = []
    monkeypatch.setattr(inputs, "build_mocose_model", lambda *a, **k: loaded.append(a) or pytest.fail("model loaded"))
    output_dir = tmp_path / "run"
    with pytest.raises(ValueError, match=message):
        MoCoSETrainer(model=tiny_encoder, args=tiny_training_args(output_dir),
                      train_dataset=Dataset.from_dict({"text": texts}))
    assert not loaded and not output_dir.exists()


def test_python_door_drops_blank_sentences_as_the_command_line_does(tiny_encoder, tmp_path):
    from datasets import Dataset

    from hf_mocose import MoCoSETrainer

    trainer = MoCoSETrainer(model=tiny_encoder, args=tiny_training_args(tmp_path),
                            train_dataset=Dataset.from_dict({"text": ["A man plays a guitar.", " ", "Someone sings."]}))
    assert len(trainer.train_dataset) == 2


# ----------------------------------------------------------------------------- derived defaults
def test_queue_init_size_default_fits_any_queue(tmp_path, tiny_encoder):
    from hf_mocose import MoCoSEConfig, MoCoSEModel
    from hf_mocose.models.configuration import METHOD_DEFAULTS
    from hf_mocose.trainer.training_args import MoCoSETrainingArguments

    assert METHOD_DEFAULTS["queue_init_size"] is None
    small = MoCoSETrainingArguments(output_dir=str(tmp_path), use_cpu=True, queue_size=64)
    assert small.queue_init_size == 64  # min(128, K): never more than the queue holds
    assert MoCoSETrainingArguments(output_dir=str(tmp_path), use_cpu=True).queue_init_size == 128  # the paper's, K=512
    assert MoCoSETrainingArguments(output_dir=str(tmp_path), use_cpu=True, queue_size=64,
                                   queue_init_size=16).queue_init_size == 16  # a given value is kept
    assert MoCoSEConfig(queue_size=32).queue_init_size == 32
    model = MoCoSEModel.from_pretrained(tiny_encoder, **small.model_config_kwargs())
    assert model.config.queue_init_size == 64 and int(model.queue.queue_fill) == 64
    with pytest.raises(ValueError, match="queue_init_size"):  # an explicit impossible value is still refused
        MoCoSETrainingArguments(output_dir=str(tmp_path), use_cpu=True, queue_size=64, queue_init_size=65)


def test_st_loss_queue_init_size_default_fits_any_queue(tiny_encoder):
    from conftest import tiny_sentence_transformer

    from hf_mocose import MoCoSELoss

    loss = MoCoSELoss(tiny_sentence_transformer(tiny_encoder), queue_size=64)
    assert loss.settings["queue_init_size"] == 64 and int(loss.queue.queue_fill) == 64
    assert MoCoSELoss(tiny_sentence_transformer(tiny_encoder)).settings["queue_init_size"] == 128


def test_paper_recipes_set_queue_init_size_themselves():
    """The derived default must not change a paper recipe: each one that has a queue sets K_s."""
    import yaml

    recipes = Path(__file__).resolve().parents[1] / "training_args"
    for recipe in recipes.glob("*.yaml"):
        values = yaml.safe_load(recipe.read_text())
        if values.get("method", "mocose") != "simcse" and "queue_size" in values:
            assert "queue_init_size" in values, recipe.name

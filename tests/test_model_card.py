"""Model cards: rendered from model_cards/, parsed back by huggingface_hub, facts from the run and the eval JSON."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

from hf_mocose import MoCoSEModel
from hf_mocose.commands import cli
from hf_mocose.publishing.model_card import render_model_card, write_model_card
from hf_mocose.publishing.model_card import find_template, read_eval_results

# The `hf-mocose evaluate` JSON format (hf_mocose/evaluation/runner.py).
EVAL = {
    "sts12": {"spearman": 71.2, "pearson": 70.1, "n": 3108},
    "sts13": {"spearman": 81.5, "pearson": 80.9, "n": 1500},
    "sts14": {"spearman": 75.0, "pearson": 74.2, "n": 3750},
    "sts15": {"spearman": 82.3, "pearson": 81.8, "n": 3000},
    "sts16": {"spearman": 78.4, "pearson": 77.9, "n": 1186},
    "stsb": {"spearman": 77.7, "pearson": 76.6, "n": 1379},
    "sickr": {"spearman": 69.4, "pearson": 70.3, "n": 4927},
    "stsb_dev": {"spearman": 82.9, "pearson": 82.0, "n": 1500},
    "mr": {"accuracy": 80.25, "n": 10662},
    "avg": 76.5,
    "avg_over": ["sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr"],
    "seconds": {"sts12": 1.0},
}


@pytest.fixture(scope="module")
def run(tiny_encoder, tmp_path_factory):
    """A fake training run: output dir with training_args.json and trainer_state.json, final/ checkpoint, export."""
    from transformers import AutoTokenizer

    from hf_mocose.publishing.export import export_to_sentence_transformers

    out = tmp_path_factory.mktemp("run")
    model = MoCoSEModel.from_encoder(tiny_encoder, sentence_pooling="cls_dense", queue_size=8, queue_init_size=4,
                                     max_seq_length=16)
    with torch.no_grad():
        model.online_pooler.weight.add_(0.05)
    model.save_pretrained(out / "final")
    AutoTokenizer.from_pretrained(tiny_encoder).save_pretrained(out / "final")
    # training_args.json as MoCoSETrainer wrote it before card_facts.json, without world_size: an older record.
    args = dict(ema_decay_start=0.75, ema_decay_end=0.95, fgsm_mode="previous", fgsm_epsilon=5e-9,
                fgsm_views="both", per_device_train_batch_size=4, gradient_accumulation_steps=1,
                learning_rate=3e-5, num_train_epochs=1.0, seed=42)
    (out / "training_args.json").write_text(json.dumps(args))
    state = {"global_step": 120, "max_steps": 120, "log_history": [{"loss": 1.0}, {"train_runtime": 3723.4}]}
    (out / "trainer_state.json").write_text(json.dumps(state))
    (out / "eval.json").write_text(json.dumps(EVAL))
    export = export_to_sentence_transformers(out / "final", out / "st", write_card=False)
    return out, export, model


def test_card_renders_parses_and_carries_results(run):
    out, export, _ = run
    path = write_model_card(export, checkpoint=out / "final", eval_results=out / "eval.json", repo_id="alice/mocose-tiny",
                            base_model="bert-base-uncased", datasets=["princeton-nlp/datasets-for-simcse"])
    card = ModelCard.load(path)
    data = card.data
    assert data.library_name == "sentence-transformers" and data.pipeline_tag == "sentence-similarity"
    assert {"sentence-transformers", "sentence-similarity", "feature-extraction", "mocose"} <= set(data.tags)
    assert data.base_model == "bert-base-uncased" and data.datasets == ["princeton-nlp/datasets-for-simcse"]
    assert data.language == ["en"] and data.license == "apache-2.0" and data.model_name == "mocose-tiny"
    # sentence-transformers' model-index convention: spearman_cosine / pearson_cosine in [-1, 1]
    results = {(r.dataset_type, r.metric_type): r.metric_value for r in data.eval_results}
    assert {r.task_type for r in data.eval_results} == {"semantic-similarity", "text-classification"}
    for task in ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr", "stsb_dev"):
        assert results[(task, "spearman_cosine")] == pytest.approx(EVAL[task]["spearman"] / 100)
        assert results[(task, "pearson_cosine")] == pytest.approx(EVAL[task]["pearson"] / 100)
    assert results[("sts-avg", "spearman_cosine")] == 0.765 and results[("mr", "accuracy")] == 0.8025
    text = card.text
    assert 'SentenceTransformer("alice/mocose-tiny")' in text and 'snapshot_download("alice/mocose-tiny")' in text
    assert "| **Average (7 STS)** | **76.50** |" in text and "| MoCoSE paper, average¹ | 77.27 |" in text
    assert "picked on the STS *test* sets" in text and "optimistic" in text  # the paper selected on test
    # Hyper-parameters from config.json and training_args.json, run facts from trainer_state.json.
    for row in ("| queue size K | 8 |", "| initial queue size K_s (random keys) | 4 |", "| temperature τ | 0.05 |",
                "| EMA decay η at the end of the cosine ramp | 0.95 |", "| FGSM epsilon | 5e-09 |",
                "| FGSM mode | previous |", "| batch size per device | 4 |"):
        assert row in text
    assert "d_trace = 1/(1−η_end) + K/B = **22.00**" in text  # 1/(1-0.95) + 8/4
    assert "**Optimizer steps:** 120 of 120" in text and "1h 02m 03s" in text
    assert "Exploring the Impact of Negative Samples of Contrastive Learning" in text
    assert "### Framework Versions" in text and "- Sentence Transformers: " in text


def test_partial_average_is_labelled_and_not_compared(run):
    out, export, _ = run
    partial = {"sts12": {"spearman": 70.0, "pearson": 69.0}, "stsb": {"spearman": 80.0, "pearson": 79.0},
               "avg": 75.0, "avg_over": ["sts12", "stsb"]}
    card = render_model_card(export, out / "final", partial, base_model="bert-base-uncased")
    assert "| **Average over STS12, STS-B** | **75.00** |" in card.text
    assert "MoCoSE paper" not in card.text
    assert {r.dataset_type for r in card.data.eval_results} == {"sts12", "stsb", "sts-partial-avg"}


# Longer than the training length (16) and than the export's max_seq_length (128, the tiny encoder's limit).
LONG_SENTENCES = [
    "A woman slices an onion in the kitchen while the radio plays an old song about the sea and the wind " * 3,
    "Contrastive learning with a momentum encoder and a queue of negatives, " * 11,
    "Two dogs run.",
]


def run_card_snippet(text: str, model_dir: str, sentences: list[str] | None = None) -> dict:
    """Executes the card's transformers-only snippet (optionally on other sentences); returns its variables."""
    code = re.search(r"### transformers only.*?```python\n(.*?)```", text, re.S).group(1)
    if sentences is not None:
        code, n = re.subn(r"^sentences = \[.*\]$", f"sentences = {sentences!r}", code, flags=re.M)
        assert n == 1, code
    namespace = {}
    exec(code.replace("path/to/st-export", model_dir), namespace)  # noqa: S102 - our own rendered snippet
    return namespace


@pytest.mark.parametrize("pooling", ["cls_dense", "mean"])
def test_transformers_snippet_reproduces_sentence_transformers(run, tiny_encoder, tmp_path, pooling):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    from hf_mocose.publishing.export import export_to_sentence_transformers

    model = MoCoSEModel.from_encoder(tiny_encoder, sentence_pooling=pooling, queue_size=8, queue_init_size=4,
                                     max_seq_length=16)
    model.save_pretrained(tmp_path / "ckpt")
    tokenizer = AutoTokenizer.from_pretrained(tiny_encoder)
    tokenizer.save_pretrained(tmp_path / "ckpt")
    export = export_to_sentence_transformers(tmp_path / "ckpt", tmp_path / "st-export", verify=False)
    text = (export / "README.md").read_text()
    assert 'model_dir = "path/to/st-export"' in text and "max_length=128" in text
    st_model = SentenceTransformer(str(export), device="cpu")
    assert st_model.max_seq_length == 128
    assert max(len(ids) for ids in tokenizer(LONG_SENTENCES)["input_ids"]) > 128
    for sentences in (None, LONG_SENTENCES):  # the card's own sentences, then long ones
        namespace = run_card_snippet(text, str(export), sentences)
        want = st_model.encode(namespace["sentences"], convert_to_tensor=True)
        assert (namespace["embeddings"] - want.cpu()).abs().max().item() < 1e-5


def test_hub_snippet_reproduces_sentence_transformers_on_long_inputs(run, tmp_path, monkeypatch):
    import huggingface_hub
    from sentence_transformers import SentenceTransformer

    out, export, _ = run
    text = str(render_model_card(export, out / "final", repo_id="alice/mocose-tiny"))
    assert 'snapshot_download("alice/mocose-tiny")' in text and "max_length=128" in text  # not the training 16
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id: str(export))  # the Hub, offline
    namespace = run_card_snippet(text, str(export), LONG_SENTENCES)
    want = SentenceTransformer(str(export), device="cpu").encode(LONG_SENTENCES, convert_to_tensor=True)
    assert (namespace["embeddings"] - want.cpu()).abs().max().item() < 1e-5


def test_card_states_inference_and_training_lengths(run):
    out, export, _ = run
    text = render_model_card(export, out / "final").text
    assert "**Maximum Sequence Length:** 128 tokens at inference (longer inputs are truncated); training used 16 tokens" in text
    assert "| training sequence length (tokens) | 16 |" in text
    assert "Inputs longer than 128 tokens are truncated" in text
    assert "Training saw only the first 16 tokens of each sentence" in text
    assert "as in training" not in text and "the training length; longer texts" not in text


def test_card_without_results_or_training_run(run, tmp_path):
    _, export, _ = run
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    config = json.loads((run[0] / "final" / "config.json").read_text())
    config["method"] = "simcse"
    (checkpoint / "config.json").write_text(json.dumps(config))
    card = render_model_card(export, checkpoint)
    assert card.data.eval_results is None and card.data.base_model is None  # a local path is not a Hub id
    assert "simcse" in card.data.tags
    assert "No evaluation results were given" in card.text and "were not found next to the checkpoint" in card.text
    assert "SimCSE: Simple Contrastive Learning" in card.text.replace("{", "").replace("}", "")
    assert "Exploring the Impact of Negative Samples" in card.text


def test_custom_template_and_missing_template(run, tmp_path):
    out, export, _ = run
    template = tmp_path / "mine.md.j2"
    template.write_text("---\n{{ card_data }}\n---\n\n# Custom card for {{ title }}: {{ sentence_pooling }}\n")
    card = render_model_card(export, out / "final", template=template)
    assert card.text.strip() == "# Custom card for st: cls_dense" and card.data.library_name == "sentence-transformers"
    with pytest.raises(FileNotFoundError, match="nope.md.j2"):
        render_model_card(export, out / "final", template="nope.md.j2")
    assert find_template() == Path(__file__).resolve().parents[1] / "model_cards" / "mocose.md.j2"


def test_eval_results_inputs(tmp_path):
    trainer_metrics = read_eval_results({"eval_stsb_spearman": 81.0, "eval_stsb_pearson": 80.0, "epoch": 1.0})
    assert trainer_metrics["sts"] == {"stsb_dev": {"spearman": 81.0, "pearson": 80.0, "n": None, "spearman_all": 81.0}}
    assert trainer_metrics["avg"] is None
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        read_eval_results(bad)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        read_eval_results(tmp_path / "missing.json")


def test_cli_export_writes_the_card(run, tmp_path, capsys):
    out, _, _ = run
    original = cli.COMMAND_MODULES
    cli.COMMAND_MODULES = ("hf_mocose.publishing.commands",)
    try:
        code = cli.main(["export", str(out / "final"), str(tmp_path / "exp"), "--eval_results", str(out / "eval.json"),
                         "--repo_id", "alice/tiny", "--dataset", "princeton-nlp/datasets-for-simcse"])
    finally:
        cli.COMMAND_MODULES = original
    assert code == 0, capsys.readouterr().err
    card = ModelCard.load(tmp_path / "exp" / "README.md")
    assert card.data.model_name == "tiny" and card.data.datasets == ["princeton-nlp/datasets-for-simcse"]
    assert any(r.dataset_type == "stsb" and r.metric_value == 0.777 for r in card.data.eval_results)


def test_reference_switches_are_on_the_card(run, tmp_path):
    """The seed-reading switches of a checkpoint (`shared_embeddings`, `projection_dim`, `head_init`) reach the card."""
    _, export, _ = run
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    config = json.loads((run[0] / "final" / "config.json").read_text())
    config.update(shared_embeddings="module", projection_dim=16, head_init="random")
    (checkpoint / "config.json").write_text(json.dumps(config))
    text = render_model_card(export, checkpoint).text
    assert "| embeddings shared with the target | module |" in text
    assert "| projection (key and queue) width | 16 |" in text
    assert "| head initialisation | random |" in text


def test_method_family_switches_and_citations(run, tmp_path):
    _, export, _ = run
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    config = json.loads((run[0] / "final" / "config.json").read_text())
    config["method"] = "ifcl"
    (checkpoint / "config.json").write_text(json.dumps(config))
    args = argparse.Namespace(ema_decay_start=0.75, ema_decay_end=0.95, per_device_train_batch_size=4,
                              hard_negatives="una", una_frequency=5, queue_slice=None, token_cutoff=0.1)
    card = render_model_card(export, checkpoint, training_args=args)
    text = card.text.replace("{", "").replace("}", "")
    assert "Identical and Fraternal Twins" in text and "Unsupervised hard Negative Augmentation" in text
    assert "una" in card.data.tags and "ifcl" in card.data.tags
    assert "UNA negatives every f steps" in text and "token cutoff rate" in text
    assert "negatives: queue ages" not in text  # switches left off are not listed
    assert "EMA ramp length" not in text and "UNA sentences used as" not in text  # not recorded: not claimed


def test_esimcse_is_cited_and_its_repetition_rate_shown(run, tmp_path):
    _, export, _ = run
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    config = json.loads((run[0] / "final" / "config.json").read_text())
    config.update(method="esimcse", predictor_layers=0)
    (checkpoint / "config.json").write_text(json.dumps(config))
    args = argparse.Namespace(ema_decay_start=0.995, ema_decay_end=0.995, word_repetition_rate=0.32)
    card = render_model_card(export, checkpoint, training_args=args)
    assert "ESimCSE: Enhanced Sample Building Method" in card.text.replace("{", "").replace("}", "")
    assert "esimcse" in card.data.tags
    assert "| word repetition rate (positive view) | 0.32 |" in card.text


def test_seed_settings_are_on_the_card(run, tmp_path):
    """The settings that tell the paper's and the reference code's variants apart are shown when set."""
    out, export, _ = run
    args = argparse.Namespace(ema_decay_start=0.75, ema_decay_end=1.0, ema_decay_horizon=15000, token_shuffle=True,
                              augmentation_views="both", hard_negatives="una", una_frequency=5, una_usage="paper")
    text = render_model_card(export, out / "final", training_args=args).text
    for row in ("| EMA ramp length (optimizer steps) | 15000 |", "| views the embedding augmentations reach | both |",
                "| UNA sentences used as | paper |"):
        assert row in text
    plain = argparse.Namespace(ema_decay_start=0.75, ema_decay_end=0.95, ema_decay_horizon=None,
                               augmentation_views="both", hard_negatives=None, una_usage="paper")
    text = render_model_card(export, out / "final", training_args=plain).text
    assert "EMA ramp length" not in text and "augmentations reach" not in text and "UNA sentences" not in text


class _RunsWhenUnpickled:
    """A pickle payload that leaves a file behind if anything ever unpickles it."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path(self.marker).write_text, ("unpickled",))


def test_card_never_unpickles_training_args_bin(run, tmp_path):
    """A run folder from before training_args.json: the card omits the arguments, says why, runs nothing."""
    out, export, _ = run
    old_run = tmp_path / "old-run"
    checkpoint = old_run / "checkpoint-5"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text((out / "final" / "config.json").read_text())
    marker = tmp_path / "unpickled.txt"
    torch.save(_RunsWhenUnpickled(marker), checkpoint / "training_args.bin")
    text = render_model_card(export, checkpoint).text
    assert not marker.exists()
    assert "were not found next to the checkpoint (`training_args.json`)" in text
    assert "its `training_args.bin` is a pickle and is not read" in text
    assert "| FGSM mode |" not in text and "| queue size K | 8 |" in text  # model rows still come from config.json


def test_card_facts_json_is_what_the_card_reads(run, tmp_path):
    """`save_card_facts` (called by MoCoSETrainer._save) records the card's fields, no secrets, and the
    process count, so the global batch size on the card is exact."""
    from types import SimpleNamespace

    from transformers import TrainerState

    from hf_mocose.publishing.card_facts import CARD_FACTS_JSON, save_card_facts
    from hf_mocose.trainer.training_args import MoCoSETrainingArguments

    out, export, _ = run
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text((out / "final" / "config.json").read_text())
    args = MoCoSETrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, ema_decay_end=0.9,
                                   hub_token="hf_secret", report_to="none", use_cpu=True)
    save_card_facts(checkpoint, SimpleNamespace(args=args, state=TrainerState()))  # what the trainer's _save passes
    record = json.loads((checkpoint / CARD_FACTS_JSON).read_text())["training_args"]
    assert record["ema_decay_end"] == 0.9 and record["world_size"] == 1 and record["lr_scheduler_type"] == "linear"
    assert "hf_secret" not in (checkpoint / CARD_FACTS_JSON).read_text()
    text = render_model_card(export, checkpoint).text
    assert "| EMA decay η at the end of the cosine ramp | 0.9 |" in text
    assert "(B = 4 sentences per optimizer step)" in text  # recorded world_size: nothing assumed


def test_trainer_card_keywords_have_transformers_meaning(run):
    from hf_mocose.publishing.model_card import card_kwargs_from_trainer_keywords

    out, export, _ = run
    card_kwargs = card_kwargs_from_trainer_keywords(
        model_name="My model", tags="my-tag", tasks="sentence-similarity", finetuned_from="bert-base-uncased",
        dataset_tags="princeton-nlp/datasets-for-simcse", dataset="wiki1m", dataset_args="wiki1m_for_simcse.txt",
        language="de", license="mit")
    card = render_model_card(export, out / "final", repo_id="alice/mocose-tiny", **card_kwargs)
    data = card.data
    assert "my-tag" in data.tags and not {"m", "y", "-"} & set(data.tags)  # a string is one tag
    assert data.base_model == "bert-base-uncased" and data.datasets == ["princeton-nlp/datasets-for-simcse"]
    assert data.language == ["de"] and data.license == "mit"
    assert card.text.startswith("\n# My model") or "# My model\n" in card.text
    assert "**Training Dataset:** wiki1m (wiki1m_for_simcse.txt)" in card.text
    assert {"sentence-transformers", "sentence-similarity", "feature-extraction", "mocose"} <= set(data.tags)
    with pytest.raises(ValueError, match="finetuned_from='a/b' and base_model='c/d'"):
        card_kwargs_from_trainer_keywords(finetuned_from="a/b", base_model="c/d")

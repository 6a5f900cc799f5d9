"""The exported card holds every section a sentence-transformers v6 card has, rendered from a tiny real run.

A `MoCoSETrainer` trains 4 steps on raw sentences with an STS evaluation every 2 steps and the best checkpoint
kept; its export's card is checked section by section: training logs (best step marked), hyper-parameters (no
value printed as None), training data (size, token lengths, samples), usage output and widget, framework
versions, citations, architecture, and the model-index in sentence-transformers' convention. The same card
is written again later from the checkpoint's files alone, as `hf-mocose export` does.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

import pytest
from conftest import tiny_training_args
from huggingface_hub import ModelCard

N_SENTENCES = 24
STS_PAIRS = {  # a few STS-like pairs, so the run logs an STS-B dev Spearman (the metric's name) without SentEval
    "sentence1": ["A man plays a guitar.", "A dog runs in the park.", "The sky is blue.", "A woman cooks dinner.",
                  "Kids play football.", "The train is late."],
    "sentence2": ["Someone plays an instrument.", "A cat sleeps on a sofa.", "The sky is clear and blue.",
                  "A woman prepares a meal.", "Children kick a ball.", "Stock prices fell sharply."],
    "score": [4.2, 0.6, 4.6, 4.4, 4.0, 0.2],
}


@pytest.fixture(scope="module")
def tiny_run(tiny_encoder, tmp_path_factory):
    """(trainer, export folder, eval metrics) of a 4-step run whose final model is the best checkpoint."""
    from datasets import Dataset

    from hf_mocose import MoCoSETrainer
    from hf_mocose.data.corpus import python_docs_sentences
    from hf_mocose.publishing.hub import publish_final_model

    out = tmp_path_factory.mktemp("card-run")
    args = tiny_training_args(out, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
                              load_best_model_at_end=True, metric_for_best_model="stsb_spearman", logging_steps=1)
    sentences = python_docs_sentences()[:N_SENTENCES]
    trainer = MoCoSETrainer(model=tiny_encoder, args=args, train_dataset=Dataset.from_dict({"text": sentences}),
                            eval_dataset=Dataset.from_dict(STS_PAIRS))
    trainer.train()
    trainer.save_model(str(out / "final"))
    metrics = trainer.evaluate()
    export = publish_final_model(trainer, out / "final", eval_results=metrics, corpus="Python docs (24 sentences)",
                                 push=False)
    return trainer, export, metrics, sentences


def card_of(export):
    return ModelCard.load(export / "README.md")


def first_table(text: str, heading: str) -> tuple[list[str], list[list[str]]]:
    """`(header, rows)` of the first markdown table after the line `heading`, cells stripped."""
    lines = text[text.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    header, _, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[start:end]]
    return header, rows


def test_training_logs_table_marks_the_best_step(tiny_run):
    trainer, export, _, _ = tiny_run
    text = card_of(export).text
    header, rows = first_table(text, "### Training Logs")
    assert header == ["Epoch", "Step", "Training Loss", "STS-B dev Spearman"]
    steps = [row[1].strip("*") for row in rows]
    assert steps == ["1", "2", "3", "4"]
    logged = {entry["step"]: entry for entry in trainer.state.log_history if "eval_stsb_spearman" in entry}
    best = trainer.state.best_global_step
    assert best in (2, 4) and set(logged) == {2, 4}
    for row in rows:
        step = int(row[1].strip("*"))
        assert (row[1] == f"**{step}**") == (step == best)  # the best step's row is bold, and only it
        if step in logged:
            assert float(row[3].strip("*")) == pytest.approx(logged[step]["eval_stsb_spearman"], abs=1e-4)
        else:
            assert row[3] == "-"
    assert "The bold row is the best checkpoint by STS-B dev Spearman, the one exported here" in text


def test_every_hyperparameter_has_its_value(tiny_run):
    trainer, export, _, _ = tiny_run
    text = card_of(export).text
    header, rows = first_table(text, "### Training Hyperparameters")
    rows = dict(rows)
    args = trainer.args
    assert rows["learning rate of the heads (pooler, projection, predictor)"] == str(args.head_learning_rate)
    assert rows["FGSM epsilon"] == str(args.fgsm_epsilon)
    assert rows["FGSM epsilon unit"].startswith(args.fgsm_epsilon_unit)
    assert rows["optimizer"] == str(getattr(args.optim, "value", args.optim))
    assert rows["gradient clipping (max norm)"] == str(args.max_grad_norm)
    assert rows["mixed precision"] == "no (fp32)"
    assert rows["predictor width"] == "32 (the key width)"  # predictor_dim None: the width used, in numbers
    assert rows["projection (key and queue) width"] == "32 (the encoder's hidden size)"
    assert rows["processes"] == "1" and rows["checkpoint exported"].startswith("the best by stsb_spearman")
    assert "None" not in rows.values() and not re.search(r"\|\s*None\s*\|", text)
    assert "<summary>All training arguments</summary>" in text and f"- `max_grad_norm`: {args.max_grad_norm}" in text
    assert "output_dir" not in text.split("All training arguments")[1].split("</details>")[0]  # not a hyper-parameter


def test_training_data_size_lengths_and_samples(tiny_run):
    from transformers import AutoTokenizer

    trainer, export, _, sentences = tiny_run
    text = card_of(export).text
    assert f"* Size: {N_SENTENCES} training sentences" in text and "* Columns: <code>text</code>" in text
    tokenizer = AutoTokenizer.from_pretrained(export)
    lengths = [len(ids) for ids in tokenizer(sentences, truncation=True, max_length=16)["input_ids"]]
    longer = sum(len(ids) > 16 for ids in tokenizer(sentences)["input_ids"])
    assert (f"<li>min: {min(lengths)} tokens</li><li>mean: {round(sum(lengths) / len(lengths), 2)} tokens</li>"
            f"<li>max: {max(lengths)} tokens</li>") in text
    assert f"truncated at 16; {longer} of them were longer" in text
    for sentence in sentences[:3]:
        assert f"<code>{sentence.replace('|', chr(92) + '|')}</code>" in text


def test_usage_snippet_shows_its_output_and_the_yaml_has_a_widget(tiny_run):
    from sentence_transformers import SentenceTransformer

    _, export, _, _ = tiny_run
    card = card_of(export)
    snippet = re.search(r"### Direct Usage \(Sentence Transformers\).*?```python\n(.*?)```", card.text, re.S).group(1)
    model = SentenceTransformer(str(export), device="cpu")
    dimension = model.get_embedding_dimension()
    assert f"print(embeddings.shape)\n# [3, {dimension}]" in snippet
    sentences = re.findall(r"^    '(.*)',$", snippet, re.M)
    similarity = model.similarity(model.encode(sentences[:2]), model.encode(sentences[:2]))[0, 1].item()
    assert f"# tensor([[1.0000, {similarity:.4f}," in snippet  # the printed similarity is this model's
    assert re.search(r'# Load the model folder\nmodel = SentenceTransformer\("path/to/card-run\d*"\)', snippet)
    widget = card.data.widget
    assert widget and widget[0]["source_sentence"] == sentences[0] and len(widget[0]["sentences"]) == 3


def test_framework_versions_citations_and_architecture(tiny_run):
    from importlib.metadata import version

    from sentence_transformers import SentenceTransformer

    _, export, _, _ = tiny_run
    text = card_of(export).text
    for label, package in (("Sentence Transformers", "sentence-transformers"), ("Transformers", "transformers"),
                           ("PyTorch", "torch"), ("Accelerate", "accelerate"), ("Datasets", "datasets"),
                           ("Tokenizers", "tokenizers"), ("hf-mocose", "hf-mocose")):
        assert f"- {label}: {version(package)}" in text
    assert f"- Python: {platform.python_version()}" in text
    assert "reimers-2019-sentence-bert" in text and "cao-etal-2022-exploring" in text  # Sentence-BERT and MoCoSE
    model = SentenceTransformer(str(export), device="cpu")
    assert f"```\n{model}\n```" in text and "(1): Pooling({'embedding_dimension': 32, 'pooling_mode': 'cls'" in text
    assert f"**Output Dimensionality:** {model.get_embedding_dimension()} dimensions" in text
    assert f"**Maximum Sequence Length:** {model.max_seq_length} tokens" in text
    assert "**Similarity Function:** Cosine Similarity" in text


def test_model_index_uses_sentence_transformers_metric_names(tiny_run):
    _, export, metrics, _ = tiny_run
    data = card_of(export).data
    dev = {r.metric_type: r.metric_value for r in data.eval_results if r.dataset_type == "stsb_dev"}
    assert dev == {"spearman_cosine": pytest.approx(metrics["eval_stsb_spearman"] / 100, abs=1e-6),
                   "pearson_cosine": pytest.approx(metrics["eval_stsb_pearson"] / 100, abs=1e-6)}
    assert all(-1 <= value <= 1 for value in dev.values())


def test_a_later_offline_export_of_a_checkpoint_writes_the_same_sections(tiny_run, tmp_path):
    """`hf-mocose export checkpoint-N` reads the run's facts from the checkpoint (card_facts.json)."""
    from hf_mocose.publishing.export import export_to_sentence_transformers

    trainer, _, _, _ = tiny_run
    checkpoint = Path(trainer.args.output_dir) / "checkpoint-2"
    assert (checkpoint / "card_facts.json").is_file()
    text = card_of(export_to_sentence_transformers(checkpoint, tmp_path / "later", verify=False)).text
    assert "### Training Logs" in text and f"* Size: {N_SENTENCES} training sentences" in text
    assert "### Framework Versions" in text and "### Full Model Architecture" in text


def test_training_data_description_of_a_tokenised_set_and_a_stream(tiny_encoder):
    """Without the text (a tokenised set) the samples are the decoded tokens, said so; a stream has no size."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from hf_mocose.data.corpus import tokenize_sentences
    from hf_mocose.publishing.card_facts import describe_training_data

    tokenizer = AutoTokenizer.from_pretrained(tiny_encoder)
    raw = Dataset.from_dict({"text": ["Short one.", "A somewhat longer sentence, with more words in it."]})
    tokens = tokenize_sentences(raw, tokenizer, 8)
    described = describe_training_data(tokens, tokenizer, 8)
    assert described["samples_from_tokens"] and described["samples"][0] == "short one."
    assert described["token_lengths"]["longer"] is None and described["token_lengths"]["max"] == 8
    streamed = describe_training_data(raw.to_iterable_dataset(), tokenizer, 8)
    assert streamed["sentences"] is None and streamed["samples"] == raw["text"]
    assert streamed["token_lengths"]["longer"] == 1
    assert describe_training_data(None, tokenizer, 8) is None

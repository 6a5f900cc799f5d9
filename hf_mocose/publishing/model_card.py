"""Model cards of exported MoCoSE models: sentence-transformers' card data on the loaded export, our layout.

The export is loaded as a `SentenceTransformer` and registered with `SentenceTransformerModelCardData`
(`MoCoSEModelCardData`), whose `to_dict()` gives what every sentence-transformers card has (architecture, output
dimension, max length, similarity function, usage snippet with its output, training-logs table with the best step,
versions, Sentence-BERT citation, YAML with `widget:`). What it would do online is set directly (docs/design.md):
`local_files_only=True`, `base_model` from the checkpoint's record, `datasets` from the given ids, the model-index
from the evaluation JSON in its convention (`spearman_cosine` in [-1, 1]). What the card states about the run comes
from the facts collected while it trained (`card_facts`); nothing is guessed. The layout is
`model_cards/mocose.md.j2` (installed: `hf_mocose/templates/`); the card is rendered and parsed back by
`huggingface_hub.ModelCard`, so bad YAML fails here, not on the Hub. `render_model_card` also takes
`Trainer.create_model_card`'s keywords with transformers' meaning (`card_kwargs_from_trainer_keywords`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from sentence_transformers import SentenceTransformerModelCardData

from .card_facts import STS_TASKS, STSB_DEV, TASK_NAMES, TRAINING_LOSS, TRANSFER_TASKS, _read_json, load_card_facts
from .card_facts import read_eval_results as read_eval_results  # the evaluation JSON, read for the card
from .card_facts import training_details

DEFAULT_TEMPLATE = "mocose.md.j2"
# Usage snippet (the first three, encoded for the printed output) and Hub widget (a source and three others).
USAGE_SENTENCES = ("A man is playing a guitar.", "Someone is playing an instrument.", "A woman is slicing an onion.",
                   "The weather is lovely today.")
# Average Spearman over the 7 STS tasks reported by the MoCoSE paper (Cao et al., 2022).
PAPER_STS_AVG = {"bert-base-uncased": 77.27, "google-bert/bert-base-uncased": 77.27,
                 "bert-large-uncased": 79.13, "google-bert/bert-large-uncased": 79.13}
CITATIONS = {
    "mocose": """@inproceedings{cao-etal-2022-exploring,
    title = "Exploring the Impact of Negative Samples of Contrastive Learning: A Case Study of Sentence Embedding",
    author = "Cao, Rui and Wang, Yihao and Liang, Yuxin and Gao, Ling and Zheng, Jie and Ren, Jie and Wang, Zheng",
    booktitle = "Findings of the Association for Computational Linguistics: ACL 2022",
    year = "2022",
    publisher = "Association for Computational Linguistics",
}""",
    "simcse": """@inproceedings{gao-etal-2021-simcse,
    title = "{S}im{CSE}: Simple Contrastive Learning of Sentence Embeddings",
    author = "Gao, Tianyu and Yao, Xingcheng and Chen, Danqi",
    booktitle = "Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing",
    year = "2021",
    publisher = "Association for Computational Linguistics",
}""",
    "ifcl": """@inproceedings{xiao-li-chen-2023-ifcl,
    title = "Identical and Fraternal Twins: Fine-Grained Semantic Contrastive Learning of Sentence Representations",
    author = "Xiao, Qingfa and Li, Shuangyin and Chen, Lei",
    booktitle = "Proceedings of the 26th European Conference on Artificial Intelligence (ECAI 2023)",
    year = "2023",
}""",
    "una": """@misc{shu-lampos-una,
    title = "Unsupervised hard Negative Augmentation for contrastive learning",
    author = "Shu, Yuxuan and Lampos, Vasileios",
    year = "2024",
    note = "arXiv preprint",
}""",
}
CITATION_NAMES = {"mocose": "MoCoSE", "simcse": "SimCSE", "ifcl": "IFCL", "una": "UNA"}


def mocose_eval_results(results: dict[str, Any]) -> list:
    """`EvalResult`s of `read_eval_results`' dict in sentence-transformers' convention: STS as `spearman_cosine` /
    `pearson_cosine` in [-1, 1], task "Semantic Similarity", as `EmbeddingSimilarityEvaluator` names them on every
    sentence-transformers model; transfer tasks as `accuracy` in [0, 1]."""
    from huggingface_hub import EvalResult

    sts = dict(task_type="semantic-similarity", task_name="Semantic Similarity")
    evals = [EvalResult(**sts, dataset_type=task, dataset_name=f"{TASK_NAMES[task]} (SentEval)",
                        dataset_split="validation" if task == "stsb_dev" else "test", metric_type=f"{metric}_cosine",
                        metric_name=f"{metric.capitalize()} Cosine", metric_value=round(float(scores[metric]) / 100, 6))
             for task, scores in results["sts"].items() for metric in ("spearman", "pearson")
             if scores.get(metric) is not None]
    if results["avg"] is not None:
        evals.append(EvalResult(**sts, dataset_type="sts-avg" if results["avg_complete"] else "sts-partial-avg",
                                dataset_name=f"{results['avg_label']} (SentEval)", dataset_split="test",
                                metric_type="spearman_cosine", metric_name="Spearman Cosine",
                                metric_value=round(results["avg"] / 100, 6)))
    return evals + [EvalResult(task_type="text-classification", task_name="SentEval transfer", dataset_type=task,
                               dataset_name=f"{TASK_NAMES[task]} (SentEval)", metric_type="accuracy",
                               metric_name="Accuracy", metric_value=round(accuracy / 100, 6))
                    for task, accuracy in results["transfer"].items()]


@dataclass
class MoCoSEModelCardData(SentenceTransformerModelCardData):
    """`SentenceTransformerModelCardData` plus a model-index from an evaluation JSON (`eval_results`);
    `local_path_snippet`: the usage snippet loads a local folder (`model_id`), it downloads nothing."""

    eval_results: list = field(default_factory=list)  # huggingface_hub EvalResult, see `mocose_eval_results`
    local_path_snippet: bool = False

    def to_dict(self) -> dict[str, Any]:
        from huggingface_hub.repocard_data import eval_results_to_model_index

        data = super().to_dict()  # also cached for `to_yaml`, which reads the same dict
        if self.eval_results:
            data["model-index"] = eval_results_to_model_index(self.model_name, self.eval_results)
            data["metrics"] = list(dict.fromkeys(result.metric_type for result in self.eval_results))
        return data

    def generate_usage_snippet(self) -> str:
        snippet = super().generate_usage_snippet()
        return snippet.replace("# Download from the 🤗 Hub\n", "# Load the model folder\n") if self.local_path_snippet \
            else snippet


def training_data_tables(training_data: dict[str, Any] | None) -> dict[str, str] | None:
    """The card's statistics and samples tables of the training data, as sentence-transformers draws them
    (columns = the data's columns, cells through its own example formatting)."""
    from sentence_transformers.base.model_card import BaseModelCardData
    from transformers.modelcard import make_markdown_table

    if not training_data:
        return None
    lengths, column = training_data["token_lengths"], training_data["columns"][0]
    details = (f"<ul><li>min: {lengths['min']} tokens</li><li>mean: {lengths['mean']} tokens</li>"
               f"<li>max: {lengths['max']} tokens</li></ul>")
    stats = make_markdown_table([{"": "type", column: "string"}, {"": "details", column: details}])
    samples = make_markdown_table([{column: f"<code>{BaseModelCardData._format_example_value(text)}</code>"}
                                   for text in training_data["samples"]])
    return {"stats_table": stats.replace("-:|", "--|"), "examples_table": samples.replace("-:|", "--|")}


def find_template(template: str | os.PathLike | None = None) -> Path:
    """The card template: `template` if it is a file, else that name (default `mocose.md.j2`)
    in the repository's `model_cards/` folder (source checkouts) or the installed package data."""
    if template is not None and Path(template).is_file():
        return Path(template)
    name = DEFAULT_TEMPLATE if template is None else str(template)
    candidates = [Path(__file__).resolve().parents[2] / "model_cards" / name,
                  Path(str(resources.files("hf_mocose") / "templates" / name))]
    found = next((candidate for candidate in candidates if candidate.is_file()), None)
    if found is None:
        raise FileNotFoundError(f"Model card template {name!r} not found (looked in: {', '.join(map(str, candidates))}).")
    return found


def as_list(value) -> list:
    """None -> [], a string -> [that string] (one tag, not its characters), a list or tuple -> a list."""
    return [] if value is None else [value] if isinstance(value, str) else list(value)


# transformers' `create_model_card` name -> the `render_model_card` argument with the same meaning (ours came first).
_SAME_MEANING = {"finetuned_from": "base_model", "dataset_tags": "datasets", "dataset": "corpus"}


def card_kwargs_from_trainer_keywords(**kwargs) -> dict[str, Any]:
    """Maps `Trainer.create_model_card`'s keywords onto `render_model_card`'s, with transformers' meaning:
    `finetuned_from` is the `base_model`, `dataset_tags` the metadata `datasets`, `dataset` the text's `corpus`,
    `dataset_args` their configurations; `tasks` become tags (the `pipeline_tag` stays sentence-similarity, which
    sentence-transformers' loader and the Hub widget need); `tags` may be a string (one tag). Both names of one
    thing with different values are a `ValueError` naming both."""
    card = dict(kwargs)
    for trainer_name, ours in _SAME_MEANING.items():
        value = card.pop(trainer_name, None)
        if value is None:
            continue
        value = ", ".join(as_list(value)) if ours == "corpus" else (as_list(value) if ours == "datasets" else value)
        if card.get(ours) not in (None, (), []) and card[ours] != value:
            raise ValueError(f"{trainer_name}={kwargs[trainer_name]!r} and {ours}={card[ours]!r} say the same thing "
                             "differently: give one of them.")
        card[ours] = value
    return {name: as_list(value) if name in ("tags", "tasks", "dataset_args") else value for name, value in card.items()}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _is_hub_id(value: str | None) -> bool:
    """A Hub model id (`name` or `namespace/name`), not a local folder, can go in `base_model`."""
    return bool(value) and not Path(value).exists() and not value.startswith((".", "/", "~")) and value.count("/") <= 1


def render_model_card(export_dir: str | os.PathLike, checkpoint: str | os.PathLike | None = None,
                      eval_results: str | os.PathLike | dict | None = None, *, template: str | os.PathLike | None = None,
                      repo_id: str | None = None, export_name: str | None = None, base_model: str | None = None,
                      datasets: list[str] | tuple[str, ...] = (), corpus: str | None = None,
                      language: str | list[str] | None = "en", license: str | None = "apache-2.0",
                      tags: str | list[str] | None = None, model_name: str | None = None,
                      tasks: str | list[str] | None = None, dataset_args: str | list[str] | None = None,
                      training_args: Any | None = None, facts: dict[str, Any] | None = None):
    """Renders the card for the sentence-transformers folder `export_dir` as a `ModelCard`.

    `model_name` is the card's title and model-index name (default: the repo's or folder's name); `tags` and
    `tasks` (a string is one) join the metadata tags; `dataset_args` are shown with the corpus. `facts` are the
    live run's (`card_facts`), else the checkpoint's (`load_card_facts`); `training_args` (an arguments object,
    or a dict as recorded) replaces their training arguments.
    """
    from huggingface_hub import ModelCard
    from sentence_transformers import SentenceTransformer

    export_dir = Path(export_dir)
    config = (_read_json(Path(checkpoint) / "config.json") if checkpoint is not None else None) or {}
    facts = facts if facts is not None else load_card_facts(checkpoint) if checkpoint is not None else {}
    details = training_details(config, facts, training_args)
    results = read_eval_results(eval_results)
    base_model = base_model or details["base_model"]
    base_for_card = base_model if _is_hub_id(base_model) else None  # a local folder name means nothing to readers
    model_id = repo_id or f"path/to/{export_name or export_dir.name}"
    method, una = details["method"], ["una"] if details["una_used"] else []
    cited = ["mocose", *([method] if method != "mocose" and method in CITATIONS else []), *una]
    title = model_name or (repo_id.split("/")[-1] if repo_id else (export_name or export_dir.name))
    # The export itself, as sentence-transformers loads it: dimension, length, similarity, architecture.
    st_model = SentenceTransformer(str(export_dir), device="cpu", local_files_only=True)
    card_data = MoCoSEModelCardData(language=language, license=license, model_name=title, local_files_only=True,
                                    generate_widget_examples=True, eval_results=mocose_eval_results(results),
                                    local_path_snippet=not repo_id)
    card_data.model_id = model_id  # set after init: a local `path/to/name` is not a Hub id, and is still the path
    card_data.register_model(st_model)
    card_data.add_tags(list(dict.fromkeys(["mocose", method, *una, *as_list(tags), *as_list(tasks)])))
    card_data.base_model = base_for_card  # sentence-transformers would confirm it on the Hub first (docs/design.md)
    card_data.datasets = list(datasets)
    card_data.set_losses([])  # no loss object to cite (the method is cited below): Sentence-BERT's own citation
    card_data.citations = {**card_data.citations, **{CITATION_NAMES[name]: CITATIONS[name] for name in cited}}
    card_data.usage_examples = list(USAGE_SENTENCES[:3])
    card_data.widget = [{"source_sentence": USAGE_SENTENCES[0], "sentences": list(USAGE_SENTENCES[1:])}]
    logged = details["log_rows"]
    columns = [key for key in ("Epoch", "Step", TRAINING_LOSS, STSB_DEV) if any(key in row for row in logged)]
    card_data.training_logs = [{key: row.get(key, "-") for key in columns} for row in logged]
    if details["best_step"] is not None and any(row["Step"] == details["best_step"] for row in logged):
        card_data.set_best_model_step(details["best_step"])
    # sentence-transformers keeps no record of the keywords its Transformer module loads the encoder with but the
    # one the export wrote (`add_pooling_layer=False`); the transformers-only snippet passes the same.
    encoder_kwargs = (_read_json(export_dir / "sentence_bert_config.json") or {}).get("model_kwargs") or {}
    versions = {name: _version(name) for name in ("hf-mocose", "huggingface_hub")}  # (its card data has the rest)
    template_path = find_template(template)
    card = ModelCard.from_template(
        card_data, template_path=str(template_path), title=title, model_id=model_id, is_repo=bool(repo_id),
        method_name=CITATION_NAMES.get(method, method), sentence_pooling=details["sentence_pooling"],
        max_seq_length=st_model.max_seq_length,  # what the export truncates at
        training_max_seq_length=details["training_max_seq_length"],
        has_dense=any(type(module).__name__ == "Dense" for module in st_model), encoder_kwargs=encoder_kwargs,
        modules=[type(module).__name__ for module in st_model], details=details, results=results,
        sts_tasks=[(t, TASK_NAMES[t]) for t in STS_TASKS], transfer_tasks=[(t, TASK_NAMES[t]) for t in TRANSFER_TASKS],
        paper_avg=PAPER_STS_AVG.get(base_for_card or ""), corpus=corpus or (", ".join(datasets) if datasets else None),
        dataset_args=as_list(dataset_args), training_data=details.get("training_data"),
        training_data_tables=training_data_tables(details.get("training_data")), extra_versions=versions,
    )
    # Parse the rendered text back: a card whose YAML the Hub would reject fails here, locally.
    parsed = ModelCard(str(card))
    if parsed.data.library_name != "sentence-transformers":
        raise ValueError(f"Template {str(template_path)!r} did not render the YAML front matter ({{{{ card_data }}}}).")
    return parsed


def write_model_card(export_dir: str | os.PathLike, checkpoint: str | os.PathLike | None = None,
                     eval_results: str | os.PathLike | dict | None = None, **kwargs) -> Path:
    """Renders the card (see `render_model_card`) and writes it to `<export_dir>/README.md`."""
    path = Path(export_dir) / "README.md"
    path.write_text(str(render_model_card(export_dir, checkpoint, eval_results, **kwargs)), encoding="utf-8")
    return path

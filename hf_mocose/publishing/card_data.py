"""The card's sentence-transformers side, built on `SentenceTransformerModelCardData` and the loaded export.

sentence-transformers writes a card for every model its `SentenceTransformerTrainer` trains; a reader who
knows those cards finds the same sections here, filled by the same code: the export is loaded as a
`SentenceTransformer` and registered with a `SentenceTransformerModelCardData`, whose `to_dict()` gives
the architecture (the module list with each module's config), the output dimension (the last module's),
the max sequence length, the similarity function, the usage snippet with its printed output (shape and
similarities, computed by encoding its example sentences), the training-logs table (best step in bold),
the framework versions, the Sentence-BERT citation and the YAML (`widget:`, tags, `pipeline_tag`...).

What it would do online is done offline or set directly (docs/design.md): `local_files_only=True` (no Hub
call), `base_model` set from the checkpoint's record (sentence-transformers sets it only after a Hub
lookup), `datasets` set from the given ids, and the model-index built from the evaluation JSON
(`mocose_eval_results`; sentence-transformers builds it from evaluator objects seen in training), in its
convention: `spearman_cosine`/`pearson_cosine` in [-1, 1].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sentence_transformers import SentenceTransformerModelCardData

from .model_card_facts import STSB_DEV, TASK_NAMES, TRAINING_LOSS

# Usage snippet (the first three, encoded for the printed output) and Hub widget (a source and three others).
USAGE_SENTENCES = ("A man is playing a guitar.", "Someone is playing an instrument.", "A woman is slicing an onion.",
                   "The weather is lovely today.")


@dataclass
class MoCoSEModelCardData(SentenceTransformerModelCardData):
    """`SentenceTransformerModelCardData` plus a model-index from an evaluation JSON (`eval_results`).

    `local_path_snippet`: the usage snippet loads a local folder (`model_id` is then a path), so it does
    not say it downloads from the Hub.
    """

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


def mocose_eval_results(results: dict[str, Any]) -> list:
    """`EvalResult`s of the evaluation JSON (`read_eval_results`), in sentence-transformers' convention.

    STS: `spearman_cosine` / `pearson_cosine` in [-1, 1] (the x100 numbers / 100), task "Semantic
    Similarity" (`semantic-similarity`), as `EmbeddingSimilarityEvaluator` results are named on every
    sentence-transformers model; transfer tasks: `accuracy` in [0, 1].
    """
    from huggingface_hub import EvalResult

    sts = dict(task_type="semantic-similarity", task_name="Semantic Similarity")
    evals = []
    for task, scores in results["sts"].items():
        split = "validation" if task == "stsb_dev" else "test"
        for metric in ("spearman", "pearson"):
            if scores.get(metric) is not None:
                evals.append(EvalResult(**sts, dataset_type=task, dataset_name=f"{TASK_NAMES[task]} (SentEval)",
                                        dataset_split=split, metric_type=f"{metric}_cosine",
                                        metric_name=f"{metric.capitalize()} Cosine",
                                        metric_value=round(float(scores[metric]) / 100, 6)))
    if results["avg"] is not None:
        evals.append(EvalResult(**sts, dataset_type="sts-avg" if results["avg_complete"] else "sts-partial-avg",
                                dataset_name=f"{results['avg_label']} (SentEval)", dataset_split="test",
                                metric_type="spearman_cosine", metric_name="Spearman Cosine",
                                metric_value=round(results["avg"] / 100, 6)))
    for task, accuracy in results["transfer"].items():
        evals.append(EvalResult(task_type="text-classification", task_name="SentEval transfer", dataset_type=task,
                                dataset_name=f"{TASK_NAMES[task]} (SentEval)", metric_type="accuracy",
                                metric_name="Accuracy", metric_value=round(accuracy / 100, 6)))
    return evals


def training_data_tables(training_data: dict[str, Any] | None) -> dict[str, str] | None:
    """The card's statistics and samples tables of the recorded training data, as sentence-transformers draws
    them (columns = the data's columns, cells through its own example formatting)."""
    from sentence_transformers.base.model_card import BaseModelCardData
    from transformers.modelcard import make_markdown_table

    if not training_data:
        return None
    lengths = training_data["token_lengths"]
    column = training_data["columns"][0]
    details = (f"<ul><li>min: {lengths['min']} tokens</li><li>mean: {lengths['mean']} tokens</li>"
               f"<li>max: {lengths['max']} tokens</li></ul>")
    stats = make_markdown_table([{"": "type", column: "string"}, {"": "details", column: details}])
    samples = make_markdown_table([{column: f"<code>{BaseModelCardData._format_example_value(text)}</code>"}
                                   for text in training_data["samples"]])
    return {"stats_table": stats.replace("-:|", "--|"), "examples_table": samples.replace("-:|", "--|")}


def build_card_data(st_model, details: dict[str, Any], results: dict[str, Any], *, model_id: str, is_repo: bool,
                    model_name: str, base_model: str | None, datasets, language, license, tags: list[str],
                    citations: dict[str, str]) -> MoCoSEModelCardData:
    """The card data of the export `st_model` (a loaded `SentenceTransformer`), offline.

    `details` are `collect_training_details`' (logs, best step), `results` `read_eval_results`';
    `citations` (name -> BibTeX) follow sentence-transformers' own (Sentence-BERT).
    """
    card_data = MoCoSEModelCardData(language=language, license=license, model_name=model_name,
                                    local_files_only=True, generate_widget_examples=True,
                                    eval_results=mocose_eval_results(results), local_path_snippet=not is_repo)
    card_data.model_id = model_id  # set after init: a local `path/to/name` is not a Hub id, and is still the path
    card_data.register_model(st_model)
    card_data.add_tags(tags)
    card_data.base_model = base_model  # sentence-transformers would confirm it on the Hub first (docs/design.md)
    card_data.datasets = list(datasets)
    card_data.set_losses([])  # no loss object to cite (the method is cited below): Sentence-BERT's own citation
    card_data.citations = {**card_data.citations, **citations}
    card_data.usage_examples = list(USAGE_SENTENCES[:3])
    card_data.widget = [{"source_sentence": USAGE_SENTENCES[0], "sentences": list(USAGE_SENTENCES[1:])}]
    logged = details["log_rows"]
    columns = [key for key in ("Epoch", "Step", TRAINING_LOSS, STSB_DEV) if any(key in row for row in logged)]
    card_data.training_logs = [{key: row.get(key, "-") for key in columns} for row in details["log_rows"]]
    if details["best_step"] is not None and any(row["Step"] == details["best_step"] for row in details["log_rows"]):
        card_data.set_best_model_step(details["best_step"])
    return card_data

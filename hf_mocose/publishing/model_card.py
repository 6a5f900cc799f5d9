"""The model card of an export: `MoCoSEModelCardData.from_export` reads the export, the checkpoint's config, the
run's facts (`card_facts`) and an evaluation JSON; `render` fills the `model_cards/` template (`find_template`).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from importlib import resources
from pathlib import Path
from typing import Any

from sentence_transformers import SentenceTransformerModelCardData

from .card_facts import STSB_DEV, TRAINING_LOSS, load_card_facts, public_name, read_json, state_facts
from .card_hyperparameters import as_record, model_rows, training_rows

STS_TEST_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
TRANSFER_TASKS = ("mr", "cr", "subj", "mpqa", "sst2", "trec", "mrpc")
TASK_NAMES = {"sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16", "stsb": "STS-B",
              "sickr": "SICK-R", "stsb_dev": "STS-B dev", "mr": "MR", "cr": "CR", "subj": "SUBJ", "mpqa": "MPQA",
              "sst2": "SST-2", "trec": "TREC", "mrpc": "MRPC"}
# Usage snippet (the first three, encoded for the printed output) and Hub widget (a source and three others).
USAGE_SENTENCES = ("A man is playing a guitar.", "Someone is playing an instrument.", "A woman is slicing an onion.",
                   "The weather is lovely today.")
# Average Spearman over the 7 STS tasks reported by the MoCoSE paper (Cao et al., 2022).
PAPER_STS_AVG = {"bert-base-uncased": 77.27, "google-bert/bert-base-uncased": 77.27,
                 "bert-large-uncased": 79.13, "google-bert/bert-large-uncased": 79.13}
CITATION_NAMES = {"mocose": "MoCoSE", "simcse": "SimCSE", "ifcl": "IFCL", "esimcse": "ESimCSE", "una": "UNA"}


def training_details(config: dict[str, Any], facts: dict[str, Any], training_args: Any | None = None) -> dict:
    """The template's `details`: the run's `facts` with the checkpoint `config`'s, the hyper-parameter rows, the
    global batch size B (per device x accumulation x processes; one process assumed when unrecorded) and d_trace."""
    recorded = as_record(facts.get("training_args") if training_args is None else training_args)
    method, world_size, batch = config.get("method", "mocose"), recorded.get("world_size"), facts.get("global_batch_size")
    batch_assumed = batch is None and world_size is None
    if batch is None and "per_device_train_batch_size" in recorded:
        batch = (recorded["per_device_train_batch_size"] * (recorded.get("gradient_accumulation_steps") or 1)
                 * (world_size or 1))
    d_trace = None
    if method == "mocose" and "ema_decay_end" in recorded and batch:
        from ..models.mtd import max_traceable_distance

        d_trace = max_traceable_distance(recorded["ema_decay_end"], config.get("queue_size", 512), batch)
    runtime = facts.get("train_runtime")
    minutes, seconds = divmod(round(runtime or 0), 60)
    hours, minutes = divmod(minutes, 60)
    return {
        **state_facts({}), **facts, "method": method, "model_rows": model_rows(config),
        "train_rows": training_rows(recorded),
        "all_arguments": {k: public_name(v) for k, v in sorted((recorded.get("arguments") or {}).items())},
        "global_batch_size": batch, "batch_assumed": batch_assumed,
        "d_trace": None if d_trace is None else ("∞ (η_end = 1)" if math.isinf(d_trace) else f"{d_trace:.2f}"),
        "train_runtime": None if runtime is None else (f"{hours}h {minutes:02d}m {seconds:02d}s" if hours
                                                       else f"{minutes}m {seconds:02d}s"),
        "trained_with_transformers": config.get("transformers_version"),
        "una_used": recorded.get("hard_negatives") == "una",  # an explicit switch: una_alpha has a non-zero default
        # Checkpoints before base_model_name_or_path existed: the encoder's own record.
        "base_model": config.get("base_model_name_or_path") or (config.get("encoder_config") or {}).get("_name_or_path"),
        "training_max_seq_length": config.get("max_seq_length"), "sentence_pooling": config.get("sentence_pooling", "cls"),
        "queue_size": config.get("queue_size"), "best_exported": bool(recorded.get("load_best_model_at_end")),
        "widths_trained": recorded.get("matryoshka_dims"),
    }


def matryoshka_section(results: dict[str, Any], dims: list[int] | None, full_dim: int) -> dict[str, Any] | None:
    """The card's Matryoshka section, or None without smaller widths: `dims`, the full width then the smaller ones
    trained (`dims`) or scored (`results["widths"]`), descending; `table`, Markdown, one row per width with the
    Spearman x100 of each task scored at any width (the full width's from `results["sts"]`), or None."""
    smaller = sorted({dim for dim in [*(dims or []), *results["widths"]] if dim < full_dim}, reverse=True)
    if not smaller:
        return None
    rows = {full_dim: {**{task: scores["spearman"] for task, scores in results["sts"].items()},
                       **({} if results["avg"] is None else {"avg": results["avg"]})},
            **{dim: results["widths"].get(dim, {}) for dim in smaller}}
    names = {**TASK_NAMES, "avg": "STS average"}
    columns = [task for task in (*STS_TEST_TASKS, "avg", "stsb_dev") if any(task in row for row in rows.values())]
    table = None if not any(rows[dim] for dim in smaller) else "\n".join([
        "| Dimensions | " + " | ".join(names[task] for task in columns) + " |", "|---" * (len(columns) + 1) + "|",
        *("| " + " | ".join([str(dim), *(f"{row[task]:.2f}" if task in row else "–" for task in columns)]) + " |"
          for dim, row in rows.items())])
    return {"dims": [full_dim, *smaller], "table": table}


def read_eval_results(source: str | os.PathLike | dict | list | None) -> dict[str, Any]:
    """Normalises an evaluation JSON (path or dict) to `{"sts": {task: {...}}, "transfer": {...}, "avg": x, ...}`:
    the `hf-mocose evaluate` format (`{"sts12": {"spearman", "pearson", "n"}, ..., "mr": {"accuracy"}, "avg"}`), the
    same nested under "sts"/"transfer"/"results", or the trainer's metrics (`eval_stsb_spearman` -> STS-B dev).
    Each STS task: `{"spearman", "pearson", "n", "spearman_all"}`. `widths`: the Spearmans x100 at Matryoshka widths,
    `{N: {task or "avg": x}}`, from the trainer's `eval_stsb_spearman_dimN` and from evaluations whose `meta` names a
    `truncate_dim` (`hf-mocose evaluate --truncate_dim N`). A list: such evaluations, at most one of the full width."""
    evaluations = [_results_json(item) for item in (source if isinstance(source, (list, tuple)) else [source])]
    full = [raw for raw in evaluations if not (raw.get("meta") or {}).get("truncate_dim")]
    if len(full) > 1:
        raise ValueError(f"{len(full)} evaluations of the full width were given: give one, and the others from "
                         "hf-mocose evaluate --truncate_dim N.")
    results = _read_one_evaluation(full[0] if full else {})
    for raw in evaluations:
        if dim := (raw.get("meta") or {}).get("truncate_dim"):
            cut = _read_one_evaluation(raw)
            results["widths"].setdefault(int(dim), {}).update(
                {task: scores["spearman"] for task, scores in cut["sts"].items()},
                **({} if cut["avg"] is None else {"avg": cut["avg"]}))
    return results


def _results_json(source: str | os.PathLike | dict | None) -> dict[str, Any]:
    raw = {} if source is None else source
    if not isinstance(raw, dict):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"Evaluation results file {str(path)!r} does not exist.")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"Evaluation results file {str(path)!r} is not valid JSON: {err}") from err
    if not isinstance(raw, dict):
        raise ValueError(f"Evaluation results must be a JSON object, got {type(raw).__name__}.")
    return raw


def _read_one_evaluation(raw: dict[str, Any]) -> dict[str, Any]:
    nested = ("results", "sts", "transfer", "tasks")
    flat = {k: v for key in nested if isinstance(raw.get(key), dict) for k, v in raw[key].items()}
    flat.update({k: v for k, v in raw.items() if k not in nested})
    if "eval_stsb_spearman" in flat and "stsb_dev" not in flat:
        flat["stsb_dev"] = {"spearman": flat["eval_stsb_spearman"], "pearson": flat.get("eval_stsb_pearson")}
    sts, transfer = {}, {}
    for task in (*STS_TEST_TASKS, "stsb_dev"):
        value = {"spearman": flat[task]} if isinstance(flat.get(task), (int, float)) else flat.get(task)
        if isinstance(value, dict) and isinstance(value.get("spearman"), (int, float)):
            sts[task] = {k: value.get(k) for k in ("spearman", "pearson", "n")}
            # Over all pairs (MTEB's score, `eval_results.py`); None when only a weighted mean of sets was kept.
            one_set = task in ("stsb", "sickr", "stsb_dev") or value.get("aggregation", "all") == "all"
            sts[task]["spearman_all"] = (value["all"] if isinstance(value.get("all"), dict) else value if one_set
                                         else {}).get("spearman")
    for task in TRANSFER_TASKS:
        value = flat.get(task)
        accuracy = value.get("accuracy", value.get("acc")) if isinstance(value, dict) else value
        if isinstance(accuracy, (int, float)):
            transfer[task] = float(accuracy)
    avg = flat.get("avg", flat.get("sts_avg"))
    avg = avg.get("spearman") if isinstance(avg, dict) else avg
    # `avg_over` (hf-mocose evaluate) says which STS tasks the average covers; a partial average
    # must not be labelled, or compared with the paper, as the 7-task one.
    avg_over = flat.get("avg_over") or [t for t in STS_TEST_TASKS if t in sts]
    if not isinstance(avg, (int, float)) and all(t in sts for t in STS_TEST_TASKS):
        avg, avg_over = sum(sts[t]["spearman"] for t in STS_TEST_TASKS) / len(STS_TEST_TASKS), list(STS_TEST_TASKS)
    complete = set(STS_TEST_TASKS) <= set(avg_over)
    widths = {int(key.rsplit("_dim", 1)[1]): {"stsb_dev": float(value)} for key, value in flat.items()
              if re.fullmatch(r"eval_stsb_spearman_dim\d+", key) and isinstance(value, (int, float))}
    return {"widths": widths, "sts": sts, "transfer": transfer, "avg": float(avg) if isinstance(avg, (int, float)) else None,
            "avg_complete": complete, "avg_label": "Average (7 STS)" if complete else
            "Average over " + ", ".join(TASK_NAMES.get(t, t) for t in avg_over),
            "transfer_avg": float(flat["transfer_avg"]) if isinstance(flat.get("transfer_avg"), (int, float)) else None}


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
    "esimcse": """@inproceedings{wu-etal-2022-esimcse,
    title = "{ESimCSE}: Enhanced Sample Building Method for Contrastive Learning of Unsupervised Sentence Embedding",
    author = "Wu, Xing and Gao, Chaochen and Zang, Liangjun and Han, Jizhong and Wang, Zhongyuan and Hu, Songlin",
    booktitle = "Proceedings of the 29th International Conference on Computational Linguistics",
    year = "2022",
    publisher = "International Committee on Computational Linguistics",
}""",
    "una": """@misc{shu-lampos-una,
    title = "Unsupervised hard Negative Augmentation for contrastive learning",
    author = "Shu, Yuxuan and Lampos, Vasileios",
    year = "2024",
    note = "arXiv preprint",
}""",
}


def mocose_eval_results(results: dict[str, Any]) -> list:
    """`EvalResult`s of `read_eval_results`' dict as `EmbeddingSimilarityEvaluator` names them on every sentence-
    transformers model: `spearman_cosine` / `pearson_cosine` in [-1, 1] ("Semantic Similarity"); transfer `accuracy`."""
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


def _version(package: str) -> str | None:
    try:
        return importlib_metadata.version(package)
    except importlib_metadata.PackageNotFoundError:
        return None


def _is_hub_id(value: str | None) -> bool:
    """A Hub model id (`name` or `namespace/name`), not a local folder, can go in `base_model`."""
    return bool(value) and not Path(value).exists() and not value.startswith((".", "/", "~")) and value.count("/") <= 1


@dataclass
class MoCoSEModelCardData(SentenceTransformerModelCardData):
    """`SentenceTransformerModelCardData` plus a model-index from an evaluation JSON (`eval_results`) and the values
    of MoCoSE's template (`template_values`); `local_path_snippet`: the usage snippet loads a local folder
    (`model_id`), it downloads nothing."""

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

    @classmethod
    def from_export(cls, export_dir: str | os.PathLike, checkpoint: str | os.PathLike | None = None,
                    eval_results: str | os.PathLike | dict | None = None, *, repo_id: str | None = None,
                    export_name: str | None = None, base_model: str | None = None,
                    datasets: list[str] | tuple[str, ...] = (), corpus: str | None = None,
                    language: str | list[str] | None = "en", license: str | None = "apache-2.0",
                    tags: str | list[str] | None = None, model_name: str | None = None,
                    tasks: str | list[str] | None = None, dataset_args: str | list[str] | None = None,
                    training_args: Any | None = None, facts: dict[str, Any] | None = None,
                    runtimes: dict[str, Any] | None = None) -> "MoCoSEModelCardData":
        """The card data of the sentence-transformers folder `export_dir` of `checkpoint`: `model_name` is the title
        (default: the repo's or folder's name); `tags` and `tasks` join the metadata tags; `facts` are the live run's
        (`card_facts`), else the checkpoint's; `training_args` replaces their arguments; `runtimes`: the measured
        ONNX / OpenVINO files (`runtimes.export_runtimes`), for the "Runtimes" section."""
        from sentence_transformers import SentenceTransformer
        export_dir = Path(export_dir)
        config = (read_json(Path(checkpoint) / "config.json") if checkpoint is not None else None) or {}
        facts = facts if facts is not None else load_card_facts(checkpoint) if checkpoint is not None else {}
        details, results = training_details(config, facts, training_args), read_eval_results(eval_results)
        base_model = base_model or details["base_model"]
        base_for_card = base_model if _is_hub_id(base_model) else None  # a local folder name means nothing to readers
        method, una = details["method"], ["una"] if details["una_used"] else []
        cited = ["mocose", *([method] if method != "mocose" and method in CITATIONS else []), *una]
        title = model_name or (repo_id.split("/")[-1] if repo_id else (export_name or export_dir.name))
        # The export itself, as sentence-transformers loads it: dimension, length, similarity, architecture.
        st_model = SentenceTransformer(str(export_dir), device="cpu", local_files_only=True)
        card_data = cls(language=language, license=license, model_name=title, local_files_only=True,
                        generate_widget_examples=True, eval_results=mocose_eval_results(results),
                        local_path_snippet=not repo_id)
        # set after init: a local `path/to/name` is not a Hub id, and is still the path
        card_data.model_id = model_id = repo_id or f"path/to/{export_name or export_dir.name}"
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
        card_data.template_values = dict(  # not a field: never in the card's YAML
            title=title, model_id=model_id, is_repo=bool(repo_id), method_name=CITATION_NAMES.get(method, method),
            sentence_pooling=details["sentence_pooling"], max_seq_length=st_model.max_seq_length,  # the export's
            training_max_seq_length=details["training_max_seq_length"],
            has_dense=any(type(module).__name__ == "Dense" for module in st_model),
            # The keywords the export wrote (`add_pooling_layer=False`), for the transformers-only snippet.
            encoder_kwargs=(read_json(export_dir / "sentence_bert_config.json") or {}).get("model_kwargs") or {},
            modules=[type(module).__name__ for module in st_model], details=details, results=results,
            sts_tasks=[(t, TASK_NAMES[t]) for t in STS_TEST_TASKS],
            transfer_tasks=[(t, TASK_NAMES[t]) for t in TRANSFER_TASKS], paper_avg=PAPER_STS_AVG.get(base_for_card or ""),
            corpus=public_name(corpus) or (", ".join(datasets) if datasets else None),  # a local path: its file name
            dataset_args=as_list(dataset_args), training_data=details.get("training_data"),
            training_data_tables=training_data_tables(details.get("training_data")),
            extra_versions={name: _version(name) for name in ("hf-mocose", "huggingface_hub")},  # (the rest: ST's)
            runtimes=runtimes,
            matryoshka=matryoshka_section(results, details["widths_trained"], st_model.get_embedding_dimension()))
        return card_data

    def render(self, template: str | os.PathLike | None = None):
        """The card as a `huggingface_hub.ModelCard`, from `template` (`find_template`), parsed back: a card whose
        YAML the Hub would reject fails here, locally."""
        from huggingface_hub import ModelCard
        template_path = find_template(template)
        card = ModelCard(str(ModelCard.from_template(self, template_path=str(template_path), **self.template_values)))
        if card.data.library_name != "sentence-transformers":
            raise ValueError(f"Template {str(template_path)!r} did not render the YAML front matter ({{{{ card_data }}}}).")
        return card


def render_model_card(export_dir: str | os.PathLike, checkpoint: str | os.PathLike | None = None,
                      eval_results: str | os.PathLike | dict | None = None, *, template: str | os.PathLike | None = None,
                      **kwargs):
    """The card of the sentence-transformers folder `export_dir` as a `ModelCard` (`MoCoSEModelCardData.from_export`
    with `kwargs`, rendered from `template`)."""
    return MoCoSEModelCardData.from_export(export_dir, checkpoint, eval_results, **kwargs).render(template)


def write_model_card(export_dir: str | os.PathLike, checkpoint: str | os.PathLike | None = None,
                     eval_results: str | os.PathLike | dict | None = None, **kwargs) -> Path:
    """Renders the card (see `render_model_card`) and writes it to `<export_dir>/README.md`."""
    path = Path(export_dir) / "README.md"
    path.write_text(str(render_model_card(export_dir, checkpoint, eval_results, **kwargs)), encoding="utf-8")
    return path


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
    name = "mocose.md.j2" if template is None else str(template)
    candidates = [Path(__file__).resolve().parents[2] / "model_cards" / name,
                  Path(str(resources.files("hf_mocose") / "templates" / name))]
    if (found := next((candidate for candidate in candidates if candidate.is_file()), None)) is None:
        raise FileNotFoundError(f"Model card template {name!r} not found (looked in: {', '.join(map(str, candidates))}).")
    return found


def as_list(value) -> list:
    """None -> [], a string -> [that string] (one tag, not its characters), a list or tuple -> a list."""
    return [] if value is None else [value] if isinstance(value, str) else list(value)


# transformers' `create_model_card` name -> the `render_model_card` argument with the same meaning (ours came first).
_SAME_MEANING = {"finetuned_from": "base_model", "dataset_tags": "datasets", "dataset": "corpus"}


def card_kwargs_from_trainer_keywords(**kwargs) -> dict[str, Any]:
    """Maps `Trainer.create_model_card`'s keywords onto `render_model_card`'s (`_SAME_MEANING`); `tasks` become
    tags (the `pipeline_tag` stays sentence-similarity). Both names of one thing with different values are a
    `ValueError` naming both."""
    card = dict(kwargs)
    for trainer_name, ours in _SAME_MEANING.items():
        if (value := card.pop(trainer_name, None)) is None:
            continue
        value = ", ".join(as_list(value)) if ours == "corpus" else (as_list(value) if ours == "datasets" else value)
        if card.get(ours) not in (None, (), []) and card[ours] != value:
            raise ValueError(f"{trainer_name}={kwargs[trainer_name]!r} and {ours}={card[ours]!r} say the same thing "
                             "differently: give one of them.")
        card[ours] = value
    return {name: as_list(value) if name in ("tags", "tasks", "dataset_args") else value for name, value in card.items()}

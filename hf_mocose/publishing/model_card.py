"""Model cards for exported MoCoSE models: metadata as `huggingface_hub.ModelCardData`, layout in a Jinja template.

The template lives in the top-level `model_cards/` folder (`mocose.md.j2`); installed copies
of the package carry it as package data under `hf_mocose/templates/`. What the card states about
the run comes from `model_card_facts` (config.json, training_args.json, trainer_state.json, the
evaluation JSON) or is passed in; nothing is guessed. What it shares with sentence-transformers' own
cards (library, pipeline tag, base tags) is read from `SentenceTransformerModelCardData`. The card is
rendered and re-parsed through `huggingface_hub.ModelCard`, so bad YAML metadata fails here, not on the Hub.

`render_model_card` also takes the keywords of `Trainer.push_to_hub` / `Trainer.create_model_card`
(`model_name`, `finetuned_from`, `tasks`, `dataset_tags`, `dataset`, `dataset_args`, `tags` as a
string or a list...), with transformers' meaning (`card_kwargs_from_trainer_keywords`).
"""

from __future__ import annotations

import logging
import os
from importlib import metadata as importlib_metadata
from importlib import resources
from pathlib import Path
from typing import Any

from ..models.sequence_length import sentence_transformers_max_seq_length
from .model_card_facts import (
    MODEL_FIELDS,
    STS_TASKS,
    TASK_NAMES,
    TRANSFER_TASKS,
    _read_json,
    collect_training_details,
    read_eval_results,
)

__all__ = ["CITATIONS", "TRAINER_CARD_KEYWORDS", "card_kwargs_from_trainer_keywords", "find_template",
           "read_eval_results", "render_model_card", "write_model_card"]

logger = logging.getLogger(__name__)

DEFAULT_TEMPLATE = "mocose.md.j2"
# Average Spearman over the 7 STS tasks reported by the MoCoSE paper (Cao et al., 2022).
PAPER_STS_AVG = {
    "bert-base-uncased": 77.27, "google-bert/bert-base-uncased": 77.27,
    "bert-large-uncased": 79.13, "google-bert/bert-large-uncased": 79.13,
}
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
def find_template(template: str | os.PathLike | None = None) -> Path:
    """The card template: `template` if it is a file, else that name (default `mocose.md.j2`)
    in the repository's `model_cards/` folder (source checkouts) or the installed package data."""
    if template is not None and Path(template).is_file():
        return Path(template)
    name = DEFAULT_TEMPLATE if template is None else str(template)
    candidates = [Path(__file__).resolve().parents[2] / "model_cards" / name]
    try:
        candidates.append(Path(str(resources.files("hf_mocose") / "templates" / name)))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - unusual loaders
        pass
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"Model card template {name!r} not found (looked in: {', '.join(map(str, candidates))}).")


def library_versions() -> dict[str, str]:
    """Versions of the libraries that wrote the export (the card says they are export-time versions)."""
    versions = {}
    for name in ("hf-mocose", "sentence-transformers", "transformers", "torch", "huggingface_hub"):
        try:
            versions[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            pass
    return versions


def _is_hub_id(value: str | None) -> bool:
    """A Hub model id (`name` or `namespace/name`), not a local folder, can go in `base_model`."""
    return bool(value) and not Path(value).exists() and not value.startswith((".", "/", "~")) and value.count("/") <= 1


# ----------------------------------------------------------------------------- card
def build_card_data(details, results, *, model_name, base_model, datasets, language, license, tags):
    """The YAML front matter as a `ModelCardData` (model-index built from `results`)."""
    from huggingface_hub import EvalResult, ModelCardData

    evals = []
    for task, scores in results["sts"].items():
        split = "validation" if task == "stsb_dev" else "test"
        for metric in ("spearman", "pearson"):
            if scores.get(metric) is not None:
                evals.append(EvalResult(
                    task_type="sentence-similarity", task_name="Semantic Textual Similarity",
                    dataset_type=task, dataset_name=f"{TASK_NAMES[task]} (SentEval)", dataset_split=split,
                    metric_type=metric, metric_name=f"{metric.capitalize()} (cosine, x100)",
                    metric_value=round(float(scores[metric]), 2),
                ))
    if results["avg"] is not None:
        evals.append(EvalResult(
            task_type="sentence-similarity", task_name="Semantic Textual Similarity",
            dataset_type="sts-avg" if results["avg_complete"] else "sts-partial-avg",
            dataset_name=f"{results['avg_label']} (SentEval)", dataset_split="test",
            metric_type="spearman", metric_name="Average Spearman (cosine, x100)",
            metric_value=round(results["avg"], 2),
        ))
    for task, accuracy in results["transfer"].items():
        evals.append(EvalResult(
            task_type="text-classification", task_name="SentEval transfer", dataset_type=task,
            dataset_name=f"{TASK_NAMES[task]} (SentEval)", metric_type="accuracy", metric_value=round(accuracy, 2),
        ))
    shared = sentence_transformers_card_identity()
    tags = _unique([*shared["tags"], "mocose", details["method"], *(["una"] if details["una_used"] else []),
                    *as_list(tags)])
    return ModelCardData(
        library_name=shared["library_name"], pipeline_tag=shared["pipeline_tag"], tags=tags,
        base_model=base_model if _is_hub_id(base_model) else None, datasets=list(datasets) or None,
        language=language, license=license, model_name=model_name, eval_results=evals or None,
    )


def sentence_transformers_card_identity() -> dict[str, Any]:
    """`library_name`, `pipeline_tag` and the base `tags` of sentence-transformers' own cards.

    Read from `SentenceTransformerModelCardData`'s defaults, so an export is listed on the Hub exactly
    as a model saved by sentence-transformers is (its loader and widget key on these). The rest of that
    class needs a live `SentenceTransformer` and the Hub (see docs/design.md).
    """
    from sentence_transformers import SentenceTransformerModelCardData

    defaults = SentenceTransformerModelCardData(local_files_only=True, generate_widget_examples=False)
    return {"library_name": defaults.library_name, "pipeline_tag": defaults.pipeline_tag, "tags": list(defaults.tags)}


def as_list(value) -> list:
    """None -> [], a string -> [that string] (one tag, not its characters), a list or tuple -> a list."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _unique(values: list) -> list:
    return list(dict.fromkeys(values))


# Keywords of `Trainer.push_to_hub(**kwargs)` -> `Trainer.create_model_card` (transformers 5.x).
TRAINER_CARD_KEYWORDS = ("model_name", "language", "license", "tags", "finetuned_from", "tasks", "dataset_tags",
                         "dataset", "dataset_args")
# transformers' name -> the `render_model_card` argument with the same meaning (ours came first, for the CLI).
_SAME_MEANING = {"finetuned_from": "base_model", "dataset_tags": "datasets", "dataset": "corpus"}


def card_kwargs_from_trainer_keywords(**kwargs) -> dict[str, Any]:
    """Maps `Trainer.create_model_card`'s keywords onto `render_model_card`'s, with transformers' meaning.

    `finetuned_from` is the `base_model`; `dataset_tags` are Hub dataset ids (metadata `datasets`);
    `dataset` names the training data in the text (our `corpus`); `dataset_args` are their
    configurations; `tasks` become tags (the `pipeline_tag` stays sentence-similarity, which
    sentence-transformers' loader and the Hub widget need); `tags` may be a string (one tag).
    Giving both names of one thing with different values is a `ValueError` naming both.
    """
    card = dict(kwargs)
    for trainer_name, ours in _SAME_MEANING.items():
        if card.get(trainer_name) is None:
            card.pop(trainer_name, None)
            continue
        value = card.pop(trainer_name)
        value = ", ".join(as_list(value)) if ours == "corpus" else (as_list(value) if ours == "datasets" else value)
        if card.get(ours) not in (None, (), []) and card[ours] != value:
            raise ValueError(f"{trainer_name}={kwargs[trainer_name]!r} and {ours}={card[ours]!r} say the same thing "
                             "differently: give one of them.")
        card[ours] = value
    for name in ("tags", "tasks", "dataset_args"):
        if name in card:
            card[name] = as_list(card[name])
    return card


def render_model_card(
    export_dir: str | os.PathLike,
    checkpoint: str | os.PathLike | None = None,
    eval_results: str | os.PathLike | dict | None = None,
    *,
    template: str | os.PathLike | None = None,
    repo_id: str | None = None,
    export_name: str | None = None,
    base_model: str | None = None,
    datasets: list[str] | tuple[str, ...] = (),
    corpus: str | None = None,
    language: str | list[str] | None = "en",
    license: str | None = "apache-2.0",
    tags: str | list[str] | None = None,
    model_name: str | None = None,
    tasks: str | list[str] | None = None,
    dataset_args: str | list[str] | None = None,
    training_args: Any | None = None,
    global_batch_size: int | None = None,
    train_runtime: float | None = None,
    hardware: str | None = None,
):
    """Renders the card for the sentence-transformers folder `export_dir` as a `ModelCard`.

    `model_name` is the card's title and model-index name (default: the repo's or folder's name);
    `tags` and `tasks` (a string is one) join the metadata tags; `dataset_args` are shown with the
    corpus. `training_args` is the live arguments object (else the checkpoint's training_args.json).
    """
    from huggingface_hub import ModelCard

    export_dir = Path(export_dir)
    details = collect_training_details(checkpoint, training_args, global_batch_size, train_runtime, hardware)
    results = read_eval_results(eval_results)
    base_model = base_model or details["base_model"]
    model_id = repo_id or f"path/to/{export_name or export_dir.name}"
    modules = _read_json(export_dir / "modules.json") or []
    st_config = _read_json(export_dir / "sentence_bert_config.json") or {}
    encoder_config = _read_json(export_dir / "config.json") or {}
    pooling = next((m for m in details["model_rows"] if m[0].startswith("sentence pooling")), (None, "cls"))[1]
    citations = [CITATIONS[details["method"]]] if details["method"] in CITATIONS else []
    if details["method"] != "mocose":
        citations.insert(0, CITATIONS["mocose"])
    if details["una_used"]:
        citations.append(CITATIONS["una"])
    base_for_paper = base_model if _is_hub_id(base_model) else None
    title = model_name or (repo_id.split("/")[-1] if repo_id else (export_name or export_dir.name))
    card_data = build_card_data(
        details, results, model_name=title, base_model=base_model, datasets=datasets, language=language,
        license=license, tags=[*as_list(tags), *as_list(tasks)],
    )
    template_path = find_template(template)
    card = ModelCard.from_template(
        card_data,
        template_path=str(template_path),
        title=title,
        model_id=model_id,
        is_repo=bool(repo_id),
        base_model=base_for_paper,  # a local folder name would mean nothing to readers
        method_name={"mocose": "MoCoSE", "simcse": "SimCSE"}.get(details["method"], details["method"]),
        sentence_pooling=pooling,
        max_seq_length=sentence_transformers_max_seq_length(export_dir),  # what the export truncates at
        training_max_seq_length=next((v for k, v in details["model_rows"] if k == MODEL_FIELDS["max_seq_length"]), None),
        embedding_dim=encoder_config.get("hidden_size") or encoder_config.get("dim"),
        has_dense=any(m.get("path") == "2_Dense" or m.get("type", "").endswith(".Dense") for m in modules),
        encoder_kwargs=st_config.get("model_kwargs") or {},
        modules=[m.get("type", "").rsplit(".", 1)[-1] for m in modules],
        details=details,
        results=results,
        sts_tasks=[(t, TASK_NAMES[t]) for t in STS_TASKS],
        transfer_tasks=[(t, TASK_NAMES[t]) for t in TRANSFER_TASKS],
        paper_avg=PAPER_STS_AVG.get(base_for_paper or ""),
        corpus=corpus or (", ".join(datasets) if datasets else None),
        dataset_args=as_list(dataset_args),
        versions=library_versions(),
        citations=citations,
    )
    # Parse the rendered text back: a card whose YAML the Hub would reject fails here, locally.
    parsed = ModelCard(str(card))
    if parsed.data.library_name != "sentence-transformers":
        raise ValueError(f"Template {str(template_path)!r} did not render the YAML front matter ({{{{ card_data }}}}).")
    return parsed


def write_model_card(export_dir: str | os.PathLike, checkpoint: str | os.PathLike | None = None,
                     eval_results: str | os.PathLike | dict | None = None, **kwargs) -> Path:
    """Renders the card (see `render_model_card`) and writes it to `<export_dir>/README.md`."""
    card = render_model_card(export_dir, checkpoint, eval_results, **kwargs)
    path = Path(export_dir) / "README.md"
    path.write_text(str(card), encoding="utf-8")
    return path

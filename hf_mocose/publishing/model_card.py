"""Model cards for exported MoCoSE models: metadata as `huggingface_hub.ModelCardData`, layout in a Jinja template.

The template lives in the top-level `model_cards/` folder (`mocose.md.j2`); installed copies
of the package carry it as package data under `hf_mocose/templates/`. What the card states about
the run comes from `model_card_facts` (config.json, training_args.json, training_data.json,
trainer_state.json, the evaluation JSON) or is passed in; nothing is guessed. What it shares with
sentence-transformers' own cards (architecture, dimension, max length, similarity function, usage output,
training logs, versions, widget, library and tags) comes from `SentenceTransformerModelCardData` and the
export loaded as a `SentenceTransformer` (`card_data`). The card is rendered and re-parsed through
`huggingface_hub.ModelCard`, so bad YAML metadata fails here, not on the Hub.

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

from .card_data import build_card_data, training_data_tables
from .model_card_facts import (
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
CITATION_NAMES = {"mocose": "MoCoSE", "simcse": "SimCSE", "ifcl": "IFCL", "una": "UNA"}


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
    """Versions of hf-mocose and huggingface_hub at export (sentence-transformers' card data has the rest)."""
    versions = {}
    for name in ("hf-mocose", "huggingface_hub"):
        try:
            versions[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            pass
    return versions


def _is_hub_id(value: str | None) -> bool:
    """A Hub model id (`name` or `namespace/name`), not a local folder, can go in `base_model`."""
    return bool(value) and not Path(value).exists() and not value.startswith((".", "/", "~")) and value.count("/") <= 1


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
    trainer_state: Any | None = None,
):
    """Renders the card for the sentence-transformers folder `export_dir` as a `ModelCard`.

    `model_name` is the card's title and model-index name (default: the repo's or folder's name);
    `tags` and `tasks` (a string is one) join the metadata tags; `dataset_args` are shown with the
    corpus. `training_args` is the live arguments object (else the checkpoint's training_args.json),
    `trainer_state` the live `TrainerState` (else the run's trainer_state.json: the logs table, steps).
    """
    from huggingface_hub import ModelCard
    from sentence_transformers import SentenceTransformer

    export_dir = Path(export_dir)
    details = collect_training_details(checkpoint, training_args, global_batch_size, train_runtime, hardware,
                                       trainer_state)
    results = read_eval_results(eval_results)
    base_model = base_model or details["base_model"]
    base_for_card = base_model if _is_hub_id(base_model) else None  # a local folder name means nothing to readers
    model_id = repo_id or f"path/to/{export_name or export_dir.name}"
    method = details["method"]
    cited = ["mocose", *([method] if method != "mocose" and method in CITATIONS else []),
             *(["una"] if details["una_used"] else [])]
    title = model_name or (repo_id.split("/")[-1] if repo_id else (export_name or export_dir.name))
    # The export itself, as sentence-transformers loads it: dimension, length, similarity, architecture.
    st_model = SentenceTransformer(str(export_dir), device="cpu", local_files_only=True)
    card_data = build_card_data(
        st_model, details, results, model_id=model_id, is_repo=bool(repo_id), model_name=title,
        base_model=base_for_card, datasets=datasets, language=language, license=license,
        tags=_unique(["mocose", method, *(["una"] if details["una_used"] else []), *as_list(tags), *as_list(tasks)]),
        citations={CITATION_NAMES[name]: CITATIONS[name] for name in cited},
    )
    # sentence-transformers keeps no record of the keywords its Transformer module loads the encoder with but the
    # one the export wrote (`add_pooling_layer=False`); the transformers-only snippet passes the same.
    encoder_kwargs = (_read_json(export_dir / "sentence_bert_config.json") or {}).get("model_kwargs") or {}
    template_path = find_template(template)
    card = ModelCard.from_template(
        card_data,
        template_path=str(template_path),
        title=title,
        model_id=model_id,
        is_repo=bool(repo_id),
        method_name=CITATION_NAMES.get(method, method),
        sentence_pooling=details["sentence_pooling"],
        max_seq_length=st_model.max_seq_length,  # what the export truncates at
        training_max_seq_length=details["training_max_seq_length"],
        has_dense=any(type(module).__name__ == "Dense" for module in st_model),
        encoder_kwargs=encoder_kwargs,
        modules=[type(module).__name__ for module in st_model],
        details=details,
        results=results,
        sts_tasks=[(t, TASK_NAMES[t]) for t in STS_TASKS],
        transfer_tasks=[(t, TASK_NAMES[t]) for t in TRANSFER_TASKS],
        paper_avg=PAPER_STS_AVG.get(base_for_card or ""),
        corpus=corpus or (", ".join(datasets) if datasets else None),
        dataset_args=as_list(dataset_args),
        training_data=details["training_data"],
        training_data_tables=training_data_tables(details["training_data"]),
        extra_versions=library_versions(),
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

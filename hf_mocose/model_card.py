"""Model cards for exported MoCoSE models: facts gathered here, layout in a Jinja template.

The template lives in the top-level `model_cards/` folder (`mocose.md.j2`); installed copies
of the package carry it as package data under `hf_mocose/templates/`. Everything the card
states is read from the checkpoint (config.json, training_args.bin, trainer_state.json, in the
checkpoint or its parent output dir) or passed in; nothing is guessed. The card is rendered and
re-parsed through `huggingface_hub.ModelCard`, so bad YAML metadata fails here, not on the Hub.
"""

from __future__ import annotations

import json
import logging
import math
import os
from importlib import metadata as importlib_metadata
from importlib import resources
from pathlib import Path
from typing import Any

from .sequence_length import sentence_transformers_max_seq_length

logger = logging.getLogger(__name__)

DEFAULT_TEMPLATE = "mocose.md.j2"
STS_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
TRANSFER_TASKS = ("mr", "cr", "subj", "mpqa", "sst2", "trec", "mrpc")
TASK_NAMES = {
    "sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16",
    "stsb": "STS-B", "sickr": "SICK-R", "stsb_dev": "STS-B dev",
    "mr": "MR", "cr": "CR", "subj": "SUBJ", "mpqa": "MPQA", "sst2": "SST-2", "trec": "TREC", "mrpc": "MRPC",
}
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
# Training-argument fields shown in the card, with their labels (model fields come from config.json).
TRAINING_FIELDS = {
    "ema_decay_start": "EMA decay η at the first step",
    "ema_decay_end": "EMA decay η at the end of the cosine ramp",
    "ema_decay_horizon": "EMA ramp length (optimizer steps)",
    "fgsm_mode": "FGSM mode",
    "fgsm_epsilon": "FGSM epsilon",
    "fgsm_views": "FGSM perturbed branches",
    "per_device_train_batch_size": "batch size per device",
    "gradient_accumulation_steps": "gradient accumulation steps",
    "learning_rate": "learning rate",
    "weight_decay": "weight decay",
    "num_train_epochs": "epochs",
    "lr_scheduler_type": "LR schedule",
    "warmup_steps": "warm-up steps",
    "seed": "seed",
    # method-family switches, shown when the run set them
    "queue_slice": "negatives: queue ages (0 = newest)",
    "target_mtd": "target maximum traceable distance",
    "token_shuffle": "token shuffle",
    "token_cutoff": "token cutoff rate",
    "feature_cutoff": "feature cutoff rate",
    "augmentation_views": "views the embedding augmentations reach",
    "hard_negatives": "hard negatives",
    "una_frequency": "UNA negatives every f steps",
    "una_usage": "UNA sentences used as",
}
# Shown only when they differ from "off" (None / False / 0); the rest of TRAINING_FIELDS always.
OPTIONAL_TRAINING_FIELDS = ("ema_decay_horizon", "queue_slice", "target_mtd", "token_shuffle", "token_cutoff",
                            "feature_cutoff", "hard_negatives")
MODEL_FIELDS = {
    "method": "method",
    "sentence_pooling": "sentence pooling (exported)",
    "max_seq_length": "training sequence length (tokens)",
    "contrastive_temperature": "temperature τ",
    "queue_size": "queue size K",
    "queue_init_size": "initial queue size K_s (random keys)",
    "in_batch_negatives": "in-batch negatives",
    "projection_layers": "projection layers",
    "predictor_layers": "predictor layers",
    "predictor_dim": "predictor width",
    "head_dropout": "head dropout",
    "encoder_dropout": "encoder dropout",
    "target_dropout": "target branch dropout",
}


def find_template(template: str | os.PathLike | None = None) -> Path:
    """The card template: `template` if it is a file, else that name (default `mocose.md.j2`)
    in the repository's `model_cards/` folder (source checkouts) or the installed package data."""
    if template is not None and Path(template).is_file():
        return Path(template)
    name = DEFAULT_TEMPLATE if template is None else str(template)
    candidates = [Path(__file__).resolve().parents[1] / "model_cards" / name]
    try:
        candidates.append(Path(str(resources.files("hf_mocose") / "templates" / name)))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - unusual loaders
        pass
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"Model card template {name!r} not found (looked in: {', '.join(map(str, candidates))}).")


# ----------------------------------------------------------------------------- inputs
def read_eval_results(source: str | os.PathLike | dict | None) -> dict[str, Any]:
    """Normalises an evaluation JSON (path or dict) to `{"sts": {task: {...}}, "transfer": {...}, "avg": x}`.

    Accepts the `hf-mocose evaluate` format (`{"sts12": {"spearman": .., "pearson": .., "n": ..},
    ..., "avg": ..}`, transfer tasks holding `accuracy`), the same nested under "sts"/"transfer"
    or "results", and the trainer's `eval_results.json` (`eval_stsb_spearman` -> STS-B dev).
    """
    if source is None:
        return read_eval_results({})
    if isinstance(source, dict):
        raw = source
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"Evaluation results file {str(path)!r} does not exist.")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"Evaluation results file {str(path)!r} is not valid JSON: {err}") from err
    if not isinstance(raw, dict):
        raise ValueError(f"Evaluation results must be a JSON object, got {type(raw).__name__}.")
    flat: dict[str, Any] = {}
    for key in ("results", "sts", "transfer", "tasks"):
        if isinstance(raw.get(key), dict):
            flat.update(raw[key])
    flat.update({k: v for k, v in raw.items() if k not in ("results", "sts", "transfer", "tasks")})
    if "eval_stsb_spearman" in flat and "stsb_dev" not in flat:
        flat["stsb_dev"] = {"spearman": flat["eval_stsb_spearman"], "pearson": flat.get("eval_stsb_pearson")}
    sts, transfer = {}, {}
    for task in (*STS_TASKS, "stsb_dev"):
        value = flat.get(task)
        if isinstance(value, (int, float)):
            value = {"spearman": value}
        if isinstance(value, dict) and isinstance(value.get("spearman"), (int, float)):
            sts[task] = {k: value.get(k) for k in ("spearman", "pearson", "n")}
    for task in TRANSFER_TASKS:
        value = flat.get(task)
        accuracy = value.get("accuracy", value.get("acc")) if isinstance(value, dict) else value
        if isinstance(accuracy, (int, float)):
            transfer[task] = float(accuracy)
    avg = flat.get("avg", flat.get("sts_avg"))
    if isinstance(avg, dict):
        avg = avg.get("spearman")
    # `avg_over` (hf-mocose evaluate) says which STS tasks the average covers; a partial average
    # must not be labelled, or compared with the paper, as the 7-task one.
    avg_over = flat.get("avg_over") or [t for t in STS_TASKS if t in sts]
    if not isinstance(avg, (int, float)) and all(t in sts for t in STS_TASKS):
        avg, avg_over = sum(sts[t]["spearman"] for t in STS_TASKS) / len(STS_TASKS), list(STS_TASKS)
    complete = set(STS_TASKS) <= set(avg_over)
    label = "Average (7 STS)" if complete else "Average over " + ", ".join(TASK_NAMES.get(t, t) for t in avg_over)
    transfer_avg = flat.get("transfer_avg")
    return {
        "sts": sts, "transfer": transfer, "avg": float(avg) if isinstance(avg, (int, float)) else None,
        "avg_complete": complete, "avg_label": label,
        "transfer_avg": float(transfer_avg) if isinstance(transfer_avg, (int, float)) else None,
    }


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _find_in_run(checkpoint: Path, name: str) -> Path | None:
    """`name` in the checkpoint, else in its parent output dir, else in the parent's latest checkpoint-N."""
    for folder in (checkpoint, checkpoint.parent):
        if (folder / name).is_file():
            return folder / name
    numbered = [p for p in checkpoint.parent.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    for folder in sorted(numbered, key=lambda p: int(p.name.split("-")[-1]), reverse=True):
        if (folder / name).is_file():
            return folder / name
    return None


def load_training_args(checkpoint: str | os.PathLike) -> Any | None:
    """The `TrainingArguments` pickled by the Trainer (`training_args.bin`), or None.

    Unpickling runs code from the file, so only the user's own run folders should be given here
    (the same trust `Trainer(resume_from_checkpoint=...)` already assumes).
    """
    path = _find_in_run(Path(checkpoint), "training_args.bin")
    if path is None:
        return None
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # an unreadable file must not block the export
        logger.warning("Could not read %s (%s); the card will omit the training arguments.", path, err)
        return None


def collect_training_details(
    checkpoint: str | os.PathLike | None,
    training_args: Any | None = None,
    global_batch_size: int | None = None,
    train_runtime: float | None = None,
    hardware: str | None = None,
) -> dict[str, Any]:
    """Everything the card says about training, from the checkpoint and its run folder."""
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    config = _read_json(checkpoint / "config.json") if checkpoint else None
    config = config or {}
    if training_args is None and checkpoint is not None:
        training_args = load_training_args(checkpoint)
    state = _read_json(_find_in_run(checkpoint, "trainer_state.json") or Path("-")) if checkpoint else None
    state = state or {}
    model_rows = [(label, config[name]) for name, label in MODEL_FIELDS.items() if name in config]
    train = {name: getattr(training_args, name) for name in TRAINING_FIELDS if hasattr(training_args, name)}
    train = {name: getattr(value, "value", value) for name, value in train.items()}  # enums -> "linear"
    train = {k: v for k, v in train.items() if k not in OPTIONAL_TRAINING_FIELDS or v not in (None, False, 0, 0.0)}
    if train.get("hard_negatives") is None:
        train.pop("una_frequency", None)
        train.pop("una_usage", None)
    if not any(train.get(name) for name in ("token_shuffle", "token_cutoff", "feature_cutoff")):
        train.pop("augmentation_views", None)
    train_rows = [(TRAINING_FIELDS[name], value) for name, value in train.items()]
    batch_assumed = global_batch_size is None
    if batch_assumed and "per_device_train_batch_size" in train:
        # Processes are not recorded in the arguments file; publish_final_model passes the real value.
        global_batch_size = train["per_device_train_batch_size"] * train.get("gradient_accumulation_steps", 1)
    d_trace = None
    if config.get("method", "mocose") == "mocose" and "ema_decay_end" in train and global_batch_size:
        from .mtd import max_traceable_distance

        d_trace = max_traceable_distance(train["ema_decay_end"], config.get("queue_size", 512), global_batch_size)
    for entry in reversed(state.get("log_history", [])):
        if train_runtime is None and "train_runtime" in entry:
            train_runtime = entry["train_runtime"]
    # Only explicit switches count: tuning fields such as una_alpha have non-zero defaults.
    una_used = getattr(training_args, "hard_negatives", None) == "una"
    return {
        "method": config.get("method", "mocose"),
        "model_rows": model_rows,
        "train_rows": train_rows,
        "global_batch_size": global_batch_size,
        "batch_assumed": batch_assumed,
        "d_trace": None if d_trace is None else ("∞ (η_end = 1)" if math.isinf(d_trace) else f"{d_trace:.2f}"),
        "global_step": state.get("global_step"),
        "max_steps": state.get("max_steps"),
        "train_runtime": _format_duration(train_runtime),
        "hardware": hardware,
        "trained_with_transformers": config.get("transformers_version"),
        "una_used": una_used,
        # Checkpoints before base_model_name_or_path existed: the encoder's own record.
        "base_model": config.get("base_model_name_or_path") or (config.get("encoder_config") or {}).get("_name_or_path"),
    }


def _format_duration(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


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
    tags = ["sentence-transformers", "sentence-similarity", "feature-extraction", "mocose",
            details["method"], *(["una"] if details["una_used"] else []), *(tags or [])]
    return ModelCardData(
        library_name="sentence-transformers", pipeline_tag="sentence-similarity", tags=tags,
        base_model=base_model if _is_hub_id(base_model) else None, datasets=list(datasets) or None,
        language=language, license=license, model_name=model_name, eval_results=evals or None,
    )


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
    tags: list[str] | None = None,
    training_args: Any | None = None,
    global_batch_size: int | None = None,
    train_runtime: float | None = None,
    hardware: str | None = None,
):
    """Renders the card for the sentence-transformers folder `export_dir` as a `ModelCard`."""
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
    title = repo_id.split("/")[-1] if repo_id else (export_name or export_dir.name)
    card_data = build_card_data(
        details, results, model_name=title,
        base_model=base_model, datasets=datasets, language=language, license=license, tags=tags,
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

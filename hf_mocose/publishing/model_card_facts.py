"""What a model card states about a MoCoSE run, read from the checkpoint, its run folder and the evaluation JSON.

Sources: the checkpoint's `config.json` (model fields), `training_args.json` (the training arguments
the card shows, written as JSON by `MoCoSETrainer` whenever it saves a model or checkpoint:
`save_card_training_args`), `trainer_state.json` (steps, wall time) and the `hf-mocose evaluate` or
trainer metrics JSON. Nothing is unpickled: a checkpoint from the Hub is data, and `training_args.bin`
(the Trainer's pickle) would run code from the file when loaded. Checkpoints written before the JSON
existed get a card without the training arguments, which says so.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

TRAINING_ARGS_JSON = "training_args.json"

STS_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
TRANSFER_TASKS = ("mr", "cr", "subj", "mpqa", "sst2", "trec", "mrpc")
TASK_NAMES = {
    "sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16",
    "stsb": "STS-B", "sickr": "SICK-R", "stsb_dev": "STS-B dev",
    "mr": "MR", "cr": "CR", "subj": "SUBJ", "mpqa": "MPQA", "sst2": "SST-2", "trec": "TREC", "mrpc": "MRPC",
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
    "projection_dim": "projection (key and queue) width",
    "head_init": "head initialisation",
    "head_dropout": "head dropout",
    "encoder_dropout": "encoder dropout",
    "target_dropout": "target branch dropout",
    "shared_embeddings": "embeddings shared with the target",
}


def save_card_training_args(args, folder: str | os.PathLike) -> Path:
    """Writes the training arguments the card shows (`TRAINING_FIELDS`, plus `world_size`) to `folder`.

    Called by `MoCoSETrainer` wherever the Trainer saves a model or checkpoint, next to its
    `training_args.bin`, so `hf-mocose export` of any checkpoint reads them without unpickling. The
    number of processes is recorded, so the card's global batch size is exact, not assumed.
    """
    values = args.to_dict()  # enums as their values, secrets masked
    record = {name: values[name] for name in TRAINING_FIELDS if name in values}
    record["world_size"] = getattr(args, "world_size", 1)
    path = Path(folder) / TRAINING_ARGS_JSON
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def load_card_training_args(checkpoint: str | os.PathLike) -> dict[str, Any] | None:
    """The training arguments `save_card_training_args` wrote for `checkpoint` (or its run folder), or None.

    Only JSON is read; a run folder that holds only `training_args.bin` gives None (never unpickled).
    """
    path = _find_in_run(Path(checkpoint), TRAINING_ARGS_JSON)
    return _read_json(path) if path is not None else None


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


def collect_training_details(
    checkpoint: str | os.PathLike | None,
    training_args: Any | None = None,
    global_batch_size: int | None = None,
    train_runtime: float | None = None,
    hardware: str | None = None,
) -> dict[str, Any]:
    """Everything the card says about training, from the checkpoint and its run folder.

    `training_args` is the live arguments object (or any object with those attributes), or the dict
    `load_card_training_args` reads; without it, the checkpoint's `training_args.json` is read.
    """
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    config = _read_json(checkpoint / "config.json") if checkpoint else None
    config = config or {}
    if training_args is None and checkpoint is not None:
        training_args = load_card_training_args(checkpoint)
    recorded = _as_record(training_args)
    # A run saved before training_args.json existed: its pickle is never read, and the card says so.
    pickle_only = not recorded and checkpoint is not None and _find_in_run(checkpoint, "training_args.bin") is not None
    state = _read_json(_find_in_run(checkpoint, "trainer_state.json") or Path("-")) if checkpoint else None
    state = state or {}
    model_rows = [(label, config[name]) for name, label in MODEL_FIELDS.items() if name in config]
    train = {name: recorded[name] for name in TRAINING_FIELDS if name in recorded}
    train = {k: v for k, v in train.items() if k not in OPTIONAL_TRAINING_FIELDS or v not in (None, False, 0, 0.0)}
    if train.get("hard_negatives") is None:
        train.pop("una_frequency", None)
        train.pop("una_usage", None)
    if not any(train.get(name) for name in ("token_shuffle", "token_cutoff", "feature_cutoff")):
        train.pop("augmentation_views", None)
    train_rows = [(TRAINING_FIELDS[name], value) for name, value in train.items()]
    world_size = recorded.get("world_size")
    batch_assumed = global_batch_size is None and world_size is None
    if global_batch_size is None and "per_device_train_batch_size" in train:
        # B = per device x accumulation x processes; a record without world_size is assumed to be one process.
        global_batch_size = (train["per_device_train_batch_size"] * train.get("gradient_accumulation_steps", 1)
                             * (world_size or 1))
    d_trace = None
    if config.get("method", "mocose") == "mocose" and "ema_decay_end" in train and global_batch_size:
        from ..methods.mtd import max_traceable_distance

        d_trace = max_traceable_distance(train["ema_decay_end"], config.get("queue_size", 512), global_batch_size)
    for entry in reversed(state.get("log_history", [])):
        if train_runtime is None and "train_runtime" in entry:
            train_runtime = entry["train_runtime"]
    # Only explicit switches count: tuning fields such as una_alpha have non-zero defaults.
    una_used = recorded.get("hard_negatives") == "una"
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
        "pickle_only": pickle_only,
        # Checkpoints before base_model_name_or_path existed: the encoder's own record.
        "base_model": config.get("base_model_name_or_path") or (config.get("encoder_config") or {}).get("_name_or_path"),
    }


def _as_record(training_args: Any | None) -> dict[str, Any]:
    """The card's fields (and `world_size`) of a live arguments object or of a JSON record, enums as values."""
    if training_args is None:
        return {}
    names = (*TRAINING_FIELDS, "world_size")
    if isinstance(training_args, dict):
        record = {name: training_args[name] for name in names if name in training_args}
    else:
        record = {name: getattr(training_args, name) for name in names if hasattr(training_args, name)}
    return {name: getattr(value, "value", value) for name, value in record.items()}  # enums -> "linear"


def _format_duration(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"



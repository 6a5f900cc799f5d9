"""What a model card states about a MoCoSE run, read from the checkpoint, its run folder and the evaluation JSON.

Sources: the checkpoint's `config.json` (model fields), `training_args.json` (the training arguments
the card shows, written as JSON by `MoCoSETrainer` whenever it saves a model or checkpoint:
`card_hyperparameters.save_card_training_args`), `training_data.json` (the training data, described at
the start of training: `training_data_facts`), `trainer_state.json` (steps, wall time, the logs table,
the best step) and the `hf-mocose evaluate` or trainer metrics JSON. Nothing is unpickled: a checkpoint
from the Hub is data, and `training_args.bin` (the Trainer's pickle) would run code from the file when
loaded. Checkpoints written before the JSON existed get a card without the training arguments, which says so.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from .card_hyperparameters import TRAINING_ARGS_JSON, as_record, model_rows, save_card_training_args, training_rows
from .training_data_facts import TRAINING_DATA_JSON, load_training_data

__all__ = ["STS_TASKS", "TASK_NAMES", "TRAINING_ARGS_JSON", "TRANSFER_TASKS", "collect_training_details",
           "load_card_training_args", "read_eval_results", "save_card_training_args", "training_log_rows"]

STS_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
TRANSFER_TASKS = ("mr", "cr", "subj", "mpqa", "sst2", "trec", "mrpc")
TASK_NAMES = {
    "sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16",
    "stsb": "STS-B", "sickr": "SICK-R", "stsb_dev": "STS-B dev",
    "mr": "MR", "cr": "CR", "subj": "SUBJ", "mpqa": "MPQA", "sst2": "SST-2", "trec": "TREC", "mrpc": "MRPC",
}
TRAINING_LOSS, STSB_DEV = "Training Loss", "STS-B dev Spearman"


def load_card_training_args(checkpoint: str | os.PathLike) -> dict[str, Any] | None:
    """The training arguments `save_card_training_args` wrote for `checkpoint` (or its run folder), or None.

    Only JSON is read; a run folder that holds only `training_args.bin` gives None (never unpickled).
    """
    path = _find_in_run(Path(checkpoint), TRAINING_ARGS_JSON)
    return _read_json(path) if path is not None else None


def training_log_rows(state: dict[str, Any]) -> tuple[list[dict[str, Any]], int | None]:
    """`(rows, best step)` for the card's training-logs table, from a `trainer_state.json` (or `TrainerState`).

    One row per logged step: `Epoch`, `Step`, `Training Loss` and `STS-B dev Spearman` (x100), as
    logged (4 decimals), merged when a step has both. The best step is `best_global_step` (else the step of
    `best_model_checkpoint`), set when `metric_for_best_model` picked a best checkpoint.
    """
    rows: list[dict[str, Any]] = []
    for entry in state.get("log_history") or []:
        values = {TRAINING_LOSS: entry.get("loss"), STSB_DEV: entry.get("eval_stsb_spearman")}
        values = {key: round(float(value), 4) for key, value in values.items() if isinstance(value, (int, float))}
        if not values or entry.get("step") is None:
            continue
        if rows and rows[-1]["Step"] == entry["step"]:
            rows[-1].update(values)
        else:
            rows.append({"Epoch": round(float(entry.get("epoch") or 0), 4), "Step": entry["step"], **values})
    best = state.get("best_global_step")
    checkpoint = state.get("best_model_checkpoint")
    if best is None and checkpoint and str(checkpoint).rstrip("/").rsplit("-", 1)[-1].isdigit():
        best = int(str(checkpoint).rstrip("/").rsplit("-", 1)[-1])
    return rows, best


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
    trainer_state: Any | None = None,
) -> dict[str, Any]:
    """Everything the card says about training, from the checkpoint and its run folder.

    `training_args` is the live arguments object (or any object with those attributes), or the dict
    `load_card_training_args` reads; without it, the checkpoint's `training_args.json` is read.
    `trainer_state` is the live `TrainerState` (else `trainer_state.json` of the run); the training data
    description is `training_data.json` of the run.
    """
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    config = _read_json(checkpoint / "config.json") if checkpoint else None
    config = config or {}
    if training_args is None and checkpoint is not None:
        training_args = load_card_training_args(checkpoint)
    recorded = as_record(training_args)
    # A run saved before training_args.json existed: its pickle is never read, and the card says so.
    pickle_only = not recorded and checkpoint is not None and _find_in_run(checkpoint, "training_args.bin") is not None
    if trainer_state is not None and not isinstance(trainer_state, dict):
        trainer_state = vars(trainer_state)
    state = trainer_state or (_read_json(_find_in_run(checkpoint, "trainer_state.json") or Path("-")) if checkpoint
                              else None) or {}
    world_size = recorded.get("world_size")
    batch_assumed = global_batch_size is None and world_size is None
    if global_batch_size is None and "per_device_train_batch_size" in recorded:
        # B = per device x accumulation x processes; a record without world_size is assumed to be one process.
        accumulation = recorded.get("gradient_accumulation_steps") or 1
        global_batch_size = recorded["per_device_train_batch_size"] * accumulation * (world_size or 1)
    d_trace = None
    if config.get("method", "mocose") == "mocose" and "ema_decay_end" in recorded and global_batch_size:
        from ..methods.mtd import max_traceable_distance

        d_trace = max_traceable_distance(recorded["ema_decay_end"], config.get("queue_size", 512), global_batch_size)
    for entry in reversed(state.get("log_history", [])):
        if train_runtime is None and "train_runtime" in entry:
            train_runtime = entry["train_runtime"]
    log_rows, best_step = training_log_rows(state)
    arguments = recorded.get("arguments") or {}
    return {
        "method": config.get("method", "mocose"),
        "model_rows": model_rows(config),
        "train_rows": training_rows(recorded),
        "all_arguments": {name: arguments[name] for name in sorted(arguments)},
        "global_batch_size": global_batch_size,
        "batch_assumed": batch_assumed,
        "d_trace": None if d_trace is None else ("∞ (η_end = 1)" if math.isinf(d_trace) else f"{d_trace:.2f}"),
        "global_step": state.get("global_step"),
        "max_steps": state.get("max_steps"),
        "train_runtime": _format_duration(train_runtime),
        "hardware": hardware,
        "trained_with_transformers": config.get("transformers_version"),
        # Only explicit switches count: tuning fields such as una_alpha have non-zero defaults.
        "una_used": recorded.get("hard_negatives") == "una",
        "pickle_only": pickle_only,
        # Checkpoints before base_model_name_or_path existed: the encoder's own record.
        "base_model": (config.get("base_model_name_or_path")
                       or (config.get("encoder_config") or {}).get("_name_or_path")),
        "training_max_seq_length": config.get("max_seq_length"),
        "sentence_pooling": config.get("sentence_pooling", "cls"),
        "queue_size": config.get("queue_size"),
        "log_rows": log_rows,
        "best_step": best_step,
        "best_exported": bool(recorded.get("load_best_model_at_end")),
        "training_data": load_training_data(_find_in_run(checkpoint, TRAINING_DATA_JSON)) if checkpoint else None,
    }


def _format_duration(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"

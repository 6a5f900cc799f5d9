"""What a model card states about a MoCoSE run: its facts, collected while it trains, and its evaluation results.

sentence-transformers' `ModelCardCallback` fills a model's card data while its trainer runs; a MoCoSE card is written
at export, maybe later, offline, from a checkpoint, when the trainer and its data are gone. So `MoCoSETrainer`
describes its training set when it starts (`describe_training_data`) and, from the Trainer's own save hook (`_save`,
as TRL's trainers write their cards when they save), writes the run's facts with every model and checkpoint it
saves, in one JSON file, `card_facts.json` (`save_card_facts`: the training arguments the card shows, the training
data, the logs table and best step, the steps, the wall time, the batch size, the hardware). Nothing is unpickled:
the Trainer's `training_args.bin` would run code from the file. A checkpoint saved before `card_facts.json` existed
is read from the files it has, `training_args.json`, `training_data.json` and `trainer_state.json`
(`load_card_facts`). `training_details` turns the facts and the checkpoint's config into what the card shows.
"""

from __future__ import annotations

import json
import math
import os
from itertools import islice
from pathlib import Path
from typing import Any

from .card_hyperparameters import as_record, model_rows, training_rows

CARD_FACTS_JSON = "card_facts.json"
STS_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
TRANSFER_TASKS = ("mr", "cr", "subj", "mpqa", "sst2", "trec", "mrpc")
TASK_NAMES = {
    "sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16",
    "stsb": "STS-B", "sickr": "SICK-R", "stsb_dev": "STS-B dev",
    "mr": "MR", "cr": "CR", "subj": "SUBJ", "mpqa": "MPQA", "sst2": "SST-2", "trec": "TREC", "mrpc": "MRPC",
}
TRAINING_LOSS, STSB_DEV = "Training Loss", "STS-B dev Spearman"
STATS_ROWS, SAMPLE_ROWS = 1000, 3  # token statistics over the first 1000 sentences (sentence-transformers: 100)


def describe_training_data(dataset, tokenizer, max_seq_length: int) -> dict[str, Any] | None:
    """The card's description of `dataset` (raw `text`, or tokenised `input_ids`, with or without `text`), or None
    (no dataset, or neither column): `{"sentences": N or None (a stream), "columns", "token_lengths": {"min", "mean",
    "max", "rows", "max_seq_length", "longer"}, "samples", "samples_from_tokens"}`. Lengths count tokens as training
    saw them (special tokens included, truncated); `longer`: how many rows were cut (None without the text); the
    samples are the first rows' text, or their tokens decoded."""
    columns = list(getattr(dataset, "column_names", None) or [])
    if dataset is None or not ({"text", "input_ids"} & set(columns)):
        return None
    size = len(dataset) if hasattr(dataset, "__len__") else None
    # An IterableDataset's first rows are read again on every pass: nothing is consumed.
    first = dataset.select(range(min(STATS_ROWS, size))) if size is not None else list(islice(iter(dataset), STATS_ROWS))
    rows = {name: [row[name] for row in first] for name in columns if name in ("text", "input_ids")}
    texts = None if rows.get("text") is None else [text or "" for text in rows["text"]]
    longer = None
    if texts is not None:  # tokenised once, whole: training's lengths are these cut at max_seq_length
        whole = [len(ids) for ids in tokenizer(texts, truncation=False, verbose=False)["input_ids"]]
        longer = sum(length > max_seq_length for length in whole)
    lengths = [len(ids) for ids in rows["input_ids"]] if "input_ids" in rows else [
        min(length, max_seq_length) for length in whole]
    if not lengths:
        return None
    samples = list(texts[:SAMPLE_ROWS]) if texts is not None else [
        tokenizer.decode(ids, skip_special_tokens=True) for ids in rows["input_ids"][:SAMPLE_ROWS]]
    return {
        "sentences": size,
        "columns": [c for c in ("text", "positive_text") if c in columns] or ["text"],
        "token_lengths": {"min": min(lengths), "mean": round(sum(lengths) / len(lengths), 2), "max": max(lengths),
                          "rows": len(lengths), "max_seq_length": max_seq_length, "longer": longer},
        "samples": samples,
        "samples_from_tokens": texts is None,
    }


def describe_hardware(args) -> str:
    """'N x <GPU name>' (or CPU processes) of the live run."""
    import torch

    world = getattr(args, "world_size", 1)
    if torch.cuda.is_available():
        return f"{world} x {torch.cuda.get_device_name(0)}"
    return f"{world} x CPU process" + ("es" if world > 1 else "")


def state_facts(state: dict[str, Any]) -> dict[str, Any]:
    """The card's facts of a `TrainerState` (its `vars`, or a `trainer_state.json`): the steps, the wall time, the
    best step (`best_global_step`, else `best_model_checkpoint`'s) and the logs table, one row per logged step
    (`Epoch`, `Step`, `Training Loss`, `STS-B dev Spearman` x100, 4 decimals, merged when a step has both)."""
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
    best, checkpoint = state.get("best_global_step"), str(state.get("best_model_checkpoint") or "").rstrip("/")
    if best is None and checkpoint.rsplit("-", 1)[-1].isdigit():
        best = int(checkpoint.rsplit("-", 1)[-1])
    runtimes = [entry["train_runtime"] for entry in state.get("log_history") or [] if "train_runtime" in entry]
    return {"global_step": state.get("global_step"), "max_steps": state.get("max_steps"),
            "train_runtime": runtimes[-1] if runtimes else None, "log_rows": rows, "best_step": best}


def card_facts(trainer) -> dict[str, Any]:
    """The card's facts of a live run (see the module), as `save_card_facts` writes them."""
    return {"training_args": as_record(trainer.args), "training_data": getattr(trainer, "training_data", None),
            **state_facts(vars(trainer.state)), "global_batch_size": getattr(trainer, "global_batch_size", None),
            "hardware": describe_hardware(trainer.args)}


def save_card_facts(folder: str | os.PathLike, trainer) -> Path:
    """Writes `card_facts(trainer)` to `folder`/card_facts.json; `MoCoSETrainer` calls it wherever it saves a model
    or checkpoint (main process), so `hf-mocose export` of any of them writes the card without the run."""
    path = Path(folder) / CARD_FACTS_JSON
    facts = json.dumps(card_facts(trainer), indent=2, sort_keys=True, ensure_ascii=False, default=str)
    path.write_text(facts + "\n", encoding="utf-8")
    return path


def _read_json(path: Path | None) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path is not None and path.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _find_in_run(checkpoint: Path, name: str) -> Path | None:
    """`name` in the checkpoint, else in its parent output dir, else in the parent's latest checkpoint-N."""
    numbered = [p for p in checkpoint.parent.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    numbered.sort(key=lambda p: int(p.name.split("-")[-1]), reverse=True)
    return next((folder / name for folder in (checkpoint, checkpoint.parent, *numbered) if (folder / name).is_file()),
                None)


def load_card_facts(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The facts `save_card_facts` wrote for `checkpoint` (in it, its run folder or the run's latest checkpoint).

    A checkpoint saved before that file: the same facts from `training_args.json`, `training_data.json` and
    `trainer_state.json` (same search); `pickle_only` when `training_args.bin` is its only record (never read).
    """
    checkpoint = Path(checkpoint)
    saved = _read_json(_find_in_run(checkpoint, CARD_FACTS_JSON))
    if isinstance(saved, dict):
        return saved
    record = _read_json(_find_in_run(checkpoint, "training_args.json")) or {}
    data = _read_json(_find_in_run(checkpoint, "training_data.json"))
    return {"training_args": record, **state_facts(_read_json(_find_in_run(checkpoint, "trainer_state.json")) or {}),
            "training_data": data if isinstance(data, dict) and isinstance(data.get("token_lengths"), dict) else None,
            "pickle_only": not record and _find_in_run(checkpoint, "training_args.bin") is not None}


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
        from ..methods.mtd import max_traceable_distance

        d_trace = max_traceable_distance(recorded["ema_decay_end"], config.get("queue_size", 512), batch)
    runtime = facts.get("train_runtime")
    minutes, seconds = divmod(int(round(runtime or 0)), 60)
    hours, minutes = divmod(minutes, 60)
    return {
        **state_facts({}), **facts, "method": method, "model_rows": model_rows(config),
        "train_rows": training_rows(recorded), "all_arguments": dict(sorted((recorded.get("arguments") or {}).items())),
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
    }


def read_eval_results(source: str | os.PathLike | dict | None) -> dict[str, Any]:
    """Normalises an evaluation JSON (path or dict) to `{"sts": {task: {...}}, "transfer": {...}, "avg": x, ...}`.

    Accepts the `hf-mocose evaluate` format (`{"sts12": {"spearman": .., "pearson": .., "n": ..}, ..., "avg": ..}`,
    transfer tasks holding `accuracy`), the same nested under "sts"/"transfer" or "results", and the trainer's
    `eval_results.json` (`eval_stsb_spearman` -> STS-B dev).
    """
    raw = source if isinstance(source, dict) else {}
    if source is not None and not isinstance(source, dict):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"Evaluation results file {str(path)!r} does not exist.")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"Evaluation results file {str(path)!r} is not valid JSON: {err}") from err
    if not isinstance(raw, dict):
        raise ValueError(f"Evaluation results must be a JSON object, got {type(raw).__name__}.")
    nested = ("results", "sts", "transfer", "tasks")
    flat = {k: v for key in nested if isinstance(raw.get(key), dict) for k, v in raw[key].items()}
    flat.update({k: v for k, v in raw.items() if k not in nested})
    if "eval_stsb_spearman" in flat and "stsb_dev" not in flat:
        flat["stsb_dev"] = {"spearman": flat["eval_stsb_spearman"], "pearson": flat.get("eval_stsb_pearson")}
    sts, transfer = {}, {}
    for task in (*STS_TASKS, "stsb_dev"):
        value = {"spearman": flat[task]} if isinstance(flat.get(task), (int, float)) else flat.get(task)
        if isinstance(value, dict) and isinstance(value.get("spearman"), (int, float)):
            sts[task] = {k: value.get(k) for k in ("spearman", "pearson", "n")}
    for task in TRANSFER_TASKS:
        value = flat.get(task)
        accuracy = value.get("accuracy", value.get("acc")) if isinstance(value, dict) else value
        if isinstance(accuracy, (int, float)):
            transfer[task] = float(accuracy)
    avg = flat.get("avg", flat.get("sts_avg"))
    avg = avg.get("spearman") if isinstance(avg, dict) else avg
    # `avg_over` (hf-mocose evaluate) says which STS tasks the average covers; a partial average
    # must not be labelled, or compared with the paper, as the 7-task one.
    avg_over = flat.get("avg_over") or [t for t in STS_TASKS if t in sts]
    if not isinstance(avg, (int, float)) and all(t in sts for t in STS_TASKS):
        avg, avg_over = sum(sts[t]["spearman"] for t in STS_TASKS) / len(STS_TASKS), list(STS_TASKS)
    complete = set(STS_TASKS) <= set(avg_over)
    transfer_avg = flat.get("transfer_avg")
    return {
        "sts": sts, "transfer": transfer, "avg": float(avg) if isinstance(avg, (int, float)) else None,
        "avg_complete": complete, "avg_label": "Average (7 STS)" if complete else
        "Average over " + ", ".join(TASK_NAMES.get(t, t) for t in avg_over),
        "transfer_avg": float(transfer_avg) if isinstance(transfer_avg, (int, float)) else None,
    }

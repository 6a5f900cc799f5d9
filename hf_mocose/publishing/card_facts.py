"""The run's facts a model card is written from, collected while it trains (`card_facts.json`).

The card is written at export, maybe later and offline, when the trainer and its data are gone: so `MoCoSETrainer`
describes its training set when it starts (`describe_training_data`) and writes the facts with every model and
checkpoint it saves (`save_card_facts`). Nothing is unpickled (`training_args.bin` would run code from the file).
"""

from __future__ import annotations

import json
import os
from itertools import islice
from pathlib import Path
from typing import Any

from ..launch.checkpoints import list_checkpoints
from .card_hyperparameters import as_record

CARD_FACTS_JSON = "card_facts.json"
TRAINING_LOSS, STSB_DEV = "Training Loss", "STS-B dev Spearman"
STATS_ROWS, SAMPLE_ROWS = 1000, 3  # token statistics over the first 1000 sentences (sentence-transformers: 100)


def describe_training_data(dataset, tokenizer, max_seq_length: int) -> dict[str, Any] | None:
    """The card's description of `dataset` (raw `text` and/or tokenised `input_ids`), or None: `{"sentences": N or
    None (a stream), "columns", "format": {"kind": "sentences", "pairs" or "triplets", "negatives": hard negatives per
    row}, "token_lengths": {"min", "mean", "max", "rows", "max_seq_length", "longer"},
    "samples", "samples_from_tokens"}`, token lengths as training saw them (`longer`: rows cut; None without text)."""
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
    negative = next((c for c in ("negative_text", "negative_input_ids") if c in columns), None)
    negatives = len(first[0][negative]) if negative else 0  # the same in every row (data.corpus checks it)
    kind = "triplets" if negatives else "pairs" if {"positive_text", "positive_input_ids"} & set(columns) else "sentences"
    return {"sentences": size, "columns": [c for c in ("text", "positive_text", "negative_text") if c in columns] or ["text"],
            "format": {"kind": kind, "negatives": negatives},
            "token_lengths": {"min": min(lengths), "mean": round(sum(lengths) / len(lengths), 2), "max": max(lengths),
                              "rows": len(lengths), "max_seq_length": max_seq_length, "longer": longer},
            "samples": samples, "samples_from_tokens": texts is None}


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
    """The card's facts of a live run (see the module), as `save_card_facts` writes them; the hardware is
    'N x <GPU name>' or 'N x CPU process(es)'."""
    import torch
    world = getattr(trainer.args, "world_size", 1)
    return {"training_args": as_record(trainer.args), "training_data": getattr(trainer, "training_data", None),
            **state_facts(vars(trainer.state)), "global_batch_size": getattr(trainer, "global_batch_size", None),
            "hardware": f"{world} x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else
            f"{world} x CPU process" + ("es" if world > 1 else "")}


def save_card_facts(folder: str | os.PathLike, trainer) -> Path:
    """Writes `card_facts(trainer)` to `folder`/card_facts.json (`MoCoSETrainer`, main process: see the module)."""
    path = Path(folder) / CARD_FACTS_JSON
    facts = json.dumps(card_facts(trainer), indent=2, sort_keys=True, ensure_ascii=False, default=str)
    path.write_text(facts + "\n", encoding="utf-8")
    return path


def read_json(path: Path | None) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path is not None and path.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _find_in_run(checkpoint: Path, name: str) -> Path | None:
    """`name` in the checkpoint, else in its parent output dir, else in the parent's latest checkpoint-N."""
    newest_first = reversed(list_checkpoints(checkpoint.parent))
    return next((folder / name for folder in (checkpoint, checkpoint.parent, *newest_first) if (folder / name).is_file()),
                None)


def load_card_facts(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The facts `save_card_facts` wrote for `checkpoint` (in it, its run folder or the run's latest checkpoint);
    for an older one, from its `training_args.json`, `training_data.json` and `trainer_state.json`."""
    checkpoint = Path(checkpoint)
    saved = read_json(_find_in_run(checkpoint, CARD_FACTS_JSON))
    if isinstance(saved, dict):
        return saved
    record = read_json(_find_in_run(checkpoint, "training_args.json")) or {}
    data = read_json(_find_in_run(checkpoint, "training_data.json"))
    return {"training_args": record, **state_facts(read_json(_find_in_run(checkpoint, "trainer_state.json")) or {}),
            "training_data": data if isinstance(data, dict) and isinstance(data.get("token_lengths"), dict) else None,
            "pickle_only": not record and _find_in_run(checkpoint, "training_args.bin") is not None}


def public_name(value: Any) -> Any:
    """A local path (absolute, relative or existing here) as its file name: a card never shows a machine's folders."""
    if isinstance(value, str) and "/" in value.replace(os.sep, "/") and (
            os.path.isabs(value) or value.startswith((".", "~")) or os.path.exists(value)):
        return Path(value).name
    return value

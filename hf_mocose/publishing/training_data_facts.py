"""What the model card says about the training data, recorded when training starts (`training_data.json`).

A card is written when a checkpoint is exported, maybe later, offline, on another machine, where the
training sentences are gone. So `MoCoSETrainer` describes its training set once, at start
(`describe_training_data`: the sentence count, token-length statistics of the first sentences as
training tokenised them, a few sample rows, as sentence-transformers' cards show them), and saves the
description with every model and checkpoint it saves (`save_card_records`), beside `training_args.json`.
The card reads it back with `load_training_data`.
"""

from __future__ import annotations

import json
import os
from itertools import islice
from pathlib import Path
from typing import Any

from .card_hyperparameters import save_card_training_args

TRAINING_DATA_JSON = "training_data.json"
STATS_ROWS = 1000  # token-length statistics over the first 1000 sentences (sentence-transformers: the first 100)
SAMPLE_ROWS = 3  # sample rows shown on the card, as sentence-transformers shows
TEXT_COLUMNS = ("text", "positive_text")


def describe_training_data(dataset, tokenizer, max_seq_length: int) -> dict[str, Any] | None:
    """The card's description of `dataset` (raw `text`, or tokenised `input_ids`, with or without `text`).

    Returns `{"sentences": N or None (a stream), "columns": [...], "token_lengths": {"min", "mean", "max",
    "rows", "max_seq_length", "longer": k or None}, "samples": [...], "samples_from_tokens": bool}`:
    lengths count tokens as training saw them (special tokens included, truncated at `max_seq_length`);
    `longer` is how many of those rows were longer before truncation (known when the text is there);
    samples are the first rows' text, or, for a tokenised set without it, their tokens decoded. None
    for no dataset, or one with neither `text` nor `input_ids` (a plain torch dataset).
    """
    columns = list(getattr(dataset, "column_names", None) or [])
    if dataset is None or not ({"text", "input_ids"} & set(columns)):
        return None
    size = len(dataset) if hasattr(dataset, "__len__") else None
    if size is not None:
        rows = dataset.select(range(min(STATS_ROWS, size)))
        rows = {name: rows[name] for name in columns if name in ("text", "input_ids")}
    else:  # an IterableDataset: its first rows, read again on every pass, so nothing is consumed
        first = list(islice(iter(dataset), STATS_ROWS))
        rows = {name: [row[name] for row in first] for name in columns if name in ("text", "input_ids")}
    texts = None if rows.get("text") is None else [text or "" for text in rows["text"]]
    longer = None
    if texts is not None:  # tokenised once, whole: training's lengths are these cut at max_seq_length
        whole = [len(ids) for ids in tokenizer(texts, truncation=False, verbose=False)["input_ids"]]
        longer = sum(length > max_seq_length for length in whole)
    if "input_ids" in rows:
        lengths = [len(ids) for ids in rows["input_ids"]]
    else:
        lengths = [min(length, max_seq_length) for length in whole]
    if not lengths:
        return None
    samples = list(texts[:SAMPLE_ROWS]) if texts is not None else [
        tokenizer.decode(ids, skip_special_tokens=True) for ids in rows["input_ids"][:SAMPLE_ROWS]]
    return {
        "sentences": size,
        "columns": [c for c in TEXT_COLUMNS if c in columns] or ["text"],
        "token_lengths": {"min": min(lengths), "mean": round(sum(lengths) / len(lengths), 2), "max": max(lengths),
                          "rows": len(lengths), "max_seq_length": max_seq_length, "longer": longer},
        "samples": samples,
        "samples_from_tokens": texts is None,
    }


def save_card_records(folder: str | os.PathLike, args, training_data: dict[str, Any] | None = None) -> None:
    """What the card reads from a saved model or checkpoint: `training_args.json` and, when the run described
    its data, `training_data.json`. Called wherever `MoCoSETrainer` saves one (main process)."""
    save_card_training_args(args, folder)
    if training_data is not None:
        path = Path(folder) / TRAINING_DATA_JSON
        path.write_text(json.dumps(training_data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def load_training_data(path: Path | None) -> dict[str, Any] | None:
    """The description `save_card_records` wrote at `path` (found by the card's run-folder search), or None."""
    if path is None or not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("token_lengths"), dict) else None

"""Training data from source to batch: sentences, (anchor, positive) pairs or (anchor, positive, negative_1..n)
triplets from a file, a `datasets` dataset or the built-in offline corpus, tokenised once, then padded into batches
with each anchor's given or UNA hard negatives."""

from __future__ import annotations

import glob
import re
import zlib
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset, Features, IterableDataset, List, Value, load_dataset
from transformers import DataCollatorWithPadding

BUILTIN_PYTHON_DOCS = "builtin:python_docs"
# Raw sentences the collator keeps beside the tokens for UNA (the anchors; given positives for its statistics), and
# each row's given hard negatives (`negative_text`: a list of n sentences, the same n in every row).
TEXT_COLUMNS = ("text", "positive_text", "negative_text")
# sentence-transformers' column names for labelled data, found without flags when there is no `text` column
ANCHOR, POSITIVE, NEGATIVE = "anchor", "positive", re.compile(r"negative(_\d+)?")
LABEL_COLUMNS = ("label", "labels", "score", "scores")  # what sentence-transformers' collator reads as labels
TEXT_DTYPES = ("string", "large_string")
_EXTENSION_BUILDERS = {".txt": "text", ".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def python_docs_sentences(min_words: int = 4, max_words: int = 60) -> list[str]:
    """English sentences from the Python documentation that ships with every CPython (`pydoc_data.topics`): a corpus
    on any fresh install, for smoke runs and the offline quickstart; technical prose, no substitute for wiki1m."""
    from pydoc_data.topics import topics
    text = " ".join(re.sub(r"\s+", " ", body) for _, body in sorted(topics.items()))
    sentences = (s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'(])", text))
    kept = (s for s in sentences if min_words <= len(s.split()) <= max_words and not s.startswith((">>>", "...")))
    return list(dict.fromkeys(kept))  # first occurrences, in order


def load_sentences(train_file: str | None = None, dataset_name: str | None = None, dataset_config: str | None = None,
                   dataset_split: str = "train", text_column: str = "text", max_train_samples: int | None = None,
                   fraternal_column: str | None = None, positive_column: str | None = None,
                   negative_columns: list[str] | None = None, streaming: bool = False) -> Dataset | IterableDataset:
    """Loads training sentences as a `Dataset` with a `text` column (`text_column` renamed); blank ones are dropped.

    `train_file`: one sentence per line (`.txt`), a `.csv`/`.tsv`/`.json`/`.jsonl`/`.parquet` file with a
    `text_column` (UTF-8: `check_corpus`), a folder or a glob of such files (`corpus_files`), or `builtin:python_docs` (the offline corpus); else the `datasets` dataset
    `dataset_name` (Hub name or local folder). `max_train_samples`: the first N sentences only. `fraternal_column`
    (IFCL's second text, e.g. a translation) and `positive_column` (a given positive, e.g. a paraphrase) are kept as
    `fraternal_text` and `positive_text`; `negative_columns` (hard negatives, encoded like keys) as one list column
    `negative_text`. Without a `text_column` in the data, sentence-transformers' `anchor`, `positive` and `negative` /
    `negative_1..n` columns are read as these (`labelled_columns`). `streaming`: an `IterableDataset` read as training
    goes, for corpora that do not fit in memory: blank lines are dropped as they stream; only a 0-byte file is
    refused, and empty positives are not looked for."""
    if train_file == BUILTIN_PYTHON_DOCS:
        dataset = Dataset.from_dict({"text": python_docs_sentences()})
        dataset = dataset.to_iterable_dataset() if streaming else dataset
    elif train_file is not None:
        builder, files = check_corpus(train_file)
        extra = {"delimiter": "\t"} if files[0].suffix.lower() == ".tsv" else {}
        dataset = load_dataset(builder, data_files=[str(path) for path in files], split="train", streaming=streaming,
                               **extra)
    elif dataset_name is not None:
        dataset = load_dataset(dataset_name, dataset_config, split=dataset_split, streaming=streaming)
    else:
        raise ValueError("No training data: give train_file (a path or builtin:python_docs) or dataset_name.")
    dataset = select_training_columns(dataset, text_column, positive_column, negative_columns, fraternal_column,
                                      f"The training data ({train_file or dataset_name})")
    if max_train_samples is not None:  # clamped: Dataset.take raises past the end (datasets#8483)
        dataset = dataset.take(max_train_samples if streaming else min(max_train_samples, len(dataset)))
    return dataset


def labelled_columns(columns: list[str], text_column: str = "text", positive_column: str | None = None,
                     negative_columns: list[str] | None = None) -> tuple[str, str | None, list[str]]:
    """The (sentence or anchor, positive, hard negatives) columns of a table with `columns`: the ones named, or, when
    `text_column` is `text` and no such column exists, sentence-transformers' `anchor`, `positive` and `negative` /
    `negative_1`, `negative_2`, ... (in that order), so that a table in its format needs no flag."""
    negative_columns = list(negative_columns or [])
    if text_column == "text" and "text" not in columns and ANCHOR in columns:
        text_column = ANCHOR
        positive_column = positive_column or (POSITIVE if POSITIVE in columns else None)
        if not negative_columns:
            found = [c for c in columns if NEGATIVE.fullmatch(c)]
            negative_columns = sorted(found, key=lambda c: int(c.rpartition("_")[2]) if c[-1].isdigit() else 0)
    if negative_columns and positive_column is None:
        raise ValueError(f"Hard negatives ({', '.join(negative_columns)}) need a positive for each anchor: name its "
                         "column (positive_column).")
    return text_column, positive_column, negative_columns


def select_training_columns(dataset, text_column: str = "text", positive_column: str | None = None,
                            negative_columns: list[str] | None = None, fraternal_column: str | None = None,
                            what: str = "train_dataset"):
    """`dataset` with only its training columns, renamed `text`, `positive_text`, `negative_text` (a list per row,
    `gather_negatives`) and `fraternal_text` (`labelled_columns` finds them); blank sentences dropped. Refused in one
    line: a named column that is missing, a label column or a column that is not text beside the text columns of a
    table in sentence-transformers' format, and an empty positive or negative (every row needs the same number)."""
    if isinstance(dataset, IterableDataset) and dataset.features is None:  # a stream whose columns are read at
        dataset = dataset._resolve_features()  # its first rows (a JSON file under datasets 4.0)
    text_column, positive_column, negatives = labelled_columns(dataset.column_names, text_column, positive_column,
                                                                negative_columns)
    optional = {"fraternal_column": (fraternal_column, "fraternal_text"), "positive_column": (positive_column, "positive_text"),
                **{f"negative_column {c!r}": (c, c) for c in negatives}}
    for role, column in (("text_column", text_column), *((r, c) for r, (c, _) in optional.items())):
        if column is not None and column not in dataset.column_names:
            raise ValueError(f"{role.split()[0]} {column!r} is not in the training data (columns: "
                             f"{', '.join(dataset.column_names)}).")
    columns = {text_column: "text", **{column: name for column, name in optional.values() if column}}
    if text_column == ANCHOR:  # sentence-transformers' format: every other column would be silently left out
        if labels := [c for c in dataset.column_names if c in LABEL_COLUMNS]:
            raise ValueError(f"{what} has the label column {labels[0]!r}, but contrastive training learns from text "
                             f"alone: drop it (dataset.remove_columns({labels!r})).")
    features = getattr(dataset, "features", None) or {}
    if wrong := [c for c in columns if c in features and getattr(features[c], "dtype", None) not in TEXT_DTYPES]:
        raise ValueError(f"{what}: column {wrong[0]!r} holds {features[wrong[0]]}, not text.")
    dataset = dataset.select_columns(list(columns)).rename_columns({k: v for k, v in columns.items() if k != v})
    dataset = drop_blank_sentences(dataset, what)
    for role, (column, name) in optional.items():
        if not column or not isinstance(dataset, Dataset):  # a stream is not read ahead
            continue
        if empty := [i for i, t in enumerate(dataset[name]) if not (isinstance(t, str) and t.strip())]:
            need = "row needs the same number of hard negatives" if column in negatives else "sentence needs one"
            raise ValueError(f"{role.split()[0]} {column!r} is empty in {len(empty)} of {len(dataset)} rows "
                             f"(first: row {empty[0]}); every {need}.")
    return gather_negatives(dataset, negatives)


def gather_negatives(dataset, negative_columns: list[str]):
    """`dataset` with its hard-negative columns joined into one `negative_text` column, a list of them per row."""
    if not negative_columns:
        return dataset
    kept = {k: v for k, v in (dataset.features or {}).items() if k not in negative_columns}
    features = Features({**kept, "negative_text": List(Value("string"))}) if dataset.features else None  # (a stream's)
    return dataset.map(lambda batch: {"negative_text": [list(row) for row in zip(*(batch[c] for c in negative_columns))]},
                       batched=True, remove_columns=negative_columns, features=features)


def corpus_files(train_file: str) -> tuple[str, list[Path]]:
    """The `datasets` builder and the files of `train_file`: a file, a folder of files, or a glob of them (e.g.
    `corpus/*.jsonl`), all of one format, as `load_dataset(builder, data_files=...)` reads them. Refuses in one line
    a path that matches nothing, a file of an unknown format, or formats mixed."""
    path = Path(train_file)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    else:
        files = [path] if path.is_file() else sorted(p for p in map(Path, glob.glob(train_file)) if p.is_file())
    if not files:
        what = "an empty folder" if path.is_dir() else "matches no file" if set("*?[") & set(train_file) else "does not exist"
        raise FileNotFoundError(f"train_file {train_file!r} {'is ' * path.is_dir()}{what}: give a file, a folder or a "
                                f"glob (e.g. 'corpus/*.txt') of {'/'.join(sorted(_EXTENSION_BUILDERS))} files.")
    if unknown := next((p for p in files if p.suffix.lower() not in _EXTENSION_BUILDERS), None):
        raise ValueError(f"train_file {train_file!r}: {unknown.name} has an unsupported extension {unknown.suffix!r}; "
                         f"use one of {', '.join(sorted(_EXTENSION_BUILDERS))}.")
    if len(suffixes := sorted({p.suffix.lower() for p in files})) > 1:
        raise ValueError(f"train_file {train_file!r} mixes formats ({', '.join(suffixes)}): datasets reads one at a "
                         "time; give files of one format.")
    return _EXTENSION_BUILDERS[suffixes[0]], files


def check_dataset_source(dataset_name: str | None, dataset_config: str | None = None,
                         dataset_split: str = "train") -> None:
    """Refuses, before anything loads, a `dataset_name` that cannot be read: offline (HF_HUB_OFFLINE or
    HF_DATASETS_OFFLINE), a Hub id `datasets` cannot build from its cache, and a split the dataset lacks. A local
    folder, or a Hub id online, is left to `load_dataset`."""
    from datasets import config, load_dataset_builder

    if dataset_name is None or Path(dataset_name).exists() or not config.HF_HUB_OFFLINE:
        return
    try:
        builder = load_dataset_builder(dataset_name, dataset_config)
    except Exception as err:  # offline, every failure says the same: not in the cache
        raise ValueError(f"dataset_name {dataset_name!r} cannot be read: offline mode is on (HF_HUB_OFFLINE / "
                         f"HF_DATASETS_OFFLINE) and it is not in the local cache ({type(err).__name__}). Give the "
                         "sentences as a local --train_file (a file, a folder or a glob of .txt/.jsonl/.csv/.parquet "
                         "files), or load the dataset once while online.") from None
    if (splits := builder.info.splits) and dataset_split not in splits:
        raise ValueError(f"dataset_split {dataset_split!r} is not a split of {dataset_name} ({', '.join(splits)}).")


def check_corpus(train_file: str | None) -> tuple[str | None, list[Path]]:
    """Refuses a `train_file` that names no corpus (`corpus_files`), holds nothing, or holds bytes that are not UTF-8
    (naming the file and line: `datasets` fails on them mid-read, streamed mid-training, naming neither); reads each
    text file once, line by line. Returns `corpus_files`' answer; `(None, [])` for no file or `builtin:python_docs`."""
    if not train_file or train_file == BUILTIN_PYTHON_DOCS:
        return None, []
    builder, files = corpus_files(train_file)
    if sum(path.stat().st_size for path in files) == 0:
        raise ValueError(f"train_file {train_file!r} is empty (0 bytes): give a file with one sentence per line "
                         "(or rows with a text column).")
    for path in files if builder != "parquet" else []:
        with path.open("rb") as handle:
            for line, raw in enumerate(handle, 1):  # b"\n" never occurs inside a UTF-8 character
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    named = train_file if path == Path(train_file) else str(path)
                    raise ValueError(f"train_file {named!r} is not UTF-8 text: line {line} holds the byte(s) "
                                     f"{raw[err.start:err.end].hex(' ')} ({err.reason}). Save the file as UTF-8 (e.g. "
                                     "iconv -f latin1 -t utf-8), or fix or remove that line.") from None
    return builder, files


def drop_blank_sentences(dataset: Dataset, what: str = "train_dataset") -> Dataset:
    """`dataset` without blank `text` rows (a stream is filtered as it goes); a `ValueError` if none is left."""
    if isinstance(dataset, Dataset) and len(dataset) == 0:
        raise ValueError(f"{what} has no rows: give at least one sentence (a `text` column of non-empty strings).")
    kept = dataset.filter(lambda batch: [bool(t and t.strip()) for t in batch["text"]], batched=True)
    if isinstance(kept, Dataset) and len(kept) == 0:
        raise ValueError(f"{what} has no non-empty sentences ({len(dataset)} rows, all empty or blank).")
    return kept


def tokenize_sentences(dataset: Dataset, tokenizer, max_seq_length: int, num_proc: int | None = None,
                       keep_text: bool = False) -> Dataset:
    """Tokenises the `text` column (and `positive_text`, and the lists of `negative_text`: `negative_<name>`, a list of
    token rows per row) once with `Dataset.map`, truncated, unpadded; `keep_text` keeps the sentences beside the
    tokens (UNA's hard negatives are made from them, its statistics count them, the model card samples them)."""
    def encode(batch):
        encoded = dict(tokenizer(batch["text"], truncation=True, max_length=max_seq_length))
        if "positive_text" in batch:  # given positives, tokenised the same way
            positives = tokenizer(batch["positive_text"], truncation=True, max_length=max_seq_length)
            encoded.update({f"positive_{name}": values for name, values in positives.items()})
        if "negative_text" in batch:  # given hard negatives: one tokenizer call, then n token rows per row again
            counts = [len(row) for row in batch["negative_text"]]
            negatives = tokenizer([t for row in batch["negative_text"] for t in row], truncation=True,
                                  max_length=max_seq_length)
            starts = np.cumsum([0, *counts])
            encoded.update({f"negative_{name}": [values[a:b] for a, b in zip(starts[:-1], starts[1:])]
                            for name, values in negatives.items()})
        return encoded

    removed = [] if keep_text else [c for c in TEXT_COLUMNS if c in dataset.column_names]
    if isinstance(dataset, Dataset):
        return dataset.map(encode, batched=True, remove_columns=removed, num_proc=num_proc, desc="Tokenizing")
    # Streamed: tokenised lazily (no workers, no progress bar); its columns declared, as the trainers check them.
    return dataset.map(encode, batched=True, remove_columns=removed, features=_tokenized_features(dataset, encode, removed))


def _tokenized_features(dataset, encode, removed: list[str]) -> Features:
    """The features of `dataset` once `encode`d: kept columns plus the tokenizer's, typed as `Dataset.map` does."""
    probe = encode({name: [["A probe sentence."] if name == "negative_text" else "A probe sentence."]
                    for name in TEXT_COLUMNS if name in dataset.column_names})
    kept = {name: feature for name, feature in (dataset.features or {}).items() if name not in removed}
    tokens = {name: List(Value("int32" if name.endswith("input_ids") else "int8")) for name in probe}
    tokens.update({name: List(feature) for name, feature in tokens.items() if name.startswith("negative_")})
    return Features({**kept, **tokens})


def tokenize_fraternal(dataset: Dataset, fraternal_tokenizer, max_seq_length: int) -> Dataset:
    """IFCL: tokenises `fraternal_text` with the fraternal tokenizer, padded to `max_seq_length` like the anchors."""
    def encode(batch):
        encoded = fraternal_tokenizer(batch["fraternal_text"], truncation=True, max_length=max_seq_length,
                                      padding="max_length")
        return {"fraternal_input_ids": encoded["input_ids"], "fraternal_attention_mask": encoded["attention_mask"]}

    return dataset.map(encode, batched=True, remove_columns=["fraternal_text"], desc="Tokenizing fraternal text")


class ContrastiveCollator:
    """Pads tokenised sentences into `(B, L)` batches, with each row's given hard negatives or, with a UNA augmenter,
    each sentence's UNA hard negative.

    Given positives (`positive_*`) are padded apart; given hard negatives (`negative_*`, n token rows per row) are padded
    together into `(B x n, L')` `negative_*` tensors, row by row (the first row's n, then the second's); IFCL's `fraternal_*` (already padded) are stacked as they are;
    with `una_augmenter` the `text` gives `negative_*`, drawn with `seed` and the batch's text (the same in every
    worker, after a resume, on every rank). `pad_to_max_length`: fixed shapes, as FGSM "previous" needs.
    `repeat_positives(token rows, rng=...) -> token rows` makes each sentence's positive from its given positive,
    else itself (ESimCSE's word repetition, `augmentation.views.repeat_words`), padded to its longest row."""

    def __init__(self, tokenizer, max_length: int, pad_to_max_length: bool = False, una_augmenter=None, seed: int = 0,
                 repeat_positives=None):
        self.tokenizer, self.max_length = tokenizer, max_length
        self.padding = "max_length" if pad_to_max_length else "longest"
        self.padder = DataCollatorWithPadding(tokenizer, self.padding, max_length if pad_to_max_length else None)
        self.repeated_padder = DataCollatorWithPadding(tokenizer, "longest")  # a repeated row may pass max_length
        self.una_augmenter, self.seed, self.repeat_positives = una_augmenter, seed, repeat_positives

    def __call__(self, features: list[dict]) -> dict:
        texts = [feature["text"] for feature in features] if "text" in features[0] else None
        tokens = [k for k in features[0] if k not in TEXT_COLUMNS]
        fixed = [k for k in tokens if k.startswith("fraternal_")]  # already padded to max_length
        positive = [k for k in tokens if k.startswith("positive_")]  # padded on their own
        negative = [k for k in tokens if k.startswith("negative_")]  # n rows each, padded together
        own = [k for k in tokens if k not in fixed and k not in positive and k not in negative]
        batch = self.padder([{k: f[k] for k in own} for f in features])
        if negative:
            rows = [{k[len("negative_"):]: f[k][j] for k in negative} for f in features for j in range(len(f[negative[0]]))]
            batch.update({f"negative_{name}": tensor for name, tensor in self.padder(rows).items()})
        for name in fixed:
            batch[name] = torch.tensor([feature[name] for feature in features])
        if positive or self.repeat_positives is not None:
            rows = [{k[len("positive_"):]: f[k] for k in positive} if positive else {k: f[k] for k in own}
                    for f in features]
            padder = self.padder
            if self.repeat_positives is not None:
                ids = [list(row["input_ids"]) for row in rows]
                rng = np.random.default_rng([self.seed, zlib.crc32(np.asarray(sum(ids, []), np.int64).tobytes())])
                rows = [{"input_ids": r, "attention_mask": [1] * len(r), **({"token_type_ids": [0] * len(r)}
                         if "token_type_ids" in rows[0] else {})} for r in self.repeat_positives(ids, rng=rng)]
                padder = self.repeated_padder
            batch.update({f"positive_{name}": tensor for name, tensor in padder(rows).items()})
        if self.una_augmenter is not None:
            if texts is None:
                raise ValueError("Hard negatives need the sentences' text: keep the `text` column in the dataset.")
            rng = np.random.default_rng([self.seed, zlib.crc32("\n".join(texts).encode())])
            negatives = self.tokenizer(self.una_augmenter.augment(texts, rng=rng), truncation=True,
                                       max_length=self.max_length, padding=self.padding, return_tensors="pt")
            batch.update({f"negative_{name}": tensor for name, tensor in negatives.items()})
        return batch

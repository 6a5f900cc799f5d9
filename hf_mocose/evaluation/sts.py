"""Semantic textual similarity (STS) data loaders and scoring, following SentEval/SimCSE.

Layout read (the SentEval ``data/downstream`` folder)::

    <dir>/STS/STS12-en-test/STS.input.<set>.txt   sentence1 TAB sentence2
    <dir>/STS/STS12-en-test/STS.gs.<set>.txt      gold score, or a blank line for an unscored pair
    ... same for STS13-en-test ... STS16-en-test
    <dir>/STS/STSBenchmark/sts-{train,dev,test}.csv   genre TAB file TAB year TAB id TAB score TAB s1 TAB s2 [TAB ...]
    <dir>/SICK/SICK_{train,trial,test_annotated}.txt  pair_ID TAB s1 TAB s2 TAB relatedness TAB ... (header row)

Every file is split on tabs by hand: the sentences contain unbalanced quote characters that a
csv parser would swallow (this silently drops pairs from STS-B).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

# SentEval folder and set names, in SentEval's order.
STS_YEAR_SETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sts12": ("STS12-en-test", ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews")),
    "sts13": ("STS13-en-test", ("FNWN", "headlines", "OnWN")),
    "sts14": ("STS14-en-test", ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news")),
    "sts15": ("STS15-en-test", ("answers-forums", "answers-students", "belief", "headlines", "images")),
    "sts16": ("STS16-en-test", ("answer-answer", "headlines", "plagiarism", "postediting", "question-question")),
}
# Single-file STS tasks: name -> (relative path, reader name).
STS_FILE_TASKS: dict[str, tuple[str, str]] = {
    "stsb": ("STS/STSBenchmark/sts-test.csv", "stsb"),
    "sickr": ("SICK/SICK_test_annotated.txt", "sick"),
    "stsb_dev": ("STS/STSBenchmark/sts-dev.csv", "stsb"),
    # Extras, only run when asked for: useful where the test files are missing.
    "stsb_train": ("STS/STSBenchmark/sts-train.csv", "stsb"),
    "sickr_trial": ("SICK/SICK_trial.txt", "sick"),
    "sickr_train": ("SICK/SICK_train.txt", "sick"),
}
STS_TEST_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
STS_TASKS = STS_TEST_TASKS + ("stsb_dev", "stsb_train", "sickr_trial", "sickr_train")
AGGREGATIONS = ("all", "wmean")

LAYOUT_HELP = (
    "expected the SentEval layout: <dir>/STS/STS1{2..6}-en-test/STS.input.<set>.txt + STS.gs.<set>.txt, "
    "<dir>/STS/STSBenchmark/sts-{train,dev,test}.csv, <dir>/SICK/SICK_{train,trial,test_annotated}.txt"
)


@dataclass
class StsPairs:
    """Sentence pairs with gold similarity scores (``len(sentences1) == len(sentences2) == len(scores)``)."""

    sentences1: list[str]
    sentences2: list[str]
    scores: list[float]
    name: str = ""
    source: list[str] = field(default_factory=list)  # file(s) read

    def __len__(self) -> int:
        return len(self.scores)


def read_lines(path: str | Path) -> list[str]:
    """Lines of a text file without their line ends.

    Not ``str.splitlines()``: it also splits on characters such as U+2028 or \\x1c that occur
    inside sentences, which would shift the input file against its gold file. Decodes UTF-8
    (BOM dropped) and falls back to latin-1 for the older SentEval files.
    """
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _require(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"missing SentEval file {path}; {LAYOUT_HELP}")
    return path


def read_sts_year_set(input_path: str | Path, gold_path: str | Path, name: str = "") -> StsPairs:
    """One STS12-16 set: ``STS.input.<set>.txt`` with ``STS.gs.<set>.txt``; unscored (blank gold) pairs are dropped."""
    inputs, golds = read_lines(_require(Path(input_path))), read_lines(_require(Path(gold_path)))
    if len(inputs) != len(golds):
        raise ValueError(f"{input_path} has {len(inputs)} lines but {gold_path} has {len(golds)}; they must align")
    s1, s2, scores = [], [], []
    for lineno, (line, gold) in enumerate(zip(inputs, golds), start=1):
        if not gold.strip():  # SentEval convention: a blank gold line means the pair was not scored
            continue
        cols = line.split("\t")
        if len(cols) < 2:
            raise ValueError(f"{input_path}:{lineno}: expected 'sentence1<TAB>sentence2', got {line[:80]!r}")
        s1.append(cols[0])
        s2.append(cols[1])
        scores.append(float(gold))
    return StsPairs(s1, s2, scores, name=name, source=[str(input_path), str(gold_path)])


def read_sts_benchmark(path: str | Path) -> StsPairs:
    """One STS-B file ``sts-{train,dev,test}.csv``: score in column 5, sentences in columns 6 and 7 (1-based)."""
    path = _require(Path(path))
    s1, s2, scores = [], [], []
    for lineno, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        cols = line.split("\t")  # never csv: sentences carry stray quotes
        if len(cols) < 7:
            raise ValueError(f"{path}:{lineno}: expected at least 7 tab-separated columns, got {len(cols)}")
        scores.append(float(cols[4]))
        s1.append(cols[5])
        s2.append(cols[6])
    return StsPairs(s1, s2, scores, name=path.stem, source=[str(path)])


def read_sick(path: str | Path) -> StsPairs:
    """One SICK file: ``pair_ID, sentence_A, sentence_B, relatedness_score, ...`` with a header row."""
    path = _require(Path(path))
    s1, s2, scores = [], [], []
    for lineno, line in enumerate(read_lines(path), start=1):
        cols = line.split("\t")
        if not line.strip() or (lineno == 1 and cols[0].strip().lower() == "pair_id"):
            continue
        if len(cols) < 4:
            raise ValueError(f"{path}:{lineno}: expected at least 4 tab-separated columns, got {len(cols)}")
        s1.append(cols[1])
        s2.append(cols[2])
        scores.append(float(cols[3]))
    return StsPairs(s1, s2, scores, name=path.stem, source=[str(path)])


def sts_task_files(senteval_dir: str | Path, task: str) -> list[Path]:
    """Every file `task` needs under `senteval_dir`."""
    root = Path(senteval_dir)
    if task in STS_YEAR_SETS:
        folder, sets = STS_YEAR_SETS[task]
        return [root / "STS" / folder / f"STS.{kind}.{s}.txt" for s in sets for kind in ("input", "gs")]
    if task in STS_FILE_TASKS:
        return [root / STS_FILE_TASKS[task][0]]
    raise ValueError(f"unknown STS task {task!r}; valid: {', '.join(STS_TASKS)}")


def load_sts_task(senteval_dir: str | Path, task: str) -> dict[str, StsPairs]:
    """Loads `task` as ``{set name: pairs}`` (one set for STS-B and SICK-R)."""
    for path in sts_task_files(senteval_dir, task):
        _require(path)
    root = Path(senteval_dir)
    if task in STS_YEAR_SETS:
        folder, sets = STS_YEAR_SETS[task]
        base = root / "STS" / folder
        return {s: read_sts_year_set(base / f"STS.input.{s}.txt", base / f"STS.gs.{s}.txt", name=s) for s in sets}
    rel, reader = STS_FILE_TASKS[task]
    pairs = (read_sts_benchmark if reader == "stsb" else read_sick)(root / rel)
    pairs.name = task
    return {task: pairs}


def _as_tensor(x) -> torch.Tensor:
    return (x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))).detach().to("cpu", torch.float32)


def cosine_scores(embeddings1, embeddings2) -> np.ndarray:
    """Row-wise cosine similarity: `(n, dim)` x `(n, dim)` -> `(n,)` float64 numpy."""
    a, b = _as_tensor(embeddings1), _as_tensor(embeddings2)
    if a.shape != b.shape or a.dim() != 2:
        raise ValueError(f"embeddings must both be (n, dim); got {tuple(a.shape)} and {tuple(b.shape)}")
    # float64: float32 rounding noise would otherwise rank-order identical pairs at random.
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=1, eps=1e-12).numpy()


def score_correlation(predicted, gold) -> dict:
    """Spearman and Pearson (both x100) of predicted vs gold similarities, plus the pair count `n`."""
    from scipy.stats import pearsonr, spearmanr

    predicted, gold = np.asarray(predicted, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if predicted.shape != gold.shape:
        raise ValueError(f"{predicted.shape[0]} predictions for {gold.shape[0]} gold scores")
    if len(gold) < 2:
        raise ValueError("a correlation needs at least 2 pairs")
    # A constant input (up to float rounding, e.g. identical embeddings: all cosines 1) has no
    # correlation: report nan rather than rank rounding noise.
    if np.ptp(predicted) <= 1e-9 or np.ptp(gold) == 0:
        return {"spearman": float("nan"), "pearson": float("nan"), "n": int(len(gold))}
    return {
        "spearman": float(spearmanr(predicted, gold)[0] * 100),
        "pearson": float(pearsonr(predicted, gold)[0] * 100),
        "n": int(len(gold)),
    }


def sts_correlation(embeddings1, embeddings2, gold) -> dict:
    """Cosine similarity of paired embeddings `(n, dim)` against gold `(n,)`.

    Returns ``{"spearman": float, "pearson": float, "n": int}``, correlations x100.
    """
    return score_correlation(cosine_scores(embeddings1, embeddings2), gold)


def aggregate_sets(per_set: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict:
    """Both STS12-16 aggregations from ``{set: (cosine scores, gold)}``.

    ``all``: one correlation over the concatenated sets (SimCSE/MoCoSE, our default).
    ``wmean``: per-set correlations averaged with weights = set sizes (SentEval's "all" entry).
    """
    predicted = np.concatenate([p for p, _ in per_set.values()])
    gold = np.concatenate([g for _, g in per_set.values()])
    concat = score_correlation(predicted, gold)
    sets = {name: score_correlation(p, g) for name, (p, g) in per_set.items()}
    weights = np.array([s["n"] for s in sets.values()], dtype=np.float64)
    wmean = {
        key: float(np.average([s[key] for s in sets.values()], weights=weights)) for key in ("spearman", "pearson")
    }
    return {
        "all": {"spearman": concat["spearman"], "pearson": concat["pearson"]},
        "wmean": wmean,
        "n": concat["n"],
        "sets": sets,
    }


def evaluate_sts_task(
    encode: Callable[[list[str]], torch.Tensor], sets: dict[str, StsPairs], aggregation: str = "all"
) -> dict:
    """Scores one STS task with `encode` (sentences -> `(n, dim)` embeddings).

    Every distinct sentence of the task is encoded once, in one length-sorted pass. Returns
    ``{"spearman", "pearson", "n", "aggregation", "all", "wmean", "sets"}`` (correlations x100;
    the headline numbers follow `aggregation`).
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; choose one of {', '.join(AGGREGATIONS)}")
    unique: dict[str, int] = {}
    for pairs in sets.values():
        for sentence in (*pairs.sentences1, *pairs.sentences2):
            unique.setdefault(sentence, len(unique))
    embeddings = _as_tensor(encode(list(unique)))
    per_set = {}
    for name, pairs in sets.items():
        e1 = embeddings[[unique[s] for s in pairs.sentences1]]
        e2 = embeddings[[unique[s] for s in pairs.sentences2]]
        per_set[name] = (cosine_scores(e1, e2), np.asarray(pairs.scores, dtype=np.float64))
    result = aggregate_sets(per_set)
    return {**result[aggregation], "n": result["n"], "aggregation": aggregation, **result}

"""Readers for the SentEval STS files: STS12-16, STS Benchmark and SICK-R, as sentence pairs with gold scores.

Layout read (the SentEval ``data/downstream`` folder)::

    <dir>/STS/STS12-en-test/STS.input.<set>.txt   sentence1 TAB sentence2
    <dir>/STS/STS12-en-test/STS.gs.<set>.txt      gold score, or a blank line for an unscored pair
    ... same for STS13-en-test ... STS16-en-test
    <dir>/STS/STSBenchmark/sts-{train,dev,test}.csv   genre TAB file TAB year TAB id TAB score TAB s1 TAB s2 [TAB ...]
    <dir>/SICK/SICK_{train,trial,test_annotated}.txt  pair_ID TAB s1 TAB s2 TAB relatedness TAB ... (header row)

Every file is split on tabs by hand: its sentences hold unbalanced quotes that a csv parser would swallow (which
silently drops pairs from STS-B).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

LAYOUT_HELP = ("expected the SentEval layout: <dir>/STS/STS1{2..6}-en-test/STS.input.<set>.txt + STS.gs.<set>.txt, "
               "<dir>/STS/STSBenchmark/sts-{train,dev,test}.csv, <dir>/SICK/SICK_{train,trial,test_annotated}.txt")


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
    """Lines of a text file without their line ends; UTF-8 (BOM dropped), else latin-1 (older SentEval files).
    Not ``str.splitlines()``: it splits on U+2028 or \\x1c inside sentences, shifting input against gold lines."""
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return [line.removesuffix("\r") for line in text.removesuffix("\n").split("\n")] if text else []


def require_senteval_file(path: Path, layout_help: str = LAYOUT_HELP) -> Path:
    """`path` if it is a file, else a `FileNotFoundError` naming it and the expected SentEval layout."""
    if not path.is_file():
        raise FileNotFoundError(f"missing SentEval file {path}; {layout_help}")
    return path


def read_sts_year_set(input_path: str | Path, gold_path: str | Path, name: str = "") -> StsPairs:
    """One STS12-16 set: ``STS.input.<set>.txt`` with ``STS.gs.<set>.txt``; unscored (blank gold) pairs are dropped."""
    inputs, golds = read_lines(require_senteval_file(Path(input_path))), read_lines(require_senteval_file(Path(gold_path)))
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
    return _read_pairs(path, score=4, first=5)


def read_sick(path: str | Path) -> StsPairs:
    """One SICK file: ``pair_ID, sentence_A, sentence_B, relatedness_score, ...`` with a header row."""
    return _read_pairs(path, score=3, first=1, header="pair_id")


def _read_pairs(path: str | Path, score: int, first: int, header: str | None = None) -> StsPairs:
    """Tab-separated rows: the score in column `score`, the sentences in columns `first` and `first + 1` (0-based)."""
    path = require_senteval_file(Path(path))
    needed = max(score, first + 1) + 1
    s1, s2, scores = [], [], []
    for lineno, line in enumerate(read_lines(path), start=1):
        cols = line.split("\t")  # never csv: sentences carry stray quotes
        if not line.strip() or (lineno == 1 and header and cols[0].strip().lower() == header):
            continue
        if len(cols) < needed:
            raise ValueError(f"{path}:{lineno}: expected at least {needed} tab-separated columns, got {len(cols)}")
        scores.append(float(cols[score]))
        s1.append(cols[first])
        s2.append(cols[first + 1])
    return StsPairs(s1, s2, scores, name=path.stem, source=[str(path)])

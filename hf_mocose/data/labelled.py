"""A labelled training set from the SentEval files: (anchor, positive) pairs, or triplets with a hard negative.

`senteval_pairs(senteval_dir)` reads, in this order and each in file order (so the result is the same every time):

* SICK train: (sentence_A, sentence_B) judged ENTAILMENT; with `negatives=True` the hard negative is a sentence the
  same sentence_A is judged CONTRADICTION with (the first in file order; either side of the contradicting pair);
* MRPC train: the pairs labelled paraphrase (quality 1);
* STS-B train: the pairs scored 4 or more (of 5).

Rows that share a sentence with a set scored in docs/quality.md (STS-B dev, STS12, SICK trial) are dropped, and so
are repeated (anchor, positive) rows. With `negatives=True` only rows with a hard negative are kept: SICK anchors that
have both an entailment and a contradiction, a few hundred rows. The columns are sentence-transformers':
`anchor`, `positive` (and `negative`). From the shell: `python -m hf_mocose.data.labelled SENTEVAL_DIR OUT.jsonl`
(`--negatives` for the triplets).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from datasets import Dataset

from .sts_files import read_lines, read_sick, read_sts_benchmark, read_sts_year_set, require_senteval_file

STSB_POSITIVE_SCORE = 4.0  # STS-B pairs at or above this score (of 5) count as positives


def _rows(path: Path, header: bool = True) -> list[list[str]]:
    return [line.split("\t") for line in read_lines(require_senteval_file(path))[int(header):] if line.strip()]


def scored_sentences(senteval_dir: str | Path) -> set[str]:
    """Every sentence of the sets the benchmarks score: STS-B dev, STS12 (all five sets) and SICK trial."""
    root = Path(senteval_dir)
    sets = [read_sts_benchmark(root / "STS/STSBenchmark/sts-dev.csv"), read_sick(root / "SICK/SICK_trial.txt")]
    for gold in sorted((root / "STS/STS12-en-test").glob("STS.gs.*.txt")):
        sets.append(read_sts_year_set(gold.with_name(gold.name.replace("STS.gs.", "STS.input.")), gold))
    return {sentence for pairs in sets for sentence in (*pairs.sentences1, *pairs.sentences2)}


def senteval_pairs(senteval_dir: str | Path, negatives: bool = False) -> Dataset:
    """`anchor`, `positive` (and with `negatives`, `negative`) rows built as the module docstring says."""
    root = Path(senteval_dir)
    sick = _rows(root / "SICK/SICK_train.txt")
    contradiction: dict[str, str] = {}
    for row in sick:
        if row[4] == "CONTRADICTION":
            contradiction.setdefault(row[1], row[2])
            contradiction.setdefault(row[2], row[1])
    rows = [(row[1], row[2], contradiction.get(row[1])) for row in sick if row[4] == "ENTAILMENT"]
    if not negatives:
        rows += [(row[3], row[4], None) for row in _rows(root / "MRPC/msr_paraphrase_train.txt") if row[0] == "1"]
        stsb = read_sts_benchmark(root / "STS/STSBenchmark/sts-train.csv")
        rows += [(a, b, None) for a, b, score in zip(stsb.sentences1, stsb.sentences2, stsb.scores)
                 if score >= STSB_POSITIVE_SCORE]
    scored, seen, kept = scored_sentences(root), set(), []
    for anchor, positive, negative in rows:
        if (negatives and negative is None) or (anchor, positive) in seen or {anchor, positive, negative} & scored:
            continue
        seen.add((anchor, positive))
        kept.append((anchor, positive, negative))
    columns = {"anchor": [r[0] for r in kept], "positive": [r[1] for r in kept]}
    return Dataset.from_dict({**columns, **({"negative": [r[2] for r in kept]} if negatives else {})})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("senteval_dir", help="the SentEval data folder (e.g. ../shared/data/senteval)")
    parser.add_argument("output", help="the .jsonl, .csv or .parquet file to write")
    parser.add_argument("--negatives", action="store_true", help="triplets: only rows with a SICK contradiction")
    args = parser.parse_args(argv)
    dataset = senteval_pairs(args.senteval_dir, args.negatives)
    suffix = Path(args.output).suffix.lower()
    writers = {".jsonl": dataset.to_json, ".csv": dataset.to_csv, ".parquet": dataset.to_parquet}
    if suffix not in writers:
        raise SystemExit(f"output {args.output!r}: use a .jsonl, .csv or .parquet file.")
    writers[suffix](args.output)
    print(f"{len(dataset)} rows ({', '.join(dataset.column_names)}) -> {args.output}")


if __name__ == "__main__":
    main()

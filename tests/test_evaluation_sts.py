"""STS loaders, correlations, aggregations and the offline `evaluate` metric."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SENTEVAL_DIR, needs_senteval

from hf_mocose.evaluation import sts
from hf_mocose.evaluation.runner import markdown_table, resolve_tasks, run_tasks


def write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


class DictEncoder:
    """Fake encoder: a fixed vector per sentence, so expected correlations are known exactly."""

    def __init__(self, vectors: dict[str, list[float]]):
        self.vectors = vectors

    def encode(self, sentences, desc=""):
        return torch.tensor([self.vectors[s] for s in sentences], dtype=torch.float32)


def angle_pair(cosine: float) -> tuple[list[float], list[float]]:
    """Two 2-d vectors whose cosine similarity is `cosine`."""
    return [1.0, 0.0], [cosine, math.sqrt(1 - cosine**2)]


def make_sts12_fixture(root: Path, sets: dict[str, list[tuple[float, float | None]]]) -> DictEncoder:
    """STS12 folder whose sets hold (predicted cosine, gold or None = blank gold) pairs; returns the matching encoder."""
    vectors = {}
    base = root / "STS" / "STS12-en-test"
    for name in sts.STS_YEAR_SETS["sts12"][1]:
        inputs, golds = [], []
        for i, (cosine, gold) in enumerate(sets.get(name, [(0.1, 1.0), (0.5, 2.0), (0.9, 3.0)])):
            a, b = f"{name} a{i} \"quoted", f"{name} b{i} '"
            vectors[a], vectors[b] = angle_pair(cosine)
            inputs.append(f"{a}\t{b}")
            golds.append("" if gold is None else str(gold))
        write(base / f"STS.input.{name}.txt", inputs)
        write(base / f"STS.gs.{name}.txt", golds)
    return DictEncoder(vectors)


def test_read_sts_benchmark_keeps_quotes_and_extra_columns(tmp_path):
    path = write(
        tmp_path / "sts-dev.csv",
        [
            'main-news\tfile\t2012\t0001\t4.5\tHe said "yes\tHe said yes"\textra\tcolumns',
            "main-news\tfile\t2012\t0002\t1.0\ta ' b\tc",
        ],
    )
    pairs = sts.read_sts_benchmark(path)
    assert isinstance(pairs, sts.StsPairs) and len(pairs) == 2
    assert pairs.sentences1 == ['He said "yes', "a ' b"]
    assert pairs.sentences2 == ['He said yes"', "c"]
    assert pairs.scores == [4.5, 1.0]


def test_blank_gold_lines_are_skipped(tmp_path):
    write(tmp_path / "in.txt", ["a\tb", "c\td", "e\tf"])
    write(tmp_path / "gs.txt", ["1.0", "", "3.5"])
    pairs = sts.read_sts_year_set(tmp_path / "in.txt", tmp_path / "gs.txt")
    assert pairs.sentences1 == ["a", "e"] and pairs.sentences2 == ["b", "f"] and pairs.scores == [1.0, 3.5]


def test_misaligned_gold_file_is_an_error(tmp_path):
    write(tmp_path / "in.txt", ["a\tb", "c\td"])
    write(tmp_path / "gs.txt", ["1.0"])
    with pytest.raises(ValueError, match="must align"):
        sts.read_sts_year_set(tmp_path / "in.txt", tmp_path / "gs.txt")


def test_sick_reader_skips_header(tmp_path):
    path = write(tmp_path / "SICK_trial.txt", ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment",
                                               "4\tA b\tC d\t3.6\tNEUTRAL"])  # fmt: skip
    pairs = sts.read_sick(path)
    assert (pairs.sentences1, pairs.sentences2, pairs.scores) == (["A b"], ["C d"], [3.6])


def test_sts_correlation_perfect_and_shapes():
    torch.manual_seed(0)
    e1, e2 = torch.randn(20, 8), torch.randn(20, 8)
    gold = torch.nn.functional.cosine_similarity(e1, e2).numpy() * 2 + 3  # monotone in the cosine
    result = sts.sts_correlation(e1, e2, gold)
    assert result == {"spearman": pytest.approx(100.0), "pearson": pytest.approx(100.0), "n": 20}
    assert isinstance(result["spearman"], float) and isinstance(result["pearson"], float)
    # numpy input works the same; identical embeddings give constant cosines: no correlation (nan)
    assert sts.sts_correlation(e1.numpy(), e2.numpy(), gold)["spearman"] == pytest.approx(100.0)
    assert math.isnan(sts.sts_correlation(e1, e1, gold)["spearman"])
    with pytest.raises(ValueError):
        sts.sts_correlation(e1, e2[:5], gold)


def test_all_vs_wmean_known_answer(tmp_path):
    # MSRpar: 4 pairs, perfect order (+100); MSRvid: 2 pairs, reversed (-100), with a blank gold line.
    # all (concatenated): Spearman of pred 1..6 vs gold ranks [3,4,5,6,2,1] = 1 - 6*50/(6*35) = -3/7.
    # wmean: (4*100 + 2*(-100)) / 6 = 100/3.
    encoder = make_sts12_fixture(
        tmp_path,
        {
            "MSRpar": [(0.1, 1.0), (0.2, 2.0), (0.3, 3.0), (0.4, 4.0)],
            "MSRvid": [(0.5, 0.0), (0.55, None), (0.6, -1.0)],
        },
    )
    task = sts.load_sts_task(tmp_path, "sts12")
    assert len(task["MSRvid"]) == 2
    result = sts.evaluate_sts_task(encoder.encode, {k: task[k] for k in ("MSRpar", "MSRvid")}, "all")
    assert result["spearman"] == pytest.approx(-300 / 7)
    assert result["wmean"]["spearman"] == pytest.approx(100 / 3)
    assert result["n"] == 6 and result["sets"]["MSRvid"]["spearman"] == pytest.approx(-100)
    wmean = sts.evaluate_sts_task(encoder.encode, {k: task[k] for k in ("MSRpar", "MSRvid")}, "wmean")
    assert wmean["spearman"] == pytest.approx(100 / 3) and wmean["aggregation"] == "wmean"


def test_run_tasks_results_and_table(tmp_path):
    encoder = make_sts12_fixture(tmp_path, {})
    for split in ("dev", "test"):
        write(tmp_path / "STS/STSBenchmark" / f"sts-{split}.csv",
              ["g\tf\t2012\t1\t1.0\tx1\ty1", "g\tf\t2012\t2\t2.0\tx2\ty2", "g\tf\t2012\t3\t4.0\tx3\ty3"])  # fmt: skip
    for i, cosine in enumerate((0.1, 0.5, 0.9), start=1):
        encoder.vectors[f"x{i}"], encoder.vectors[f"y{i}"] = angle_pair(cosine)
    tasks, skipped = resolve_tasks(tmp_path, None)
    assert tasks == ["sts12", "stsb", "stsb_dev"]
    assert "sts13" in skipped and "cr" not in skipped  # transfer tasks are not in the default (sts) group
    assert "cr" in resolve_tasks(tmp_path, ["all"])[1]
    results = run_tasks(encoder, tmp_path, tasks, log=None)
    assert results["stsb"]["spearman"] == pytest.approx(100) and results["stsb"]["n"] == 3
    assert results["avg_over"] == ["sts12", "stsb"]
    assert results["avg"] == pytest.approx((results["sts12"]["spearman"] + 100) / 2)
    table = markdown_table(results, "fake")
    assert table.splitlines()[0] == "| Model | STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | Avg. |"
    assert "(2/7)" in table and "STS-B dev" in table


def test_resolve_tasks_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*STS.input"):
        resolve_tasks(tmp_path / "nope", None)
    with pytest.raises(ValueError, match="unknown task 'sts99'.*sts12.*sickr.*mrpc"):
        resolve_tasks(tmp_path, ["sts99"])
    with pytest.raises(FileNotFoundError, match=r"STS12-en-test/STS.input.MSRpar.txt.*expected the SentEval layout"):
        resolve_tasks(tmp_path, ["sts12"])
    with pytest.raises(FileNotFoundError, match="no task has its files"):
        resolve_tasks(tmp_path, None)


def test_metric_module_loads_offline():
    from hf_mocose.metrics import load_sts_correlation, sts_correlation_path

    assert Path(sts_correlation_path()).is_file()
    metric = load_sts_correlation()
    import evaluate

    assert isinstance(metric, evaluate.Metric)
    out = metric.compute(predictions=[0.1, 0.4, 0.35, 0.9], references=[1.0, 3.0, 2.0, 5.0])
    assert out["spearman"] == pytest.approx(100.0) and out["n"] == 4
    rng = np.random.default_rng(0)
    pred, gold = rng.normal(size=30), rng.normal(size=30)
    expected = sts.score_correlation(pred, gold)
    got = metric.compute(predictions=pred.tolist(), references=gold.tolist())
    assert got["spearman"] == pytest.approx(expected["spearman"]) and got["pearson"] == pytest.approx(expected["pearson"])


def test_metric_and_evaluate_share_one_correlation_rule():
    """One implementation behind `hf-mocose evaluate` and the `evaluate` metric: predictions constant up to float
    rounding (identical embeddings: cosines 1 +- 1e-16) have no correlation in both, and both give the same numbers."""
    from hf_mocose.metrics import load_sts_correlation, score_correlation

    assert sts.score_correlation is score_correlation
    metric = load_sts_correlation()
    gold = [1.0, 2.0, 3.0, 4.0]
    rounding_noise = [1.0, 1.0 + 2e-16, 1.0 - 2e-16, 1.0 + 4e-16]
    for scorer in (sts.score_correlation, lambda p, g: metric.compute(predictions=p, references=g)):
        result = scorer(rounding_noise, gold)
        assert math.isnan(result["spearman"]) and math.isnan(result["pearson"]) and result["n"] == 4
        assert math.isnan(scorer([0.1, 0.2, 0.3, 0.4], [2.0, 2.0, 2.0, 2.0])["spearman"])
        with pytest.raises(ValueError, match="at least 2 pairs"):
            scorer([0.5], [1.0])


@needs_senteval
def test_real_pair_counts():
    counts = {name: len(pairs) for name, pairs in sts.load_sts_task(SENTEVAL_DIR, "sts12").items()}
    assert sum(counts.values()) == 3108
    assert counts == {"MSRpar": 750, "MSRvid": 750, "SMTeuroparl": 459, "surprise.OnWN": 750, "surprise.SMTnews": 399}
    assert len(sts.read_sts_benchmark(SENTEVAL_DIR / "STS/STSBenchmark/sts-dev.csv")) == 1500
    assert len(sts.read_sts_benchmark(SENTEVAL_DIR / "STS/STSBenchmark/sts-train.csv")) == 5749
    assert len(sts.load_sts_task(SENTEVAL_DIR, "sickr_trial")["sickr_trial"]) == 500

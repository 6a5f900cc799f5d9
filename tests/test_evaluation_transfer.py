"""SentEval transfer tasks and the representation diagnostics (evaluation/sts.py) on synthetic data with known answers."""

from __future__ import annotations

import math
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SENTEVAL_DIR, needs_senteval

from hf_mocose.evaluation import sts, transfer


def write(path: Path, lines: list[str], encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("".join(line + "\n" for line in lines).encode(encoding))
    return path


def keyword_encoder(sentences, desc=""):
    """2-d embedding: +1 / -1 on axis 0 for 'good' / 'bad' sentences, a hashed nuisance value on axis 1."""
    rows = []
    for s in sentences:
        sign = 1.0 if "good" in s else -1.0
        rows.append([sign, (zlib.crc32(s.encode()) % 97) / 97.0])  # deterministic across runs
    return torch.tensor(rows)


def test_kfold_task_separable_is_100_and_reproducible(tmp_path):
    write(tmp_path / "CR/custrev.pos", [f"good thing {i}" for i in range(40)])
    # latin-1 bytes must not break reading
    write(tmp_path / "CR/custrev.neg", [f"bad caf\u00e9 {i}" for i in range(30)], encoding="latin-1")
    result = transfer.evaluate_transfer_task(keyword_encoder, tmp_path, "cr", seed=3, kfold=5, inner_folds=3)
    assert result["accuracy"] == pytest.approx(100.0) and result["n"] == 70
    again = transfer.evaluate_transfer_task(keyword_encoder, tmp_path, "cr", seed=3, kfold=5, inner_folds=3)
    assert again == result


def test_kfold_accuracy_random_labels_near_chance():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(200, 4)), rng.integers(0, 2, size=200)
    acc = transfer.kfold_accuracy(X, y, seed=0, kfold=5, inner_folds=3)["accuracy"]
    assert 30 < acc < 70


def test_sst_trec_mrpc_fixtures(tmp_path):
    for split, n in (("train", 30), ("dev", 10), ("test", 12)):
        write(tmp_path / f"SST/binary/sentiment-{split}",
              [f"{'good' if i % 2 else 'bad'} film {split} {i} \t{i % 2}" for i in range(n)])  # fmt: skip
    sst = transfer.evaluate_transfer_task(keyword_encoder, tmp_path, "sst2", seed=0)
    assert sst["accuracy"] == pytest.approx(100.0) and sst["n"] == 12 and sst["dev_accuracy"] == pytest.approx(100)

    # TREC: coarse label before ':'; question 'good' iff class NUM
    classes = ["NUM:dist", "LOC:city"]
    write(tmp_path / "TREC/train_5500.label",
          [f"{classes[i % 2]} {'good' if i % 2 == 0 else 'bad'} question {i} ?" for i in range(30)], "latin-1")  # fmt: skip
    write(tmp_path / "TREC/TREC_10.label", [f"{classes[i % 2]} {'good' if i % 2 == 0 else 'bad'} q {i} ?" for i in range(8)])
    sentences, labels = transfer.load_trec(tmp_path / "TREC/TREC_10.label")
    assert sentences[0] == "good q 0 ?" and labels[0] == transfer.TREC_CLASSES.index("NUM")
    trec = transfer.evaluate_transfer_task(keyword_encoder, tmp_path, "trec", seed=0, inner_folds=3)
    assert trec["accuracy"] == pytest.approx(100.0) and trec["n"] == 8

    # MRPC: paraphrases share the keyword (|u - v| small on axis 0), non-paraphrases do not
    header = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    def rows(n):
        return [header] + [f"{i % 2}\t{i}\t{i + 1}\tgood a {i}\t{'good' if i % 2 else 'bad'} b {i}" for i in range(n)]
    write(tmp_path / "MRPC/msr_paraphrase_train.txt", rows(40))
    write(tmp_path / "MRPC/msr_paraphrase_test.txt", rows(10))
    a, b, y = transfer.load_mrpc(tmp_path / "MRPC/msr_paraphrase_test.txt")
    assert len(a) == 10 and a[0] == "good a 0" and y.tolist() == [i % 2 for i in range(10)]
    mrpc = transfer.evaluate_transfer_task(keyword_encoder, tmp_path, "mrpc", seed=0, inner_folds=3)
    assert mrpc["accuracy"] == pytest.approx(100.0) and mrpc["f1"] == pytest.approx(100.0)


def test_missing_transfer_file_names_path_and_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"MPQA/mpqa.pos.*mpqa.\{pos,neg\}"):
        transfer.evaluate_transfer_task(keyword_encoder, tmp_path, "mpqa")
    with pytest.raises(ValueError, match="unknown transfer task 'sst5'.*mrpc"):
        transfer.transfer_task_files(tmp_path, "sst5")


@needs_senteval
def test_real_transfer_loaders():
    trec_train = transfer.load_trec(SENTEVAL_DIR / "TREC/train_5500.label")  # latin-1 file
    assert len(trec_train[0]) == 5452 and set(trec_train[1].tolist()) == set(range(6))
    a, _, y = transfer.load_mrpc(SENTEVAL_DIR / "MRPC/msr_paraphrase_test.txt")
    assert len(a) == 1725 and set(y.tolist()) == {0, 1}
    sentences, labels = transfer.load_sst_split(SENTEVAL_DIR / "SST/binary/sentiment-dev")
    assert len(sentences) == 872 and set(labels.tolist()) == {0, 1}


# ----------------------------------------------------------------- diagnostics
def test_alignment_uniformity_spectrum_known_values():
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    assert sts.alignment(x, x) == pytest.approx(0.0)
    assert sts.alignment(x, -x) == pytest.approx(4.0)  # antipodal: ||x - y||^2 = 4
    assert sts.uniformity(torch.tensor([[1.0, 0.0], [-3.0, 0.0]])) == pytest.approx(-8.0)
    # 3 points: squared distances 2, 2, 4 -> log((2 e^-4 + e^-8) / 3)
    pts = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    assert sts.uniformity(pts) == pytest.approx(math.log((2 * math.exp(-4) + math.exp(-8)) / 3))
    assert sts.singular_spectrum(torch.eye(4) * 3).tolist() == pytest.approx([1.0] * 4)
    rank_one = sts.singular_spectrum(torch.ones(5, 3))
    assert rank_one[0] == pytest.approx(1.0) and rank_one[1:] == pytest.approx([0, 0], abs=1e-6)


def test_diagnose_and_plot(tmp_path):
    from hf_mocose.data.sts_files import StsPairs

    pairs = StsPairs(["good a", "bad b", "good c"], ["good d", "good e", "bad f"], [4.5, 1.0, 4.0])
    result = sts.diagnose(keyword_encoder, pairs)
    assert result["n_positive_pairs"] == 2 and result["n_sentences"] == 6
    assert len(result["singular_values"]) == 2 and result["singular_values"][0] == pytest.approx(1.0)
    png = sts.plot_spectra({"a": result["singular_values"], "b": [1.0, 0.1]}, tmp_path / "out" / "s.png")
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

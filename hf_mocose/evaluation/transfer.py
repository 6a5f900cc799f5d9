"""SentEval transfer tasks on frozen sentence embeddings, with scikit-learn logistic regression.

Protocol (SentEval, ``usepytorch=False``): the L2 strength C is chosen from SentEval's grid ``{2^-2, ..., 2^3}``,
accuracy x100 is reported, and everything is seeded (fold shuffles, solver), so a run repeats exactly.

* MR, CR, SUBJ, MPQA: 10-fold stratified cross-validation; C picked in each outer fold by an inner stratified
  k-fold (5 folds by default, SentEval's prototyping setting; ``inner_folds=10`` for the full setting).
* SST-2: the fixed train/dev/test split; C picked on dev, accuracy on test.
* TREC: train_5500 / TREC_10 with the 6 coarse labels; C picked by inner CV on train.
* MRPC: train/test; pair features ``[|u - v|, u * v]``, exactly as SentEval's ``mrpc.py`` (not the SICK-E/SNLI
  set ``[u, v, |u - v|, u * v]``); C by inner CV on train; accuracy and F1 reported.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from hf_mocose.data.sts_files import read_lines, require_senteval_file

TRANSFER_TASKS = ("mr", "cr", "subj", "mpqa", "sst2", "trec", "mrpc")  # SentEval paper column order
TRANSFER_FILES: dict[str, tuple[str, ...]] = {
    "mr": ("MR/rt-polarity.pos", "MR/rt-polarity.neg"), "cr": ("CR/custrev.pos", "CR/custrev.neg"),
    "subj": ("SUBJ/subj.subjective", "SUBJ/subj.objective"), "mpqa": ("MPQA/mpqa.pos", "MPQA/mpqa.neg"),
    "sst2": ("SST/binary/sentiment-train", "SST/binary/sentiment-dev", "SST/binary/sentiment-test"),
    "trec": ("TREC/train_5500.label", "TREC/TREC_10.label"),
    "mrpc": ("MRPC/msr_paraphrase_train.txt", "MRPC/msr_paraphrase_test.txt"),
}
TREC_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
SENTEVAL_CS = tuple(2.0**t for t in range(-2, 4))
DEFAULT_SEED = 1111  # SentEval's default seed

TRANSFER_LAYOUT_HELP = ("transfer tasks expect <dir>/CR/custrev.{pos,neg}, <dir>/MPQA/mpqa.{pos,neg}, "
                        "<dir>/MR/rt-polarity.{pos,neg}, <dir>/SUBJ/subj.{objective,subjective}, "
                        "<dir>/SST/binary/sentiment-{train,dev,test}, <dir>/TREC/{train_5500,TREC_10}.label, "
                        "<dir>/MRPC/msr_paraphrase_{train,test}.txt")


def transfer_task_files(senteval_dir: str | Path, task: str) -> list[Path]:
    if task not in TRANSFER_FILES:
        raise ValueError(f"unknown transfer task {task!r}; valid: {', '.join(TRANSFER_TASKS)}")
    return [Path(senteval_dir) / rel for rel in TRANSFER_FILES[task]]


def _lines(path: Path) -> list[str]:
    return [line.strip() for line in read_lines(require_senteval_file(path, TRANSFER_LAYOUT_HELP)) if line.strip()]


def load_binary(pos_path: Path, neg_path: Path) -> tuple[list[str], np.ndarray]:
    """One sentence per line in each file; label 1 for `pos_path`, 0 for `neg_path`."""
    pos, neg = _lines(pos_path), _lines(neg_path)
    return pos + neg, np.array([1] * len(pos) + [0] * len(neg))


def load_sst_split(path: Path) -> tuple[list[str], np.ndarray]:
    """``sentence TAB label`` lines (SentEval's SST/binary files)."""
    rows = [line.rpartition("\t" if "\t" in line else " ") for line in _lines(path)]  # some copies use a space
    return [sentence.strip() for sentence, _, _ in rows], np.array([int(label) for _, _, label in rows])


def load_trec(path: Path) -> tuple[list[str], np.ndarray]:
    """``COARSE:fine question`` lines -> questions and coarse labels (as SentEval's 6-class TREC)."""
    rows = [line.partition(":") for line in _lines(path)]
    if unknown := {target for target, _, _ in rows} - set(TREC_CLASSES):
        raise ValueError(f"{path}: unknown TREC coarse labels {sorted(unknown)}; expected {', '.join(TREC_CLASSES)}")
    # A fixed class list, so train and test agree on label ids.
    return ([rest.split(" ", 1)[1] if " " in rest else rest for _, _, rest in rows],
            np.array([TREC_CLASSES.index(target) for target, _, _ in rows]))


def load_mrpc(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """``Quality TAB #1 ID TAB #2 ID TAB #1 String TAB #2 String`` with a header row."""
    s1, s2, labels = [], [], []
    for line in _lines(path)[1:]:
        cols = line.split("\t")
        if len(cols) < 5:
            raise ValueError(f"{path}: expected 5 tab-separated columns, got {len(cols)} in {line[:80]!r}")
        labels.append(int(cols[0]))
        s1.append(cols[3])
        s2.append(cols[4])
    return s1, s2, np.array(labels)


def _fit_cv(X: np.ndarray, y: np.ndarray, seed: int, inner_folds: int):
    """Logistic regression on `(n, d)` features with C chosen by stratified inner k-fold, refit on all of X."""
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.model_selection import StratifiedKFold
    cv = StratifiedKFold(n_splits=inner_folds, shuffle=True, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence / future warnings from sklearn
        return LogisticRegressionCV(Cs=list(SENTEVAL_CS), cv=cv, scoring="accuracy", max_iter=1000,
                                    random_state=seed).fit(X, y)


def kfold_accuracy(X, y, seed: int = DEFAULT_SEED, kfold: int = 10, inner_folds: int = 5) -> dict:
    """Mean test accuracy x100 over an outer stratified `kfold` split of `(n, d)` features `X`."""
    from sklearn.model_selection import StratifiedKFold
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y)
    accuracies = [float((_fit_cv(X[train], y[train], seed, inner_folds).predict(X[test]) == y[test]).mean())
                  for train, test in StratifiedKFold(n_splits=kfold, shuffle=True, random_state=seed).split(X, y)]
    return {"accuracy": 100 * float(np.mean(accuracies)), "n": int(len(y)), "protocol": f"{kfold}-fold CV"}


def train_test_accuracy(X_train, y_train, X_test, y_test, seed: int = DEFAULT_SEED, inner_folds: int = 5) -> dict:
    """C by inner CV on the training set, accuracy x100 on the test set (TREC, MRPC)."""
    X_train, X_test = np.asarray(X_train, dtype=np.float64), np.asarray(X_test, dtype=np.float64)
    clf = _fit_cv(X_train, np.asarray(y_train), seed, inner_folds)
    predicted = clf.predict(X_test)
    return {"accuracy": 100 * float((predicted == np.asarray(y_test)).mean()), "n": int(len(y_test)),
            "C": float(clf.C_[0]), "predicted": predicted,
            "protocol": f"train/test, C by {inner_folds}-fold CV on train"}


def dev_test_accuracy(X_train, y_train, X_dev, y_dev, X_test, y_test, seed: int = DEFAULT_SEED) -> dict:
    """C picked on dev accuracy, accuracy x100 on test (SST-2)."""
    from sklearn.linear_model import LogisticRegression
    X_train, X_dev, X_test = (np.asarray(a, dtype=np.float64) for a in (X_train, X_dev, X_test))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fits = [LogisticRegression(C=C, max_iter=1000, random_state=seed).fit(X_train, y_train) for C in SENTEVAL_CS]
    dev = [float((clf.predict(X_dev) == np.asarray(y_dev)).mean()) for clf in fits]
    best = dev.index(max(dev))  # the first best: ties keep the smaller C (stronger L2)
    return {"accuracy": 100 * float((fits[best].predict(X_test) == np.asarray(y_test)).mean()),
            "dev_accuracy": 100 * dev[best], "n": int(len(y_test)), "C": float(SENTEVAL_CS[best]),
            "protocol": "train/dev/test, C on dev"}


def _embed(encode: Callable[[list[str]], torch.Tensor], *groups: list[str]) -> list[np.ndarray]:
    """Encodes all groups in one length-sorted pass over their distinct sentences; one `(n_i, d)` array per group."""
    unique = {sentence: row for row, sentence in enumerate(dict.fromkeys(s for group in groups for s in group))}
    emb = encode(list(unique))
    emb = (emb.detach().cpu().numpy() if isinstance(emb, torch.Tensor) else np.asarray(emb)).astype(np.float64)
    return [emb[[unique[s] for s in group]] for group in groups]


def evaluate_transfer_task(encode: Callable[[list[str]], torch.Tensor], senteval_dir: str | Path, task: str,
                           seed: int = DEFAULT_SEED, kfold: int = 10, inner_folds: int = 5) -> dict:
    """Runs one transfer task; returns ``{"accuracy": x100, "n": test examples, "protocol": ..., ...}``."""
    paths = [require_senteval_file(path, TRANSFER_LAYOUT_HELP) for path in transfer_task_files(senteval_dir, task)]
    if task in ("mr", "cr", "subj", "mpqa"):
        sentences, y = load_binary(*paths)
        (X,) = _embed(encode, sentences)
        return kfold_accuracy(X, y, seed, kfold, inner_folds)
    if task == "sst2":
        (s_tr, y_tr), (s_dev, y_dev), (s_te, y_te) = (load_sst_split(p) for p in paths)
        X_tr, X_dev, X_te = _embed(encode, s_tr, s_dev, s_te)
        return dev_test_accuracy(X_tr, y_tr, X_dev, y_dev, X_te, y_te, seed)
    if task == "trec":
        (s_tr, y_tr), (s_te, y_te) = (load_trec(p) for p in paths)
        X_tr, X_te = _embed(encode, s_tr, s_te)
        result = train_test_accuracy(X_tr, y_tr, X_te, y_te, seed, inner_folds)
        return {key: value for key, value in result.items() if key != "predicted"}
    # mrpc
    (a_tr, b_tr, y_tr), (a_te, b_te, y_te) = (load_mrpc(p) for p in paths)
    A_tr, B_tr, A_te, B_te = _embed(encode, a_tr, b_tr, a_te, b_te)
    F_tr, F_te = (np.c_[np.abs(a - b), a * b] for a, b in ((A_tr, B_tr), (A_te, B_te)))
    result = train_test_accuracy(F_tr, y_tr, F_te, y_te, seed, inner_folds)
    from sklearn.metrics import f1_score
    result["f1"] = 100 * float(f1_score(y_te, result.pop("predicted")))
    return result

"""Spearman and Pearson correlation (x100) of predicted vs gold similarities: the one implementation.

Both `hf-mocose evaluate` (`hf_mocose.evaluation.sts`) and the `evaluate` metric script
(`sts_correlation.py`, which `evaluate.load` imports by file path and so reaches this module by its
absolute name) score with `score_correlation`, so a number never depends on which of the two computed it.
"""

from __future__ import annotations

import numpy as np

# Predictions whose spread is within float rounding (e.g. identical embeddings: every cosine is 1 up to
# ~1e-16) count as constant: ranking their rounding noise would give a meaningless correlation.
CONSTANT_SPREAD = 1e-9


def score_correlation(predicted, gold) -> dict:
    """Spearman and Pearson (both x100) of `predicted` `(n,)` vs `gold` `(n,)`, plus the pair count `n`.

    A constant input has no correlation: `nan` for both when the predictions spread by at most
    `CONSTANT_SPREAD` or the gold scores are all equal. Fewer than 2 pairs, or different lengths, is a
    `ValueError`.
    """
    from scipy.stats import pearsonr, spearmanr

    predicted, gold = np.asarray(predicted, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if predicted.shape != gold.shape:
        raise ValueError(f"{predicted.shape[0]} predictions for {gold.shape[0]} gold scores")
    if len(gold) < 2:
        raise ValueError("a correlation needs at least 2 pairs")
    if np.ptp(predicted) <= CONSTANT_SPREAD or np.ptp(gold) == 0:
        return {"spearman": float("nan"), "pearson": float("nan"), "n": int(len(gold))}
    return {
        "spearman": float(spearmanr(predicted, gold)[0] * 100),
        "pearson": float(pearsonr(predicted, gold)[0] * 100),
        "n": int(len(gold)),
    }

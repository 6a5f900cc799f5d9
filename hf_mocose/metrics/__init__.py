"""`evaluate` metric scripts shipped with hf-mocose (installed as package data: metrics/*.py), and their scoring.

`score_correlation` is the one implementation of the STS correlation: `hf-mocose evaluate` and the metric script
(`sts_correlation.py`, which `evaluate.load` imports by file path, so by absolute import) both score with it.

May import: nothing else from `hf_mocose` (the base layer: `evaluation` imports it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

METRICS_DIR = Path(__file__).resolve().parent


def sts_correlation_path() -> str:
    """File path of the STS Spearman/Pearson metric, for `evaluate.load(path)` (works offline)."""
    return str(METRICS_DIR / "sts_correlation.py")


def load_sts_correlation(**kwargs):
    """`evaluate.load` of the STS correlation metric, offline."""
    import evaluate
    return evaluate.load(sts_correlation_path(), **kwargs)


# Predictions spread within float rounding (identical embeddings: cosines 1 up to ~1e-16) count as constant:
# a correlation with their rounding noise would mean nothing.
CONSTANT_SPREAD = 1e-9


def score_correlation(predicted, gold) -> dict:
    """Spearman and Pearson (both x100) of `predicted` `(n,)` vs `gold` `(n,)`, plus the pair count `n`.

    `nan` for both when the predictions spread by at most `CONSTANT_SPREAD` or the gold scores are all equal;
    a `ValueError` for fewer than 2 pairs or different lengths."""
    from scipy.stats import pearsonr, spearmanr
    predicted, gold = np.asarray(predicted, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if predicted.shape != gold.shape:
        raise ValueError(f"{predicted.shape[0]} predictions for {gold.shape[0]} gold scores")
    if len(gold) < 2:
        raise ValueError("a correlation needs at least 2 pairs")
    if np.ptp(predicted) <= CONSTANT_SPREAD or np.ptp(gold) == 0:
        return {"spearman": float("nan"), "pearson": float("nan"), "n": int(len(gold))}
    return {"spearman": float(spearmanr(predicted, gold)[0] * 100),
            "pearson": float(pearsonr(predicted, gold)[0] * 100), "n": int(len(gold))}


__all__ = ["CONSTANT_SPREAD", "METRICS_DIR", "load_sts_correlation", "score_correlation", "sts_correlation_path"]

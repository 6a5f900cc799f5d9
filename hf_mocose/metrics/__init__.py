"""`evaluate` metric scripts shipped with hf-mocose (installed as package data: metrics/*.py), and their scoring.

`evaluate.load` takes a metric script by file path and imports it on its own, outside the package, so a
script reaches the scoring by absolute import (`hf_mocose.metrics.correlation`, which `hf-mocose evaluate`
scores with too); this package also says where the scripts are.

May import: nothing else from `hf_mocose` (the base layer: `evaluation` imports it).
"""

from __future__ import annotations

from pathlib import Path

METRICS_DIR = Path(__file__).resolve().parent


def sts_correlation_path() -> str:
    """File path of the STS Spearman/Pearson metric, for `evaluate.load(path)` (works offline)."""
    return str(METRICS_DIR / "sts_correlation.py")


def load_sts_correlation(**kwargs):
    """`evaluate.load` of the STS correlation metric, offline."""
    import evaluate

    return evaluate.load(sts_correlation_path(), **kwargs)


__all__ = ["METRICS_DIR", "load_sts_correlation", "sts_correlation_path"]

"""Representation diagnostics: alignment, uniformity (Wang & Isola, 2020) and the singular-value spectrum.

All three are computed on STS-B sentences, as in the SimCSE and MoCoSE papers:

* alignment = E ||f(x) - f(y)||^2 over STS-B pairs with gold score >= 4 (lower: positives closer);
* uniformity = log E exp(-2 ||f(x) - f(y)||^2) over all pairs of distinct STS-B sentences
  (lower: embeddings spread more evenly over the sphere);
* spectrum = singular values of the `(n, dim)` matrix of L2-normalised STS-B sentence embeddings,
  divided by the largest one; a fast decay means a few directions dominate (anisotropy / collapse).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from hf_mocose.data.sts_files import StsPairs, read_sts_benchmark

STSB_SPLITS = ("test", "dev", "train")


def alignment(x: torch.Tensor, y: torch.Tensor, alpha: float = 2.0) -> float:
    """Mean ``||x_i - y_i||^alpha`` of L2-normalised positive pairs `x`, `y`: `(n, dim)` each."""
    x, y = F.normalize(x.double(), dim=-1), F.normalize(y.double(), dim=-1)
    return float((x - y).norm(dim=1).pow(alpha).mean())


def uniformity(x: torch.Tensor, t: float = 2.0) -> float:
    """``log mean_{i<j} exp(-t ||x_i - x_j||^2)`` of L2-normalised `x`: `(n, dim)`, n >= 2."""
    x = F.normalize(x.double(), dim=-1)
    if len(x) < 2:
        raise ValueError("uniformity needs at least 2 embeddings")
    sq = torch.pdist(x, p=2).pow(2)  # (n*(n-1)/2,) distinct pairs
    # logsumexp - log(count): the mean of exp() underflows for well-spread embeddings.
    return float(torch.logsumexp(-t * sq, dim=0) - math.log(sq.numel()))


def singular_spectrum(x: torch.Tensor) -> np.ndarray:
    """Singular values of L2-normalised `x`: `(n, dim)` -> `(min(n, dim),)`, descending, max = 1."""
    s = torch.linalg.svdvals(F.normalize(x.double(), dim=-1))
    return (s / s[0]).numpy()


def load_stsb_for_diagnostics(senteval_dir: str | Path, split: str | None = None) -> tuple[StsPairs, str]:
    """STS-B pairs of `split` (default: the first of test, dev, train that exists) and the split used."""
    base = Path(senteval_dir) / "STS" / "STSBenchmark"
    splits = [split] if split else list(STSB_SPLITS)
    for name in splits:
        if name not in STSB_SPLITS:
            raise ValueError(f"unknown STS-B split {name!r}; choose one of {', '.join(STSB_SPLITS)}")
        if (base / f"sts-{name}.csv").is_file() or split:
            return read_sts_benchmark(base / f"sts-{name}.csv"), name
    raise FileNotFoundError(
        f"no STS-B file under {base} (looked for sts-test.csv, sts-dev.csv, sts-train.csv); "
        "diagnostics need <dir>/STS/STSBenchmark/sts-{train,dev,test}.csv"
    )


def diagnose(encode: Callable[[list[str]], torch.Tensor], pairs: StsPairs, positive_threshold: float = 4.0) -> dict:
    """Alignment, uniformity and spectrum of `encode` on `pairs`.

    Returns ``{"alignment", "uniformity", "n_positive_pairs", "n_sentences", "singular_values"}``.
    """
    unique: dict[str, int] = {}
    for sentence in (*pairs.sentences1, *pairs.sentences2):
        unique.setdefault(sentence, len(unique))
    emb = encode(list(unique))
    emb = (emb if isinstance(emb, torch.Tensor) else torch.as_tensor(np.asarray(emb))).detach().cpu().float()
    positives = [i for i, score in enumerate(pairs.scores) if score >= positive_threshold]
    if not positives:
        raise ValueError(f"no STS-B pair has a gold score >= {positive_threshold}; cannot compute alignment")
    x = emb[[unique[pairs.sentences1[i]] for i in positives]]
    y = emb[[unique[pairs.sentences2[i]] for i in positives]]
    return {
        "alignment": alignment(x, y),
        "uniformity": uniformity(emb),
        "n_positive_pairs": len(positives),
        "n_sentences": len(unique),
        "singular_values": singular_spectrum(emb).tolist(),
    }


def plot_spectra(spectra: dict[str, list[float]], path: str | Path, title: str = "") -> str:
    """Draws one normalised singular-value curve per model (log y axis) into a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for label, values in spectra.items():
        ax.plot(np.arange(1, len(values) + 1), values, label=label, linewidth=1.5)
    ax.set_yscale("log")
    ax.set_xlabel("singular value index")
    ax.set_ylabel("normalised singular value")
    ax.set_title(title or "Singular-value spectrum of STS-B sentence embeddings")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return str(path)

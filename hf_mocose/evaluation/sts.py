"""Semantic textual similarity (STS) tasks and scoring, following SentEval/SimCSE.

Names the tasks (STS12-16, STS-B, SICK-R; the file readers are `hf_mocose.data.sts_files`), loads them and scores
an encoder on them; and computes the representation diagnostics on STS-B sentences, as the SimCSE and MoCoSE papers
(`diagnose`):

* alignment (Wang & Isola, 2020) = E ||f(x) - f(y)||^2 over STS-B pairs with gold score >= 4 (lower: positives
  closer);
* uniformity = log E exp(-2 ||f(x) - f(y)||^2) over all pairs of distinct STS-B sentences (lower: more even);
* spectrum = singular values of the `(n, dim)` matrix of L2-normalised STS-B sentence embeddings, divided by the
  largest one; a fast decay means a few directions dominate (anisotropy / collapse).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from hf_mocose.data.sts_files import StsPairs, read_sick, read_sts_benchmark, read_sts_year_set, require_senteval_file
from hf_mocose.metrics import score_correlation  # the one implementation, also the `evaluate` metric's

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
    "stsb": ("STS/STSBenchmark/sts-test.csv", "stsb"), "sickr": ("SICK/SICK_test_annotated.txt", "sick"),
    "stsb_dev": ("STS/STSBenchmark/sts-dev.csv", "stsb"),
    # Extras, only run when asked for: useful where the test files are missing.
    "stsb_train": ("STS/STSBenchmark/sts-train.csv", "stsb"), "sickr_trial": ("SICK/SICK_trial.txt", "sick"),
    "sickr_train": ("SICK/SICK_train.txt", "sick"),
}
STS_TEST_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
STS_TASKS = STS_TEST_TASKS + ("stsb_dev", "stsb_train", "sickr_trial", "sickr_train")
AGGREGATIONS = ("all", "wmean")
STSB_SPLITS = ("test", "dev", "train")


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
    files = [require_senteval_file(path) for path in sts_task_files(senteval_dir, task)]
    if task in STS_YEAR_SETS:  # each set's input file, then its gold file
        sets = STS_YEAR_SETS[task][1]
        return {s: read_sts_year_set(files[2 * i], files[2 * i + 1], name=s) for i, s in enumerate(sets)}
    pairs = (read_sts_benchmark if STS_FILE_TASKS[task][1] == "stsb" else read_sick)(files[0])
    pairs.name = task
    return {task: pairs}


def _as_tensor(x) -> torch.Tensor:
    return (x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))).detach().to("cpu", torch.float32)


def _encode_once(encode: Callable[[list[str]], torch.Tensor],
                 pairs: list[StsPairs]) -> tuple[dict[str, int], torch.Tensor]:
    """Every distinct sentence of `pairs` encoded once, in one pass: ``({sentence: row}, (n, dim) embeddings)``."""
    sentences = dict.fromkeys(s for each in pairs for s in (*each.sentences1, *each.sentences2))
    return {sentence: row for row, sentence in enumerate(sentences)}, _as_tensor(encode(list(sentences)))


def cosine_scores(embeddings1, embeddings2) -> np.ndarray:
    """Row-wise cosine similarity: `(n, dim)` x `(n, dim)` -> `(n,)` float64 numpy."""
    a, b = _as_tensor(embeddings1), _as_tensor(embeddings2)
    if a.shape != b.shape or a.dim() != 2:
        raise ValueError(f"embeddings must both be (n, dim); got {tuple(a.shape)} and {tuple(b.shape)}")
    # float64: float32 rounding noise would otherwise rank-order identical pairs at random.
    return F.cosine_similarity(a.double(), b.double(), dim=1, eps=1e-12).numpy()


def sts_correlation(embeddings1, embeddings2, gold) -> dict:
    """Cosine similarity of paired `(n, dim)` embeddings vs gold `(n,)`: ``{"spearman", "pearson", "n"}``, x100."""
    return score_correlation(cosine_scores(embeddings1, embeddings2), gold)


def aggregate_sets(per_set: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict:
    """Both STS12-16 aggregations from ``{set: (cosine scores, gold)}``: ``all``, one correlation over the
    concatenated sets (SimCSE/MoCoSE, our default); ``wmean``, set correlations weighted by set size (SentEval's)."""
    concat = score_correlation(*map(np.concatenate, zip(*per_set.values())))  # (all predictions, all gold)
    sets = {name: score_correlation(p, g) for name, (p, g) in per_set.items()}
    weights = np.array([s["n"] for s in sets.values()], dtype=np.float64)
    wmean = {key: float(np.average([s[key] for s in sets.values()], weights=weights))
             for key in ("spearman", "pearson")}
    return {"all": {"spearman": concat["spearman"], "pearson": concat["pearson"]}, "wmean": wmean, "n": concat["n"],
            "sets": sets}


def evaluate_sts_task(encode: Callable[[list[str]], torch.Tensor], sets: dict[str, StsPairs],
                      aggregation: str = "all") -> dict:
    """Scores one STS task with `encode` (sentences -> `(n, dim)` embeddings), each distinct sentence encoded once:
    ``{"spearman", "pearson", "n", "aggregation", "all", "wmean", "sets"}`` (x100; headline per `aggregation`)."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; choose one of {', '.join(AGGREGATIONS)}")
    unique, embeddings = _encode_once(encode, list(sets.values()))
    per_set = {}
    for name, pairs in sets.items():
        e1 = embeddings[[unique[s] for s in pairs.sentences1]]
        e2 = embeddings[[unique[s] for s in pairs.sentences2]]
        per_set[name] = (cosine_scores(e1, e2), np.asarray(pairs.scores, dtype=np.float64))
    result = aggregate_sets(per_set)
    return {**result[aggregation], "n": result["n"], "aggregation": aggregation, **result}


# ----------------------------------------------------------------- diagnostics
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
    raise FileNotFoundError(f"no STS-B file under {base} (looked for sts-test.csv, sts-dev.csv, sts-train.csv); "
                            "diagnostics need <dir>/STS/STSBenchmark/sts-{train,dev,test}.csv")


def diagnose(encode: Callable[[list[str]], torch.Tensor], pairs: StsPairs, positive_threshold: float = 4.0) -> dict:
    """Alignment, uniformity and singular-value spectrum of `encode` on `pairs`, with the pair and sentence counts."""
    unique, emb = _encode_once(encode, [pairs])
    if not (positives := [i for i, score in enumerate(pairs.scores) if score >= positive_threshold]):
        raise ValueError(f"no STS-B pair has a gold score >= {positive_threshold}; cannot compute alignment")
    x = emb[[unique[pairs.sentences1[i]] for i in positives]]
    y = emb[[unique[pairs.sentences2[i]] for i in positives]]
    return {"alignment": alignment(x, y), "uniformity": uniformity(emb), "n_positive_pairs": len(positives),
            "n_sentences": len(unique), "singular_values": singular_spectrum(emb).tolist()}


def plot_spectra(spectra: dict[str, list[float]], path: str | Path, title: str = "") -> str:
    """Draws one normalised singular-value curve per model (log y axis) into a PNG at `path`."""
    import matplotlib
    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for label, values in spectra.items():
        ax.plot(np.arange(1, len(values) + 1), values, label=label, linewidth=1.5)
    ax.set(yscale="log", xlabel="singular value index", ylabel="normalised singular value",
           title=title or "Singular-value spectrum of STS-B sentence embeddings")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return str(path)

"""How the runtime files are measured beside PyTorch: the export's own modules around any runner (`encode`), STS-B dev
Spearman, timing interleaved over repeats (`time_runs`, `speedups`) and the card's advice (`advised_row`); the
export (`runtimes`) and scripts/benchmarks/benchmark_runtimes.py share them.
"""

from __future__ import annotations

import time

import numpy as np

BENCHMARK_BATCH = 32
ADVICE_MAX_STSB_DROP = 0.3  # the card's advice: the fastest row this close to PyTorch fp32 on STS-B dev


def torch_runner(model):
    """`run` of a transformers encoder (see `runner`), its output as fp32 numpy."""
    import torch

    def run(batch):
        with torch.no_grad():
            return model(**{k: torch.from_numpy(v) for k, v in batch.items()}).last_hidden_state.float().numpy()
    return run


def encode(st_model, run, sentences: list[str], batch_size: int = BENCHMARK_BATCH) -> np.ndarray:
    """`(N, dim)` sentence embeddings: the export's tokenizer (longest first, as `encode` sorts), `run` in place of its
    Transformer's model, then its own modules after it (Pooling as `1_Pooling/config.json` says, Dense...)."""
    import torch
    transformer, order = st_model[0], np.argsort([-len(s) for s in sentences], kind="stable")
    out = np.empty((len(sentences), st_model.get_embedding_dimension()), dtype=np.float32)
    for start in range(0, len(sentences), batch_size):
        rows = order[start:start + batch_size]
        batch = transformer.tokenizer([sentences[i] for i in rows], padding=True, truncation=True,
                                      max_length=st_model.max_seq_length, return_tensors="np")
        features = {"token_embeddings": torch.from_numpy(np.asarray(run(dict(batch)), dtype=np.float32)),
                    "attention_mask": torch.from_numpy(batch["attention_mask"])}
        with torch.no_grad():
            for module in list(st_model)[1:]:
                features = module(features)
        out[rows] = features["sentence_embedding"].float().numpy()
    return out


def stsb_spearman(embed, pairs) -> float:
    """Spearman x100 of the cosine similarities of `pairs` (`StsPairs`) with their gold scores, rounded to 2 places
    (`metrics.score_correlation`, as every STS score of the library)."""
    from ..metrics import score_correlation
    unique = list(dict.fromkeys([*pairs.sentences1, *pairs.sentences2]))
    vectors = embed(unique).astype(np.float64)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True).clip(1e-12)
    index = {sentence: row for row, sentence in enumerate(unique)}
    cosines = [vectors[index[a]] @ vectors[index[b]] for a, b in zip(pairs.sentences1, pairs.sentences2)]
    return round(score_correlation(cosines, pairs.scores)["spearman"], 2)


def time_runs(st_model, runs: list, sentences: list[str], repeats: int = 3) -> list[list[float]]:
    """Seconds each of `runs` takes to `encode` `sentences`, `repeats` times, interleaved (run 1, 2, ..., 1, 2, ...)
    after one warm-up pass each (allocations, and the kernels OpenVINO compiles for each new shape), so that a
    shared machine's load falls on every run alike."""
    for run in runs:
        encode(st_model, run, sentences)
    seconds: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for times, run in zip(seconds, runs):
            start = time.perf_counter()
            encode(st_model, run, sentences)
            times.append(time.perf_counter() - start)
    return seconds


def speedups(seconds: list[list[float]]) -> list[list[float]]:
    """Each run's speed over the first one's (PyTorch fp32) in every repeat of `time_runs`."""
    return [[base / taken for base, taken in zip(seconds[0], times)] for times in seconds]


def advised_row(rows: list[dict]) -> int:
    """The index of the fastest row within `ADVICE_MAX_STSB_DROP` STS-B dev points of the first (PyTorch fp32; every
    row when no dev file was given)."""
    reference = rows[0]["stsb_spearman"]
    return max((i for i, row in enumerate(rows) if reference is None or
                reference - row["stsb_spearman"] <= ADVICE_MAX_STSB_DROP), key=lambda i: rows[i]["speedup"])

#!/usr/bin/env python
"""Step-0 diagnosis of MoCoSE's heads: does the query find its own key before any training?

Builds a MoCoSE model from the encoder for each head setting, runs one training-mode forward (dropout
on, no gradient) on the first `--n` corpus sentences, and reports, over the batch's query/key cosine
matrix: the mean cosine of each query with its own key (`pos_cos`), with the other keys (`neg_cos`),
and how often the own key is the nearest one (`top1`). With the paper's random heads the query is a
random function of the key and `pos_cos` is no higher than `neg_cos`: the loss has nothing to pull
on until the heads have learnt, which at the encoder's learning rate takes hundreds of steps
(docs/quality.md).

    HF_HUB_OFFLINE=1 python scripts/research/diagnose_heads.py --corpus ../shared/data/corpus/unlabeled_en.txt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this repository: its hf_mocose and scripts

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from scripts import DEFAULT_CORPUS, write_outputs  # noqa: E402

SETTINGS = {
    "paper (random heads)": {"head_init": "random"},
    "identity heads": {"head_init": "identity"},
    "no predictor": {"head_init": "random", "predictor_layers": 0},
    "no projection, no predictor": {"head_init": "random", "predictor_layers": 0, "projection_layers": 0},
}


@torch.no_grad()
def step0_alignment(model, batch: dict) -> dict[str, float]:
    """One training-mode forward of `batch` (`(B, L)` tensors) -> pos_cos, neg_cos, top1 of queries vs keys."""
    model.train()
    outputs = model(**batch)
    sims = F.normalize(outputs.query, dim=-1) @ F.normalize(outputs.key, dim=-1).T  # (B, B)
    n = sims.shape[0]
    diagonal = sims.diagonal()
    return {
        "pos_cos": round(diagonal.mean().item(), 3),
        "neg_cos": round(((sims.sum() - diagonal.sum()) / (n * (n - 1))).item(), 3),
        "top1": round((sims.argmax(dim=1) == torch.arange(n, device=sims.device)).float().mean().item(), 3),
    }


def main(argv: list[str] | None = None) -> dict:
    from transformers import AutoTokenizer

    from hf_mocose import MoCoSEModel
    from hf_mocose.data.corpus import load_sentences
    from hf_mocose.trainer.inputs import resolve_model_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:all-MiniLM-L6-v2", help="encoder folder, Hub id or builtin:")
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--n", type=int, default=64, help="sentences in the batch")
    parser.add_argument("--max_seq_length", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the figures here")
    cfg = parser.parse_args(argv)
    model_path = resolve_model_path(cfg.model)
    lines = list(load_sentences(cfg.corpus, max_train_samples=cfg.n)["text"])  # as training reads it
    if len(lines) < cfg.n:
        raise SystemExit(f"--corpus {cfg.corpus!r} has {len(lines)} sentences, fewer than --n {cfg.n}.")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    batch = dict(tokenizer(lines, padding="max_length", truncation=True, max_length=cfg.max_seq_length,
                           return_tensors="pt"))
    results = {}
    for name, overrides in SETTINGS.items():
        torch.manual_seed(cfg.seed)
        model = MoCoSEModel.from_pretrained(model_path, max_seq_length=cfg.max_seq_length, **overrides)
        results[name] = step0_alignment(model, batch)
        print(f"{name:28s} {results[name]}", flush=True)
    return write_outputs(results, cfg.json)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""STS scores along the straight line in weight space from the start encoder to trained models.

For each trained model (a MoCoSE checkpoint saved by `MoCoSETrainer.save_model`, or a SentenceTransformer
folder) and each `alpha`, the encoder's weights become `alpha * start + (1 - alpha) * trained` (weight
interpolation, as WiSE-FT, Wortsman et al. 2022) and the result is scored on the STS sets of
`scripts/benchmarks/benchmark_quality.py` with the model's own pooling. `alpha = 0` is the trained model, `1`
the start.
docs/quality.md, "Adapting a deployed model", uses it to ask how far an adaptation run should go: a run that moves half as
far (a lower encoder rate) lies near `alpha = 0.5` of one that moves the whole way.

    HF_HUB_OFFLINE=1 python scripts/research/score_interpolations.py \\
        outputs/benchmark_quality/mocose_adapt-seed0/final --alphas 0.3 0.5 --markdown interpolations.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this repository: its hf_mocose and scripts

import torch  # noqa: E402

from scripts import DEFAULT_SENTEVAL, default_encoder, write_outputs  # noqa: E402
from scripts.benchmarks.benchmark_quality import EVAL_TASKS, encoder_of, load_tasks, score_sts  # noqa: E402


def interpolate(trained: dict[str, torch.Tensor], start: dict[str, torch.Tensor], alpha: float) -> dict:
    """`alpha * start + (1 - alpha) * trained` for every floating-point tensor both hold; others stay trained."""
    return {key: torch.lerp(value, start[key].to(value.dtype), alpha)
            if key in start and value.is_floating_point() and start[key].shape == value.shape else value
            for key, value in trained.items()}


def load_trained(path: str, device: str):
    """(model to score, its encoder module, tokenizer) for a MoCoSE checkpoint or a SentenceTransformer folder."""
    if (Path(path) / "modules.json").is_file():
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(path, device=device)
        return model, model[0].auto_model, model.tokenizer
    from transformers import AutoTokenizer

    from hf_mocose import MoCoSEModel

    model = MoCoSEModel.from_pretrained(path).to(device)
    return model, model.online_encoder, AutoTokenizer.from_pretrained(path)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trained", nargs="+", help="trained model folders (benchmark_quality.py --save_models)")
    parser.add_argument("--alphas", type=float, nargs="+", required=True, help="weights of the start, each in [0, 1]")
    parser.add_argument("--start", default=None, help="the encoder the runs started from (default: all-MiniLM-L6-v2)")
    parser.add_argument("--senteval_dir", default=str(DEFAULT_SENTEVAL))
    parser.add_argument("--tasks", nargs="+", default=list(EVAL_TASKS))
    parser.add_argument("--eval_max_length", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    cfg = parser.parse_args(argv)
    bad = [a for a in cfg.alphas if not 0.0 <= a <= 1.0]
    if bad:
        raise SystemExit(f"--alphas {bad}: each is the start's weight, between 0 and 1")

    from transformers import AutoModel

    cfg.start = cfg.start or default_encoder()
    tasks = load_tasks(cfg.senteval_dir, cfg.tasks)
    start = AutoModel.from_pretrained(cfg.start).state_dict()
    rows = []
    for path in cfg.trained:
        model, encoder, tokenizer = load_trained(path, cfg.device)
        trained = {k: v.detach().clone() for k, v in encoder.state_dict().items()}
        if not trained.keys() & start.keys():
            raise SystemExit(f"{path}: its encoder shares no weight names with --start {cfg.start}")
        for alpha in cfg.alphas:
            encoder.load_state_dict(interpolate(trained, start, alpha))
            model.eval()
            scores = score_sts(encoder_of(model, tokenizer, cfg.eval_max_length), tasks)
            rows.append({"model": path, "alpha": alpha, "scores": scores})
            print(json.dumps(rows[-1]), flush=True)
    header = "| model | alpha (start's weight) | " + " | ".join(tasks) + " | mean of sets |"
    lines = [header, "| --- | ---: | " + " | ".join("---:" for _ in tasks) + " | ---: |"]
    for row in rows:
        lines.append(f"| {row['model']} | {row['alpha']:g} | " + " | ".join(f"{row['scores'][t]:.2f}" for t in tasks)
                     + f" | {statistics.mean(row['scores'][t] for t in tasks):.2f} |")
    command = "python scripts/research/score_interpolations.py " + " ".join(sys.argv[1:] if argv is None else argv)
    result = {"start": cfg.start, "tasks": list(tasks), "rows": rows, "markdown": "\n".join(lines), "command": command}
    print(result["markdown"])
    return write_outputs(result, cfg.json, cfg.markdown, result["markdown"])


if __name__ == "__main__":
    main()

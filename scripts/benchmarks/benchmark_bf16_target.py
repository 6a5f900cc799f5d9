#!/usr/bin/env python
"""MoCoSE's target branch under bf16: what its no-grad forward costs, and what bf16 keys do to the loss.

Part 1, cost (paired rounds: every option runs once per round, medians of the per-round ratios to fp32):
the target's no-grad forward (encoder + pooler + projection, training mode: dropout on, as `target_dropout`
defaults) on one batch, in three ways:

  fp32            fp32 weights, no autocast
  autocast        fp32 weights under `torch.autocast(bfloat16)`: what the library does (the weights are cast
                  op by op, the EMA target itself stays fp32)
  bf16_copy       a bf16 copy of the target, refreshed from the fp32 EMA target before each forward (one
                  `torch._foreach_copy_`, counted in), then a plain bf16 forward
  refresh_only    the refresh alone

Part 2, keys: one batch of queries (online branch, fp32) against its own keys and a queue of `--queue_size`
keys of other sentences, InfoNCE as training computes it (`info_nce_loss`, in-batch negatives). Keys and
queue from the fp32 target (the reference), from the target under bf16 autocast (what bf16 training
enqueues), from the encoder under autocast with the heads in fp32, and from the fp32 target with dropout,
twice (the noise the keys carry anyway, with the library's `target_dropout`). Reported per option: the mean
cosine of each key to its fp32 key, the loss, |loss - fp32 loss|, and the cosine between the gradient of the
loss w.r.t. the queries and the fp32 one.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/benchmarks/benchmark_bf16_target.py --json bf16_target.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this repository: its hf_mocose and scripts

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from scripts import DEFAULT_CORPUS, write_outputs  # noqa: E402


def target_keys(model, batch: dict, embeddings: torch.Tensor, autocast: bool, heads_fp32: bool = False):
    """`(B, D)` keys of the target branch (as `MoCoSEModel.forward` computes them), in fp32 or under bf16 autocast."""
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext()
    with torch.no_grad():
        with context:
            state = model._encode_sentence(model.target_encoder, embeddings, batch["attention_mask"], None)
        with nullcontext() if heads_fp32 or not autocast else context:
            state = state.float() if heads_fp32 else state
            return model.target_projection(model.target_pooler(state)).float()


def cost(model, batch: dict, rounds: int) -> dict:
    """Part 1: median ms per target forward and paired-round ratio to fp32, per option."""
    embeddings = model.get_input_embeddings()(batch["input_ids"]).detach()
    modules = model.target_modules()
    copies = [copy.deepcopy(m).to(torch.bfloat16) for m in modules]
    fp32_tensors = [t for m in modules for t in m.parameters()]
    bf16_tensors = [t for m in copies for t in m.parameters()]
    for module in modules + copies:
        module.train()

    def bf16_copy():
        with torch.no_grad():
            torch._foreach_copy_(bf16_tensors, fp32_tensors)
            encoder, pooler, projection = copies
            state = model._encode_sentence(encoder, embeddings.to(torch.bfloat16), batch["attention_mask"], None)
            projection(pooler(state))

    def refresh_only():
        with torch.no_grad():
            torch._foreach_copy_(bf16_tensors, fp32_tensors)

    options = {"fp32": lambda: target_keys(model, batch, embeddings, False),
               "autocast": lambda: target_keys(model, batch, embeddings, True),
               "bf16_copy": bf16_copy, "refresh_only": refresh_only}
    times = {name: [] for name in options}
    for _ in range(rounds + 1):  # the first round warms up
        for name, run in options.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    fp32 = times["fp32"][1:]
    return {name: {"ms": round(1000 * statistics.median(t[1:]), 1),
                   "over_fp32": round(statistics.median(a / b for a, b in zip(t[1:], fp32)), 3)}
            for name, t in times.items()}


def key_effects(model, batch: dict, queue_batch: dict, temperature: float) -> dict:
    """Part 2: keys and queue of each precision option against the fp32 ones, and what they do to InfoNCE."""
    from hf_mocose.models.losses import info_nce_loss

    words = model.get_input_embeddings()
    embeddings, queue_embeddings = words(batch["input_ids"]).detach(), words(queue_batch["input_ids"]).detach()
    model.train()
    with torch.no_grad():
        query = model.predictor(model.branches.online_key(model._encode_sentence(
            model.online_encoder, embeddings, batch["attention_mask"], None)))
    options = {}
    for module in model.target_modules():
        module.eval()
    for name, autocast, heads_fp32 in (("fp32", False, False), ("bf16_autocast", True, False),
                                       ("bf16_encoder_fp32_heads", True, True)):
        options[name] = (target_keys(model, batch, embeddings, autocast, heads_fp32),
                         target_keys(model, queue_batch, queue_embeddings, autocast, heads_fp32))
    for module in model.target_modules():
        module.train()
    for draw in ("fp32_dropout_a", "fp32_dropout_b"):
        options[draw] = (target_keys(model, batch, embeddings, False),
                         target_keys(model, queue_batch, queue_embeddings, False))
    reference_keys, reference_queue = options["fp32"]
    out, reference_loss, reference_grad = {}, None, None
    for name, (keys, queue) in options.items():
        q = query.clone().requires_grad_(True)
        positives = torch.arange(q.shape[0])
        loss = info_nce_loss(q, keys, temperature, positive_index=positives, extra_negatives=queue).loss
        (grad,) = torch.autograd.grad(loss, q)
        if name == "fp32":
            reference_loss, reference_grad = loss.item(), grad.flatten()
        out[name] = {
            "key_cos_to_fp32": round(F.cosine_similarity(keys, reference_keys).mean().item(), 6),
            "queue_cos_to_fp32": round(F.cosine_similarity(queue, reference_queue).mean().item(), 6),
            "loss": round(loss.item(), 5),
            "abs_loss_diff_to_fp32": round(abs(loss.item() - reference_loss), 5),
            "grad_cos_to_fp32": round(F.cosine_similarity(grad.flatten(), reference_grad, dim=0).item(), 6),
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    from transformers import AutoTokenizer

    from hf_mocose import MoCoSEModel
    from hf_mocose.data.corpus import load_sentences
    from hf_mocose.trainer.inputs import resolve_model_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:all-MiniLM-L6-v2",
                        help="an encoder (a fresh MoCoSE model with the library defaults) or a MoCoSE checkpoint")
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--queue_size", type=int, default=512)
    parser.add_argument("--max_seq_length", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=12, help="timed rounds of part 1 (after one warm-up round)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    cfg = parser.parse_args(argv)
    torch.manual_seed(cfg.seed)
    path = resolve_model_path(cfg.model)
    model = MoCoSEModel.from_pretrained(path, method="mocose", sentence_pooling="cls", max_seq_length=cfg.max_seq_length)
    tokenizer = AutoTokenizer.from_pretrained(path)
    sentences = list(load_sentences(cfg.corpus if Path(cfg.corpus).is_file() else "builtin:python_docs",
                                    max_train_samples=cfg.batch_size + cfg.queue_size)["text"])

    def tokens(texts):
        return dict(tokenizer(texts, padding="max_length", truncation=True, max_length=cfg.max_seq_length,
                              return_tensors="pt"))

    batch, queue_batch = tokens(sentences[: cfg.batch_size]), tokens(sentences[cfg.batch_size:])
    result = {"cost": cost(model, batch, cfg.rounds), "keys": key_effects(model, batch, queue_batch, cfg.temperature),
              "threads": torch.get_num_threads(), "command": "python scripts/benchmarks/benchmark_bf16_target.py "
              + " ".join(sys.argv[1:] if argv is None else argv)}
    print(json.dumps(result, indent=1))
    return write_outputs(result, cfg.json)


if __name__ == "__main__":
    main()

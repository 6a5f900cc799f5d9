#!/usr/bin/env python
"""Quality at equal compute: MoCoSE variants, SimCSE mode and the sentence-transformers MNRL recipe.

Every variant starts from the same encoder (default all-MiniLM-L6-v2), trains on the same corpus with
the same batch size, sequence length, learning rate, temperature (0.05; MNRL scale 20) and dropout,
and gets the same training-time budget. Afterwards each is scored on every STS set present under
`--senteval_dir` (STS-B dev and train, STS12, SICK-R trial and train in `../shared`; the
STS13-16, STS-B and SICK-R test sets when present), Spearman x100 of the cosine of the sentence embeddings of whole
sentences (truncated only at `--eval_max_length`, 512 tokens by default, which no STS sentence reaches).
`--pooling` chooses the sentence embedding every variant trains and is scored on: `cls` (the [CLS] state, what
MoCoSE and SimCSE train) or `mean` (the token mean: how all-MiniLM-L6-v2 is deployed and what
sentence-transformers users adapt).

Variants (`--variants`, any mix of the names below and custom `label:key=value,key=value` specs whose
keys are `MoCoSETrainingArguments` fields on top of the `mocose` defaults; `front_end=st` trains the same settings
through `MoCoSELoss`, whose arguments carry the same names; Trainer fields such as `learning_rate` or `bf16=true`
(bf16 autocast, e.g. `mocose_bf16:bf16=true`) go to either front end's training arguments):

  mocose                 the MoCoSE defaults of this library (see docs/quality.md)
  mocose_paper           the paper's setting: random head init, one learning rate, FGSM 5e-9 absolute
  mocose_identity        paper + identity-initialised heads (head_init=identity)
  mocose_head_lr         paper + heads at learning rate 1e-3 (head_learning_rate)
  mocose_identity_head_lr  both
  mocose_no_heads        paper without projection and predictor (pooler only)
  mocose_identity_fgsm_off / mocose_identity_fgsm_rms  identity heads with FGSM off / at 1% of the
                         embedding RMS (fgsm_epsilon_unit=embedding_rms, fgsm_epsilon=0.01)
  mocose_adapt           the adaptation recipe for an already deployed encoder (training_args/adapt-*.yaml):
                         see ADAPT below and docs/quality.md
  simcse                 `MoCoSETrainer`, method="simcse" (two dropout views, in-batch negatives), with
                         the paper's random heads at one learning rate
  st_mocose              the second front end: `SentenceTransformerTrainer` + `MoCoSELoss` with its defaults, on
                         Transformer + Pooling(--pooling)
  st_mocose_adapt        the same with the adaptation recipe's settings
  st_mnrl                `SentenceTransformerTrainer` + `MultipleNegativesRankingLoss` on (s, s) pairs,
                         Transformer + Pooling(--pooling): the SimCSE recipe of sentence-transformers
  esimcse                `MoCoSETrainer`, method="esimcse" with training_args/esimcse-bert-base.yaml's method values
                         (word repetition 0.32, momentum 0.995, queue 2.5 x the batch, empty at the start, no target
                         dropout, no FGSM, the pooler Linear as the only head, random, at learning_rate)
  st_cmnrl               `CachedMultipleNegativesRankingLoss` on (s, s) pairs at 4x the batch (GradCache, mini-batches
                         of --batch_size; its schedule spans the same epoch in a quarter of the steps)
  st_ct                  `ContrastiveTensionLossInBatchNegatives` (Contrastive Tension, in-batch negatives), scale 20
  st_tsdae               `DenoisingAutoEncoderLoss`, decoder tied to the encoder, on (noisy, original) pairs; noise:
                         whitespace words deleted with probability 0.6 (TSDAE's ratio; nltk's tokenizer is not used)
  mocose_matryoshka      `mocose` with matryoshka_dims = `--matryoshka_dims` (default 384 256 128 64)
  simcse_matryoshka      `simcse` with the same matryoshka_dims
  st_matryoshka_mnrl     `st_mnrl` inside sentence-transformers' `MatryoshkaLoss` at `--matryoshka_dims`
  labelled_mocose_b16, labelled_mnrl_b16, labelled_mnrl_b128, labelled_cmnrl_b128
                         labelled data: (anchor, positive) pairs built from `--senteval_dir`, each variant at its own
                         batch, with its peak training memory (scripts/benchmarks/labelled_variants.py); the sets the
                         pairs come from (STS-B train, SICK-R train) are then not scored

`--truncate_dims 384 128 64` scores every variant (and the start) at each width: the first d entries of the same
embeddings, columns `task@d`.

Equal compute: the budget is enforced by a `TrainerCallback` that sets `control.should_training_stop`
once the variant's training time is spent. With `--interleave` (default) the trainers take turns, one
optimizer step each, and each variant's clock counts only its own steps (on_step_begin -> on_step_end:
forward, backward, optimizer, queue, EMA), so noise from other processes hits all of them alike.
`--no-interleave` trains them one after the other on the wall clock from on_train_begin.
`--clock cpu` measures the budget in CPU seconds of this process (`time.process_time`) instead of
wall-clock seconds: on a machine loaded by other jobs it counts the compute a step got, not the time
it waited (use it for screening there; report wall-clock figures from a quiet machine). The LR
schedule (linear decay) and MoCoSE's EMA ramp span `--schedule_steps` optimizer steps (default: one
epoch of the corpus) for every variant, whatever the budget cuts off.

Usage, from the repository root:

    HF_HUB_OFFLINE=1 python scripts/benchmarks/benchmark_quality.py --budget_minutes 10 --seeds 0 1 \\
        --variants mocose mocose_paper simcse st_mnrl --json quality.json --markdown quality.md
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this repository: its hf_mocose and scripts

import torch  # noqa: E402

from scripts import DEFAULT_CORPUS, DEFAULT_SENTEVAL, REPO, default_encoder  # noqa: E402
from scripts.benchmarks.quality_tables import merge, summarise, write_summary  # noqa: E402
from scripts.benchmarks.train_variants import (  # noqa: E402
    AutocastRecorder,
    mocose_trainer,
    sentence_transformer,
    st_baseline_trainer,
    trainer_fields,
)
from scripts.benchmarks.labelled_variants import LABELLED_VARIANTS, TRAINED_ON, build_labelled  # noqa: E402
from scripts.benchmarks.turn_taking import Baton, TakeTurns, run_turns, start_in_turn  # noqa: E402

PAPER = {"head_init": "random", "head_learning_rate": None, "fgsm_mode": "previous", "fgsm_epsilon": 5e-9,
         "fgsm_epsilon_unit": "absolute"}
# The adaptation recipe (training_args/adapt-minilm.yaml; docs/quality.md, "Adapting a deployed model"): a softer
# temperature turns the move toward what helps STS12 as well as STS-B, and an encoder rate 60x below the
# from-scratch 3e-5 keeps it short enough that SICK-R does not pay for it.
ADAPT: dict = {"learning_rate": 5e-7, "contrastive_temperature": 0.1}
# ESimCSE as its recipe (training_args/esimcse-bert-base.yaml) sets the method; the queue is 2.5 x the batch (`build`).
ESIMCSE: dict = {"method": "esimcse", "word_repetition_rate": 0.32, "ema_decay_start": 0.995, "ema_decay_end": 0.995,
                 "queue_init_size": 0, "target_dropout": False, "fgsm_mode": "off", "projection_layers": 0,
                 "head_init": "random", "head_learning_rate": None}
ESIMCSE_QUEUE_PER_BATCH = 2.5  # the authors' neg_size 160 at batch 64 (caskcsg/sentemb ESimCSE/run.sh)
# SimCSE as its paper trains it (random heads at learning_rate), whatever the library defaults are.
SIMCSE: dict = {"method": "simcse", "fgsm_mode": "off", "head_init": "random", "head_learning_rate": None}
MATRYOSHKA_FLAG = "--matryoshka_dims"  # a variant's matryoshka_dims: the flag's
# name -> MoCoSETrainingArguments overrides; the sentence-transformers baselines (None) are built apart (ST_BASELINES),
# `front_end: st` through MoCoSELoss.
VARIANTS: dict[str, dict | None] = {
    "mocose": {"method": "mocose"},  # the library defaults (identity heads at head_learning_rate 1e-3)
    "mocose_paper": {"method": "mocose", **PAPER},
    "mocose_identity": {"method": "mocose", **PAPER, "head_init": "identity"},
    "mocose_head_lr": {"method": "mocose", **PAPER, "head_learning_rate": 1e-3},
    "mocose_identity_head_lr": {"method": "mocose", **PAPER, "head_init": "identity", "head_learning_rate": 1e-3},
    "mocose_no_heads": {"method": "mocose", **PAPER, "projection_layers": 0, "predictor_layers": 0},
    "mocose_identity_fgsm_off": {"method": "mocose", **PAPER, "head_init": "identity", "fgsm_mode": "off"},
    "mocose_identity_fgsm_rms": {"method": "mocose", **PAPER, "head_init": "identity",
                                 "fgsm_epsilon_unit": "embedding_rms", "fgsm_epsilon": 0.01},
    "simcse": SIMCSE,
    "st_mnrl": None,
    "esimcse": ESIMCSE,
    "st_cmnrl": None,
    "st_ct": None,
    "st_tsdae": None,
    "mocose_adapt": {"method": "mocose", **ADAPT},
    "st_mocose": {"method": "mocose", "front_end": "st"},
    "st_mocose_adapt": {"method": "mocose", "front_end": "st", **ADAPT},
    "mocose_matryoshka": {"method": "mocose", "matryoshka_dims": MATRYOSHKA_FLAG},
    "simcse_matryoshka": {**SIMCSE, "matryoshka_dims": MATRYOSHKA_FLAG},
    "st_matryoshka_mnrl": None,
    **dict.fromkeys(LABELLED_VARIANTS),  # sentence-transformers trainers on labelled pairs (labelled_variants.py)
}
DEFAULT_VARIANTS = ("mocose", "simcse", "st_mnrl")
EVAL_TASKS = ("stsb_dev", "sts12", "sickr_trial", "stsb_train", "sickr_train", "sts13", "sts14", "sts15", "sts16", "stsb",
              "sickr")


def _scalar(text: str):
    """`null`/`none`, `true`/`false`, ints and floats (`1e-3` too) become Python values; anything else
    (`off`, `identity`) stays a string (not YAML: it reads `off` as False and `1e-3` as a string)."""
    lowered = text.lower()
    if lowered in ("null", "none"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_variant(spec: str) -> tuple[str, dict | None]:
    """`name` (one of `VARIANTS`) or `label:key=value,key=value` (overrides on the `mocose` defaults)."""
    if ":" not in spec:
        if spec not in VARIANTS:
            raise SystemExit(f"unknown variant {spec!r}: use one of {', '.join(VARIANTS)} or label:key=value,...")
        return spec, VARIANTS[spec]
    label, _, body = spec.partition(":")
    overrides = {"method": "mocose"}
    for item in filter(None, body.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"variant {spec!r}: {item!r} is not key=value")
        overrides[key.strip()] = _scalar(value.strip())
    return label, overrides


class TrainingBudget(TakeTurns):
    """Stops training once `seconds` of training time are spent (sets `control.should_training_stop`).

    With a `baton` the clock counts only this trainer's own steps and the turn passes to the next
    trainer after every step; without one it is the wall clock from `on_train_begin`.
    """

    def __init__(self, seconds: float, name: str = "", baton: Baton | None = None, ready: threading.Event | None = None,
                 clock=time.perf_counter, marks: tuple[float, ...] = (), score=None):
        super().__init__(name, baton, ready)
        self.seconds, self.clock = seconds, clock
        # Budget-curve points: at each mark (seconds, below the budget) `score(model)` runs once, off the clock.
        self.pending_marks = sorted(m for m in marks if m < seconds)
        self.score, self.scores_at = score, {}
        self.spent = 0.0
        self.steps = 0
        self._t0 = None
        self._train_begin = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._train_begin = self.clock()

    def on_step_begin(self, args, state, control, **kwargs):
        super().on_step_begin(args, state, control, **kwargs)
        self._t0 = self.clock()

    def on_step_end(self, args, state, control, **kwargs):
        now = self.clock()
        self.steps += 1
        if self.baton is None:
            self.spent = now - self._train_begin
        else:
            self.spent += now - self._t0
        passed = [m for m in self.pending_marks if self.spent >= m]
        if passed:  # one scoring serves every mark this step passed
            self.pending_marks = self.pending_marks[len(passed):]
            model = kwargs["model"]
            was_training = model.training
            point = {"steps": state.global_step, "scores": self.score(model)}
            model.train(was_training)
            self.scores_at.update({mark: point for mark in passed})
        if self.spent >= self.seconds:
            control.should_training_stop = True
        super().on_step_end(args, state, control, **kwargs)
        return control


def build(name: str, overrides: dict | None, cfg, model_path: str, sentences, output_dir: str, seed: int):
    """Returns (trainer, model, tokenizer) for one variant."""
    from transformers import AutoTokenizer, TrainingArguments, set_seed

    if name in LABELLED_VARIANTS:
        return build_labelled(name, cfg, model_path, cfg.labelled_pairs, output_dir, seed)
    set_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    common = trainer_fields(output_dir, cfg.batch_size, cfg.schedule_steps, cfg.device, seed,
                            learning_rate=cfg.learning_rate, logging_steps=50)
    if overrides is None:  # sentence-transformers' own losses
        model = sentence_transformer(model_path, cfg.max_seq_length, cfg.pooling, cfg.device)
        return st_baseline_trainer(name, model, sentences, common, 1.0 / cfg.temperature, seed,
                                   cfg.matryoshka_dims), model, tokenizer

    settings = dict(max_seq_length=cfg.max_seq_length, queue_size=cfg.queue_size,
                    queue_init_size=min(128, cfg.queue_size), contrastive_temperature=cfg.temperature,
                    sentence_pooling=cfg.pooling)
    if overrides.get("method") == "esimcse":
        settings["queue_size"] = round(ESIMCSE_QUEUE_PER_BATCH * cfg.batch_size)
    settings.update({key: cfg.matryoshka_dims if value == MATRYOSHKA_FLAG else value for key, value in overrides.items()})
    # Trainer settings a variant may change (e.g. learning_rate) go to the training arguments of either front end.
    trainer_names = {f.name for f in dataclasses.fields(TrainingArguments)}
    common.update({k: settings.pop(k) for k in list(settings) if k in trainer_names})
    if settings.pop("front_end", "trainer") == "st":
        return build_st_mocose(settings, cfg, model_path, sentences, common)
    trainer = mocose_trainer(model_path, tokenizer, sentences, cfg.max_seq_length, {**common, **settings})
    return trainer, trainer.model, tokenizer


def build_st_mocose(settings: dict, cfg, model_path: str, sentences, common: dict):
    """`SentenceTransformerTrainer` + `MoCoSELoss` on Transformer + Pooling(--pooling): the second front end.

    The settings carry `MoCoSETrainingArguments` names, which `MoCoSELoss` shares; the ones that are not the
    loss's (the method, pooling and length, set by the model itself here) are left out.
    """
    import inspect

    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.training_args import SentenceTransformerTrainingArguments

    from hf_mocose import MoCoSELoss

    if settings.pop("method") != "mocose":
        raise SystemExit("front_end=st trains MoCoSE only (MoCoSELoss)")
    settings.pop("sentence_pooling")
    model = sentence_transformer(model_path, settings.pop("max_seq_length"), cfg.pooling, cfg.device)
    accepted = set(inspect.signature(MoCoSELoss).parameters) - {"model"}
    unknown = sorted(set(settings) - accepted)
    if unknown:
        raise SystemExit(f"front_end=st: MoCoSELoss takes no {', '.join(unknown)}")
    loss = MoCoSELoss(model, **settings)
    trainer = SentenceTransformerTrainer(
        model=model, args=SentenceTransformerTrainingArguments(**common), loss=loss, callbacks=[loss.callback],
        train_dataset=Dataset.from_dict({"text": sentences}),
    )
    return trainer, model, model.tokenizer


def encoder_of(model, tokenizer, max_length: int):
    """sentences -> `(n, hidden)` embeddings, for a MoCoSE model (its `sentence_pooling`) or a Transformer+Pooling ST model."""
    from hf_mocose.models.encoding import encode_with_model

    if hasattr(model, "encode") and not hasattr(model, "online_encoder"):  # sentence-transformers
        model.max_seq_length = max_length
        return lambda s: model.encode(s, batch_size=64, convert_to_tensor=True).float().cpu()
    return lambda s: encode_with_model(model, tokenizer, s, batch_size=64, max_length=max_length)


def score_sts(encode, tasks: dict, dims: list[int] | None = None) -> dict[str, float]:
    """Spearman x100 per task (STS12-16: one correlation over the concatenated sets, as SimCSE/MoCoSE); with
    `dims` (`--truncate_dims`), per task and width, `task@d`: the first d entries of the same embeddings."""
    from hf_mocose.evaluation.sts import evaluate_sts_task

    if not dims:
        return {task: round(evaluate_sts_task(encode, sets)["spearman"], 2) for task, sets in tasks.items()}
    encoded: dict = {}

    def first(dim: int):  # each task's sentences encoded once, for every width
        def cut(sentences):
            if (key := tuple(sentences)) not in encoded:
                encoded[key] = encode(sentences)
            embeddings = encoded[key]
            if dim > embeddings.shape[1]:
                raise SystemExit(f"--truncate_dims {dim}: the embeddings have {embeddings.shape[1]} dimensions")
            return embeddings[:, :dim]
        return cut

    return {f"{task}@{dim}": round(evaluate_sts_task(first(dim), sets)["spearman"], 2)
            for task, sets in tasks.items() for dim in dims}


def load_tasks(senteval_dir: str, names: list[str]) -> dict:
    """name -> loaded STS task, for each of `names` whose files are under `senteval_dir` (others are skipped)."""
    from hf_mocose.evaluation.sts import load_sts_task, sts_task_files

    tasks = {t: load_sts_task(senteval_dir, t) for t in names
             if all(p.is_file() for p in sts_task_files(senteval_dir, t))}
    if not tasks:
        raise SystemExit(f"no STS task of {names} has its files under {senteval_dir}")
    return tasks


def load_corpus(path: str, limit: int | None) -> list[str]:
    from hf_mocose.data.corpus import load_sentences

    return list(load_sentences(path, max_train_samples=limit)["text"])  # as training reads it


def run_seed(cfg, variants: dict, model_path: str, sentences, tasks: dict, seed: int) -> dict:
    budget = 60.0 * cfg.budget_minutes
    built, callbacks, recorders, threads, errors, results = {}, {}, {}, [], {}, {}
    baton = Baton(list(variants)) if cfg.interleave else None
    for name, overrides in variants.items():
        out_dir = os.path.join(cfg.output_dir, f"{name}-seed{seed}")
        trainer, model, tokenizer = build(name, overrides, cfg, model_path, sentences, out_dir, seed)
        recorders[name] = AutocastRecorder(trainer, torch.device(cfg.device))  # before the budget: it scores at marks
        trainer.add_callback(recorders[name])
        ready = threading.Event() if baton is not None else None
        clock = time.process_time if cfg.clock == "cpu" else time.perf_counter
        marks = tuple(60.0 * m for m in cfg.score_at_minutes)
        callback = TrainingBudget(budget, name, baton, ready, clock, marks,
                                  score=lambda m, tok=tokenizer: score_sts(encoder_of(m, tok, cfg.eval_max_length), tasks,
                                                                           cfg.truncate_dims))
        trainer.add_callback(callback)
        built[name] = (trainer, model, tokenizer, out_dir)
        callbacks[name] = callback
        if baton is None:
            trainer.train()
        else:
            threads.append(start_in_turn(trainer, name, baton, ready, errors))
    if baton is not None:
        run_turns(baton, threads)
    for name in list(built):
        trainer, model, tokenizer, out_dir = built.pop(name)
        precision = "bf16" if trainer.args.bf16 else "fp32"
        error = errors.get(name) or recorders[name].problem(precision)
        if error:
            raise RuntimeError(f"{name} (seed {seed}) failed: {error}")
        checkpoint = None
        if cfg.save_models:
            checkpoint = os.path.join(out_dir, "final")
            model.save(checkpoint) if variants[name] is None else trainer.save_model(checkpoint)
        scores = score_sts(encoder_of(model, tokenizer, cfg.eval_max_length), tasks, cfg.truncate_dims)
        results[name] = {
            "scores": scores,
            "steps": trainer.state.global_step,
            "sentences": trainer.state.global_step * trainer.args.per_device_train_batch_size,
            "train_seconds": round(callbacks[name].spent, 1),
            "precision": precision,
            "checkpoint": checkpoint,
            "scores_at_minutes": {f"{mark / 60:g}": point for mark, point in callbacks[name].scores_at.items()},
        }
        if hasattr(trainer, "peak_memory"):  # the labelled variants
            results[name]["peak_train_mib"] = trainer.peak_memory.peak_mib
        print(f"seed {seed} {name}: {results[name]}", flush=True)
        del trainer, model
    return results


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="encoder to start from (default: the offline all-MiniLM-L6-v2)")
    parser.add_argument("--variants", "--methods", nargs="+", default=list(DEFAULT_VARIANTS),
                        help=f"variant names ({', '.join(VARIANTS)}) or label:key=value,... specs")
    parser.add_argument("--budget_minutes", type=float, default=3.0, help="training time per variant and seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--max_train_samples", type=int, default=None)
    parser.add_argument("--senteval_dir", default=str(DEFAULT_SENTEVAL), help="SentEval data folder (STS sets scored)")
    parser.add_argument("--tasks", nargs="+", default=list(EVAL_TASKS), help="STS tasks to score, when present")
    parser.add_argument("--eval_max_length", type=int, default=512, help="truncation when encoding STS sentences")
    parser.add_argument("--batch_size", type=int, default=64, help="sentences per optimizer step, every variant")
    parser.add_argument("--pooling", choices=("cls", "mean"), default="cls",
                        help="sentence embedding trained and scored, for the start and every variant")
    parser.add_argument("--max_seq_length", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=3e-5)
    parser.add_argument("--temperature", type=float, default=0.05)
    parser.add_argument("--queue_size", type=int, default=512)
    parser.add_argument("--matryoshka_dims", type=int, nargs="+", default=[384, 256, 128, 64],
                        help="the *_matryoshka variants' widths (descending, the first the model's)")
    parser.add_argument("--truncate_dims", type=int, nargs="+", default=None,
                        help="score every variant at each of these widths (the first d entries), e.g. 384 128 64")
    parser.add_argument("--schedule_steps", type=int, default=None,
                        help="optimizer steps the LR schedule and EMA ramp span (default: one epoch)")
    parser.add_argument("--interleave", action=argparse.BooleanOptionalAction, default=True,
                        help="take turns step by step and count each variant's own step time (default)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="budget in wall-clock seconds (default) or CPU seconds of this process (see above)")
    parser.add_argument("--score_at_minutes", type=float, nargs="*", default=[],
                        help="also score each variant when its clock passes these budgets (a budget curve in one run)")
    parser.add_argument("--save_models", action="store_true", help="save each trained model under --output_dir")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output_dir", default=str(REPO / "outputs" / "benchmark_quality"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None, help="write the results table here")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="only merge these --json results (same settings, other seeds) into one table")
    cfg = parser.parse_args(argv)
    if cfg.merge:
        return write_summary(merge(cfg.merge), cfg.json, cfg.markdown)
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from hf_mocose import MoCoSEModel
    hf_logging.set_verbosity_error()
    variants = dict(parse_variant(spec) for spec in cfg.variants)
    if cfg.model is None:
        model_path, model_name = default_encoder(), "all-MiniLM-L6-v2"
    else:
        model_path = model_name = cfg.model
    cfg.labelled_pairs, cfg.labelled_schedule_steps = None, cfg.schedule_steps
    if labelled := [name for name in variants if name in LABELLED_VARIANTS]:
        from hf_mocose.data.labelled import senteval_pairs

        cfg.labelled_pairs = senteval_pairs(cfg.senteval_dir)
        if dropped := [task for task in cfg.tasks if task in TRAINED_ON]:
            print(f"{', '.join(labelled)} train on pairs from {', '.join(dropped)}: not scored", flush=True)
            cfg.tasks = [task for task in cfg.tasks if task not in TRAINED_ON]
    tasks = load_tasks(cfg.senteval_dir, cfg.tasks)
    # (the labelled variants train on their pairs alone)
    unlabelled = any(name not in LABELLED_VARIANTS for name in variants)
    sentences = load_corpus(cfg.corpus, cfg.max_train_samples) if unlabelled else []
    if cfg.schedule_steps is None:
        cfg.schedule_steps = max(1, len(sentences) // cfg.batch_size)

    start = MoCoSEModel.from_pretrained(model_path, method="simcse", sentence_pooling=cfg.pooling)
    before = score_sts(encoder_of(start, AutoTokenizer.from_pretrained(model_path), cfg.eval_max_length), tasks,
                       cfg.truncate_dims)
    del start
    print(f"before ({cfg.pooling}): {before}", flush=True)

    details = {name: [] for name in variants}
    for seed in cfg.seeds:
        results = run_seed(cfg, variants, model_path, sentences, tasks, seed)
        for name in variants:
            details[name].append({"seed": seed, **results[name]})
    scored = list(before)  # the tasks, or with --truncate_dims each task at each width
    summary: dict = {"model": model_name, "tasks": scored, "before": before,
                     "variants": summarise(details, variants, scored)}
    summary.update({
        "details": details, "seeds": cfg.seeds, "budget_minutes": cfg.budget_minutes, "interleave": cfg.interleave,
        "clock": cfg.clock,
        "schedule_steps": cfg.schedule_steps, "corpus": cfg.corpus, "n_sentences": len(sentences),
        "batch_size": cfg.batch_size, "truncate_dims": cfg.truncate_dims, "pooling": cfg.pooling, "max_seq_length": cfg.max_seq_length,
        "learning_rate": cfg.learning_rate,
        "temperature": cfg.temperature, "eval_max_length": cfg.eval_max_length,
        "command": "python scripts/benchmarks/benchmark_quality.py " + argv_text,
        "torch_threads": torch.get_num_threads(),
    })
    if cfg.labelled_pairs is not None:
        summary["labelled_rows"] = len(cfg.labelled_pairs)
    return write_summary(summary, cfg.json, cfg.markdown)


if __name__ == "__main__":
    main()

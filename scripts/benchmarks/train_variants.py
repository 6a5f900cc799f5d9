"""The trainers benchmark_train.py times (and gpu_check trains), one per variant and precision, the sentences they
train on, and the building blocks benchmark_quality.py shares.

See that script's docstring for what each variant is; `build_trainer(name, ...)` returns a ready
`Trainer` whose `train()` runs `cfg.warmup + cfg.steps` optimizer steps. A name is a variant in fp32
(`mocose_previous`) or under bf16 autocast (`mocose_previous_bf16`: the Trainer's `bf16=True`, as users set it).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from scripts.benchmarks.turn_taking import sync_device

VARIANTS = ("plain", "floor", "simcse", "mocose_previous", "mocose_exact", "st_mnrl")
PRECISIONS = ("fp32", "bf16")


def variant_name(variant: str, precision: str) -> str:
    """`plain`, `plain_bf16`, ...: the fp32 names are the variants' own."""
    return variant if precision == "fp32" else f"{variant}_{precision}"


def split_variant_name(name: str) -> tuple[str, str]:
    """The inverse of `variant_name`: `(variant, precision)`."""
    for precision in PRECISIONS[1:]:
        if name.endswith(f"_{precision}") and name[: -len(precision) - 1] in VARIANTS:
            return name[: -len(precision) - 1], precision
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}: one of {', '.join(VARIANTS)}, optionally with _bf16")
    return name, "fp32"


def benchmark_sentences(tokenizer, corpus: str | None, n: int, max_seq_length: int) -> tuple[list[str], bool]:
    """`n` sentences with >= max_seq_length tokens (so every batch is full length under any padding rule).

    Returns the sentences and whether they are all full length (False when the corpus has too few).
    """
    from hf_mocose.data.corpus import python_docs_sentences

    if corpus and Path(corpus).is_file():
        lines = [line.strip() for line in Path(corpus).read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        lines = python_docs_sentences()
    long, short = [], []
    for start in range(0, len(lines), 2048):
        chunk = lines[start : start + 2048]
        lengths = [len(ids) for ids in tokenizer(chunk, truncation=False)["input_ids"]]
        for sentence, length in zip(chunk, lengths):
            (long if length >= max_seq_length else short).append(sentence)
        if len(long) >= n:
            return long[:n], True
    pool = long + short
    while len(pool) < n:
        pool = pool + pool
    return pool[:n], False


def trainer_fields(output_dir: str, batch_size: int, max_steps: int, device: str, seed: int, **more) -> dict:
    """The `TrainingArguments` fields every benchmark run shares (no saving, evaluation or reports), and `more`."""
    return dict(output_dir=output_dir, per_device_train_batch_size=batch_size, max_steps=max_steps, weight_decay=1e-6,
                save_strategy="no", eval_strategy="no", report_to="none", use_cpu=device == "cpu", seed=seed,
                disable_tqdm=True, dataloader_num_workers=0, dataloader_drop_last=True, **more)


def sentence_transformer(model_path: str, max_seq_length: int, pooling: str, device: str):
    """A `SentenceTransformer` of Transformer + Pooling(`pooling`) on `device`."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    transformer = Transformer(model_path, max_seq_length=max_seq_length)
    pooler = Pooling(transformer.auto_model.config.hidden_size, pooling_mode=pooling)
    return SentenceTransformer(modules=[transformer, pooler], device=device)


def st_mnrl_trainer(model, sentences: list[str], fields: dict, scale: float):
    """`SentenceTransformerTrainer` + `MultipleNegativesRankingLoss` on (s, s) pairs: the SimCSE recipe of
    sentence-transformers."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.training_args import SentenceTransformerTrainingArguments

    return SentenceTransformerTrainer(
        model=model, args=SentenceTransformerTrainingArguments(**fields),
        train_dataset=Dataset.from_dict({"anchor": sentences, "positive": sentences}),
        loss=MultipleNegativesRankingLoss(model, scale=scale))


# sentence-transformers' unsupervised recipes, each with its own loss class (benchmark_quality.py's baselines).
ST_BASELINES = ("st_mnrl", "st_cmnrl", "st_ct", "st_tsdae", "st_matryoshka_mnrl")
CMNRL_BATCH_FACTOR = 4  # st_cmnrl: GradCache at 4x the table's batch, in mini-batches of the table's batch
TSDAE_DELETION = 0.6  # TSDAE's deletion ratio (Wang et al., 2021; sentence-transformers' DenoisingAutoEncoderDataset)


def delete_words(sentences: list[str], ratio: float, seed: int) -> list[str]:
    """TSDAE's noise without nltk (whose tokenizer data is not installed): each whitespace-separated word is deleted
    with probability `ratio`, at least one kept, the rest joined by single spaces (nltk: word_tokenize and
    TreebankWordDetokenizer, which also split punctuation off words)."""
    import random

    rng, noisy = random.Random(seed), []
    for sentence in sentences:
        words = sentence.split()
        kept = [word for word in words if rng.random() > ratio]
        noisy.append(" ".join(kept) if kept else (rng.choice(words) if words else sentence))
    return noisy


def st_baseline_trainer(name: str, model, sentences: list[str], fields: dict, scale: float, seed: int = 0,
                        matryoshka_dims: list[int] | None = None):
    """`SentenceTransformerTrainer` with one of sentence-transformers' own unsupervised losses (`ST_BASELINES`):

    * `st_mnrl`: `MultipleNegativesRankingLoss` on (s, s) pairs (SimCSE as sentence-transformers trains it);
    * `st_cmnrl`: `CachedMultipleNegativesRankingLoss` on (s, s) pairs at `CMNRL_BATCH_FACTOR` x the batch, in
      mini-batches of the batch (GradCache; the schedule spans the same epoch in fewer steps);
    * `st_ct`: `ContrastiveTensionLossInBatchNegatives` on single sentences (two models, in-batch negatives);
    * `st_tsdae`: `DenoisingAutoEncoderLoss` with its tied decoder on (noisy, original) pairs, noise `delete_words`;
    * `st_matryoshka_mnrl`: `MatryoshkaLoss` around `st_mnrl`'s loss at `matryoshka_dims`.
    """
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer import losses
    from sentence_transformers.sentence_transformer.training_args import SentenceTransformerTrainingArguments

    pairs = {"anchor": sentences, "positive": sentences}
    if name in ("st_mnrl", "st_matryoshka_mnrl"):
        data, loss = pairs, losses.MultipleNegativesRankingLoss(model, scale=scale)
        if name == "st_matryoshka_mnrl":
            loss = losses.MatryoshkaLoss(model, loss, matryoshka_dims=matryoshka_dims)
    elif name == "st_cmnrl":
        batch = fields["per_device_train_batch_size"]
        data, loss = pairs, losses.CachedMultipleNegativesRankingLoss(model, scale=scale, mini_batch_size=batch)
        fields = {**fields, "per_device_train_batch_size": batch * CMNRL_BATCH_FACTOR,
                  "max_steps": max(1, fields["max_steps"] // CMNRL_BATCH_FACTOR)}
    elif name == "st_ct":
        data, loss = {"text": sentences}, losses.ContrastiveTensionLossInBatchNegatives(model, scale=scale)
    elif name == "st_tsdae":
        data = {"noisy": delete_words(sentences, TSDAE_DELETION, seed), "text": sentences}
        loss = losses.DenoisingAutoEncoderLoss(model, tie_encoder_decoder=True)
    else:
        raise ValueError(f"unknown baseline {name!r}: one of {', '.join(ST_BASELINES)}")
    return SentenceTransformerTrainer(model=model, args=SentenceTransformerTrainingArguments(**fields),
                                      train_dataset=Dataset.from_dict(data), loss=loss)


def mocose_trainer(model_path: str, tokenizer, sentences: list[str], max_seq_length: int, fields: dict):
    """`MoCoSETrainer` with `MoCoSETrainingArguments(**fields)` on `sentences` tokenised to `max_seq_length`."""
    from datasets import Dataset

    from hf_mocose import MoCoSEModel
    from hf_mocose.data.corpus import tokenize_sentences
    from hf_mocose.trainer.mocose_trainer import MoCoSETrainer
    from hf_mocose.trainer.training_args import MoCoSETrainingArguments

    args = MoCoSETrainingArguments(**fields)
    model = MoCoSEModel.from_pretrained(model_path, **args.model_config_kwargs())
    tokenized = tokenize_sentences(Dataset.from_dict({"text": sentences}), tokenizer, max_seq_length)
    return MoCoSETrainer(model=model, args=args, train_dataset=tokenized, processing_class=tokenizer)


def build_trainer(name: str, cfg, model_path: str, sentences: list[str], output_dir: str, **overrides):
    """The trainer for one variant and precision (`variant_name`); returns (trainer, ema_callback or None).

    `overrides`: further `TrainingArguments` fields, e.g. `optim`, `fsdp`, `torch_compile`, or for the
    `MoCoSETrainer` variants `MoCoSETrainingArguments` ones (`encoder_dropout`, `queue_init_size`, ...).
    """
    from transformers import AutoModel, AutoTokenizer, DataCollatorWithPadding, Trainer, TrainingArguments

    from hf_mocose.launch.precision import recorded_autocast

    variant, precision = split_variant_name(name)
    # autocast, as users switch it on: a `_bf16` variant name, or `cfg.bf16` (gpu_check sets it)
    fields = {**trainer_fields(output_dir, cfg.batch_size, cfg.warmup + cfg.steps, cfg.device, cfg.seed,
                               bf16=precision == "bf16" or getattr(cfg, "bf16", False), learning_rate=3e-5,
                               logging_strategy="no"), **overrides}
    if variant == "st_mnrl":
        model = sentence_transformer(model_path, cfg.max_seq_length, "cls", cfg.device)
        return st_mnrl_trainer(model, sentences, fields, scale=20.0), None

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if variant in ("plain", "floor"):
        from datasets import Dataset

        from hf_mocose.data.corpus import tokenize_sentences

        class PlainStepTrainer(Trainer):
            frozen_copy = None  # "floor": an encoder copy run without gradient, like MoCoSE's target

            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                with recorded_autocast(next(model.children())) as autocast:  # a module inside the patched forward
                    cls = model(**inputs).last_hidden_state[:, 0]
                if self.frozen_copy is not None:  # as MoCoSE's target: no gradient, the online forward's autocast
                    with torch.no_grad(), autocast["state"].context():
                        self.frozen_copy(**inputs)
                loss = cls.float().pow(2).mean()  # trivial: the floor is the encoder's forward/backward
                return (loss, cls) if return_outputs else loss

        tokenized = tokenize_sentences(Dataset.from_dict({"text": sentences}), tokenizer, cfg.max_seq_length)
        model = AutoModel.from_pretrained(model_path, add_pooling_layer=False)
        collator = DataCollatorWithPadding(tokenizer, padding="max_length", max_length=cfg.max_seq_length)
        args = TrainingArguments(**fields)
        trainer = PlainStepTrainer(model=model, args=args, train_dataset=tokenized, data_collator=collator)
        if variant == "floor":
            frozen = AutoModel.from_pretrained(model_path, add_pooling_layer=False).to(args.device).train()
            trainer.frozen_copy = frozen.requires_grad_(False)
        return trainer, None

    method, fgsm = {"simcse": ("simcse", "off"), "mocose_previous": ("mocose", "previous"),
                    "mocose_exact": ("mocose", "exact")}[variant]
    trainer = mocose_trainer(model_path, tokenizer, sentences, cfg.max_seq_length, {
        **fields, "method": method, "fgsm_mode": fgsm, "max_seq_length": cfg.max_seq_length,
        "queue_size": cfg.queue_size, "queue_init_size": min(128, cfg.queue_size), "pad_to_max_length": True,
        "sentence_pooling": "cls", **overrides})
    return trainer, trainer.ema_callback


def time_ema(ema_callback, device: torch.device) -> list[float]:
    """Wraps `ema_callback.update` (an instance attribute, the class is untouched) to time each call."""
    times: list[float] = []
    original = ema_callback.update

    def timed(decay):
        sync_device(device)
        t0 = time.perf_counter()
        original(decay)
        sync_device(device)
        times.append(time.perf_counter() - t0)

    ema_callback.update = timed
    return times


def encoders_of(trainer) -> dict:
    """role -> the encoder modules a variant's step runs (online, and the no-grad copy where there is one)."""
    model = trainer.model
    if hasattr(model, "online_encoder"):  # MoCoSETrainer
        roles = {"online": model.online_encoder}
        if model.config.uses_target:
            roles["target"] = model.target_encoder
        return roles
    if hasattr(model, "transformers_model"):  # sentence-transformers (+ MoCoSELoss: its target)
        loss = getattr(trainer, "loss", None)
        return {"online": model[0], **({"target": loss.target_encoder[0]} if hasattr(loss, "target_encoder") else {})}
    roles = {"online": next(model.children())}  # inside forward: accelerate's autocast wraps `forward` itself
    if getattr(trainer, "frozen_copy", None) is not None:
        roles["target"] = trainer.frozen_copy
    return roles


class AutocastRecorder(TrainerCallback):
    """Records, per encoder role, the autocast dtype its forwards ran under in training steps ("off": none).

    Trainers of one process share accelerate's process-wide state; `problem(precision)` says whether each one
    really ran the precision it was built for. Add it before callbacks that evaluate in `on_step_end`."""

    def __init__(self, trainer, device: torch.device):
        self.seen: dict[str, set] = {}
        self.active = False
        self.device_type = device.type
        for role, module in encoders_of(trainer).items():
            module.register_forward_pre_hook(functools.partial(self._record, role))

    def _record(self, role, module, args):
        if self.active:
            enabled = torch.is_autocast_enabled(self.device_type)
            dtype = str(torch.get_autocast_dtype(self.device_type)).removeprefix("torch.") if enabled else "off"
            self.seen.setdefault(role, set()).add(dtype)

    def on_step_begin(self, args, state, control, **kwargs):
        self.active = True

    def on_step_end(self, args, state, control, **kwargs):
        self.active = False

    def problem(self, precision: str) -> str | None:
        """An error message when the encoders did not all run `precision` ("fp32" or "bf16"); None when they did."""
        expected = {"fp32": "off", "bf16": "bfloat16"}[precision]
        wrong = {role: sorted(dtypes) for role, dtypes in self.seen.items() if dtypes != {expected}}
        return f"autocast {wrong}, expected {expected!r} everywhere" if wrong or not self.seen else None

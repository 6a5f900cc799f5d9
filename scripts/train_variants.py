"""The trainers scripts/benchmark_train.py times, one per variant, and the sentences they train on.

See that script's docstring for what each variant is; `build_trainer(variant, ...)` returns a ready
`Trainer` whose `train()` runs `cfg.warmup + cfg.steps` optimizer steps.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from turn_taking import sync_device

VARIANTS = ("plain", "floor", "simcse", "mocose_previous", "mocose_exact", "st_mnrl")


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


def _common_args(cfg, output_dir: str) -> dict:
    return dict(
        output_dir=output_dir,
        per_device_train_batch_size=cfg.batch_size,
        max_steps=cfg.warmup + cfg.steps,
        learning_rate=3e-5,
        weight_decay=1e-6,
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        use_cpu=cfg.device == "cpu",
        bf16=getattr(cfg, "bf16", False),  # autocast, as users switch it on (scripts/gpu_check.py sets it)
        seed=cfg.seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_drop_last=True,
    )


def build_trainer(variant: str, cfg, model_path: str, sentences: list[str], output_dir: str, **overrides):
    """The trainer for one variant; returns (trainer, ema_callback or None).

    `overrides`: further `TrainingArguments` fields, e.g. `optim`, `fsdp`, `torch_compile`, or for the
    `MoCoSETrainer` variants `MoCoSETrainingArguments` ones (`encoder_dropout`, `queue_init_size`, ...).
    """
    from datasets import Dataset
    from transformers import AutoModel, AutoTokenizer, DataCollatorWithPadding, Trainer, TrainingArguments

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if variant == "st_mnrl":
        from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
        from sentence_transformers.sentence_transformer.training_args import SentenceTransformerTrainingArguments

        transformer = Transformer(model_path, max_seq_length=cfg.max_seq_length)
        hidden = transformer.auto_model.config.hidden_size
        model = SentenceTransformer(modules=[transformer, Pooling(hidden, pooling_mode="cls")], device=cfg.device)
        dataset = Dataset.from_dict({"anchor": sentences, "positive": sentences})
        args = SentenceTransformerTrainingArguments(**{**_common_args(cfg, output_dir), **overrides})
        trainer = SentenceTransformerTrainer(
            model=model, args=args, train_dataset=dataset, loss=MultipleNegativesRankingLoss(model, scale=20.0)
        )
        return trainer, None

    from hf_mocose.data.corpus import tokenize_sentences

    tokenized = tokenize_sentences(Dataset.from_dict({"text": sentences}), tokenizer, cfg.max_seq_length)
    if variant in ("plain", "floor"):

        class PlainStepTrainer(Trainer):
            frozen_copy = None  # "floor": an encoder copy run without gradient, like MoCoSE's target

            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                if self.frozen_copy is not None:
                    with torch.no_grad():
                        self.frozen_copy(**inputs)
                cls = model(**inputs).last_hidden_state[:, 0]
                loss = cls.float().pow(2).mean()  # trivial: the floor is the encoder's forward/backward
                return (loss, cls) if return_outputs else loss

        model = AutoModel.from_pretrained(model_path, add_pooling_layer=False)
        collator = DataCollatorWithPadding(tokenizer, padding="max_length", max_length=cfg.max_seq_length)
        args = TrainingArguments(**{**_common_args(cfg, output_dir), **overrides})
        trainer = PlainStepTrainer(model=model, args=args, train_dataset=tokenized, data_collator=collator)
        if variant == "floor":
            frozen = AutoModel.from_pretrained(model_path, add_pooling_layer=False).to(args.device).train()
            trainer.frozen_copy = frozen.requires_grad_(False)
        return trainer, None

    from hf_mocose import MoCoSEModel
    from hf_mocose.trainer.mocose_trainer import MoCoSETrainer
    from hf_mocose.trainer.training_args import MoCoSETrainingArguments

    method, fgsm = {"simcse": ("simcse", "off"), "mocose_previous": ("mocose", "previous"),
                    "mocose_exact": ("mocose", "exact")}[variant]
    args = MoCoSETrainingArguments(**{
        **_common_args(cfg, output_dir), "method": method, "fgsm_mode": fgsm, "max_seq_length": cfg.max_seq_length,
        "queue_size": cfg.queue_size, "queue_init_size": min(128, cfg.queue_size), "pad_to_max_length": True,
        "sentence_pooling": "cls", **overrides,
    })
    model = MoCoSEModel.from_pretrained(model_path, **args.model_config_kwargs())
    trainer = MoCoSETrainer(model=model, args=args, train_dataset=tokenized, processing_class=tokenizer)
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

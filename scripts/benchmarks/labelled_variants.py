"""benchmark_quality.py's labelled-data variants: (anchor, positive) pairs, MoCoSE's queue against batch size.

Every variant trains on `hf_mocose.data.labelled.senteval_pairs(--senteval_dir)` (SICK train entailments, MRPC
train paraphrases, STS-B train pairs scored >= 4; no sentence of STS-B dev, STS12 or SICK trial) through
`SentenceTransformerTrainer`, on Transformer + Pooling(--pooling), at its own batch size:

  labelled_mocose_b16    `MoCoSELoss` (the library defaults: queue 512, EMA target, FGSM) at batch 16
  labelled_mnrl_b16      `MultipleNegativesRankingLoss` (scale 1 / --temperature) at batch 16
  labelled_mnrl_b128     the same at batch 128
  labelled_cmnrl_b128    `CachedMultipleNegativesRankingLoss` at batch 128 in mini-batches of 16 (GradCache)

The LR schedule spans one epoch of the set at the variant's batch (or --schedule_steps). Each run also records
`peak_train_mib`: the peak resident memory of the process (the kernel's VmHWM, reset through /proc/self/clear_refs
once the model is loaded) at the end of training, less the resident memory at that reset: what the loss, its
optimizer state, activations and batches added. Only a process training one variant measures that variant alone:
run each labelled variant in its own process (one `--variants` name per command) and merge the `--json` files.
"""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerCallback

# name -> (loss, batch size, GradCache mini-batch)
LABELLED_VARIANTS = {"labelled_mocose_b16": ("mocose", 16, None), "labelled_mnrl_b16": ("mnrl", 16, None),
                     "labelled_mnrl_b128": ("mnrl", 128, None), "labelled_cmnrl_b128": ("cmnrl", 128, 16)}
TRAINED_ON = ("stsb_train", "sickr_train")  # sets the labelled data is built from: never scored with it


def _status_kib(field: str) -> int | None:
    """A `/proc/self/status` value in KiB (`VmRSS`, `VmHWM`), or None where there is no such file."""
    path = Path("/proc/self/status")
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


class PeakTrainingMemory(TrainerCallback):
    """The peak memory training added over what was resident when it was built (`reset`): CPU resident memory
    (VmHWM after a reset of it, less VmRSS then), or on a GPU torch's peak allocated bytes less those allocated then."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.base, self.peak_mib = None, None
        self.reset()

    def reset(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated() / 2**20
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS (Linux >= 4.0)
        except OSError:
            return
        rss = _status_kib("VmRSS")
        self.base = None if rss is None else rss / 1024

    def on_train_end(self, args, state, control, **kwargs):
        if self.base is None:
            return
        if self.cuda:
            import torch

            self.peak_mib = round(torch.cuda.max_memory_allocated() / 2**20 - self.base, 1)
        elif (peak := _status_kib("VmHWM")) is not None:
            self.peak_mib = round(peak / 1024 - self.base, 1)


def build_labelled(name: str, cfg, model_path: str, pairs, output_dir: str, seed: int):
    """`(trainer, model, tokenizer)` of one labelled variant; the trainer carries a `PeakTrainingMemory` callback."""
    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer import losses
    from sentence_transformers.sentence_transformer.training_args import SentenceTransformerTrainingArguments
    from transformers import set_seed

    from hf_mocose import MoCoSELoss
    from scripts.benchmarks.train_variants import sentence_transformer, trainer_fields

    kind, batch, mini_batch = LABELLED_VARIANTS[name]
    set_seed(seed)
    model = sentence_transformer(model_path, cfg.max_seq_length, cfg.pooling, cfg.device)
    memory = PeakTrainingMemory(cfg.device)  # from here: the loss, the trainer, training
    steps = cfg.labelled_schedule_steps or max(1, len(pairs) // batch)
    fields = trainer_fields(output_dir, batch, steps, cfg.device, seed, learning_rate=cfg.learning_rate,
                            logging_steps=50)
    scale = 1.0 / cfg.temperature
    if kind == "mocose":
        loss = MoCoSELoss(model, queue_size=cfg.queue_size, queue_init_size=min(128, cfg.queue_size),
                          contrastive_temperature=cfg.temperature)
        callbacks = [loss.callback]
    elif kind == "mnrl":
        loss, callbacks = losses.MultipleNegativesRankingLoss(model, scale=scale), []
    else:
        loss, callbacks = losses.CachedMultipleNegativesRankingLoss(model, scale=scale, mini_batch_size=mini_batch), []
    trainer = SentenceTransformerTrainer(model=model, args=SentenceTransformerTrainingArguments(**fields),
                                         train_dataset=pairs, loss=loss, callbacks=[*callbacks, memory])
    trainer.peak_memory = memory
    return trainer, model, model.tokenizer

"""`MoCoSETrainer`: a `Trainer` that computes the contrastive loss, feeds the queue and scores STS-B dev.

The training loop is `transformers.Trainer`'s own. This class overrides only:
  - `compute_loss`: FGSM views, forward, gathered keys, InfoNCE (one loss for every method);
  - `training_step`: after the backward, enqueue the step's keys (the loss must not see its own keys);
  - `log`: adds the method's running metrics at logging steps (no host sync in between);
  - `evaluate`: STS-B dev Spearman (`eval_stsb_spearman`) so `load_best_model_at_end` works;
  - `_save_checkpoint` / `_load_from_checkpoint`: carry FGSM's "previous" gradient so resuming is exact.
The EMA target update is a callback (`EMATargetCallback`), run after each optimizer step.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist
from datasets import Dataset
from transformers import DataCollatorWithPadding, Trainer

from .augmentation import FGSMPerturbation
from .callbacks import EMATargetCallback, max_traceable_distance
from .losses import ContrastiveLossOutput, info_nce_loss
from .modeling import MoCoSEModel, MoCoSEOutput
from .training_args import MoCoSETrainingArguments

FGSM_STATE_NAME = "fgsm_state_rank{rank}.pt"


def gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """All-gathers `(B, D)` from every process in rank order, keeping the gradient of the local part."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tensor
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(tensor), dim=0)


def stsb_dev_dataset(path: str | os.PathLike) -> Dataset:
    """STS-B dev pairs (`sentence1`, `sentence2`, `score`) as a `Dataset`, read from SentEval's `sts-dev.csv`."""
    from .evaluation.sts import read_sts_benchmark

    pairs = read_sts_benchmark(path)
    return Dataset.from_dict(
        {"sentence1": list(pairs.sentences1), "sentence2": list(pairs.sentences2), "score": [float(s) for s in pairs.scores]}
    )


class MoCoSETrainer(Trainer):
    """Trains a [`MoCoSEModel`] with [`MoCoSETrainingArguments`].

    Args:
        model: a `MoCoSEModel`.
        args: `MoCoSETrainingArguments`.
        train_dataset: tokenised sentences (`input_ids`, `attention_mask`, ...), one example per sentence.
        eval_dataset: STS pairs with `sentence1`, `sentence2`, `score`; defaults to `args.stsb_dev_file`.
        processing_class: the tokenizer (also used to encode the STS sentences).
        **kwargs: passed to `Trainer`.
    """

    def __init__(
        self,
        model: MoCoSEModel,
        args: MoCoSETrainingArguments,
        train_dataset: Dataset | None = None,
        eval_dataset: Dataset | None = None,
        processing_class=None,
        data_collator=None,
        **kwargs,
    ):
        if not isinstance(model, MoCoSEModel):
            raise TypeError(f"MoCoSETrainer trains a MoCoSEModel, got {type(model).__name__}.")
        if data_collator is None and processing_class is not None:
            data_collator = DataCollatorWithPadding(
                processing_class,
                padding="max_length" if args.pad_to_max_length else "longest",
                max_length=model.config.max_seq_length if args.pad_to_max_length else None,
            )
        if eval_dataset is None and args.stsb_dev_file and args.eval_strategy != "no":
            eval_dataset = stsb_dev_dataset(args.stsb_dev_file)
        super().__init__(
            model=model,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            data_collator=data_collator,
            **kwargs,
        )
        self.fgsm = FGSMPerturbation(args.fgsm_mode, args.fgsm_epsilon, args.fgsm_views)
        if model.config.method != "mocose" and args.fgsm_mode != "off":
            self.fgsm.mode = "off"  # FGSM is part of MoCoSE's augmentation only
        self.ema_callback = None
        if model.config.uses_target:
            self.ema_callback = EMATargetCallback(model, args.ema_decay_start, args.ema_decay_end)
            self.add_callback(self.ema_callback)
        self._pending_keys: torch.Tensor | None = None
        self._metric_sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=args.device))
        self._metric_steps = 0

    # ----------------------------------------------------------------- loss
    @property
    def global_batch_size(self) -> int:
        """Sentences per optimizer step over all processes (B in d_trace = 1/(1-eta) + K/B)."""
        args = self.args
        return args.per_device_train_batch_size * args.world_size * args.gradient_accumulation_steps

    def _contrastive_loss(self, model: MoCoSEModel, outputs: MoCoSEOutput) -> tuple[ContrastiveLossOutput, torch.Tensor]:
        """InfoNCE for one forward; returns the loss output and the gathered keys `(B_global, D)`."""
        config = model.config
        local = outputs.key.shape[0]
        rank = self.accelerator.process_index
        if config.uses_target:
            keys = self.accelerator.gather(outputs.key.detach().contiguous())  # no gradient: keys are targets
        else:
            keys = gather_with_grad(outputs.key.contiguous())  # SimCSE: both views carry gradient
        if config.in_batch_negatives:
            positive_index = torch.arange(local, device=keys.device) + rank * local
            candidates = keys
        else:
            positive_index, candidates = None, outputs.key.detach()
        queue = model.queue if config.uses_target else None
        result = info_nce_loss(
            outputs.query,
            candidates,
            config.contrastive_temperature,
            positive_index=positive_index,
            extra_negatives=queue.keys if queue is not None else None,
            extra_negative_weights=queue.valid_mask().float() if queue is not None else None,
        )
        return result, keys

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        unwrapped = self.accelerator.unwrap_model(model)
        perturbation = None
        if self.fgsm.mode == "exact":
            # Extra pass on the unwrapped module: autograd.grad reaches only the embeddings, so DDP's
            # gradient hooks never fire for it.
            clean = unwrapped(**inputs)
            clean_loss, _ = self._contrastive_loss(unwrapped, clean)
            (gradient,) = torch.autograd.grad(clean_loss.loss, clean.word_embeddings)
            perturbation = self.fgsm.step(gradient)
        elif self.fgsm.mode == "previous":
            ids = inputs["input_ids"]
            perturbation = self.fgsm.previous_perturbation(torch.Size((*ids.shape, unwrapped.config.hidden_size)))
        outputs = model(**inputs, embedding_perturbation=perturbation, perturb_target=self.fgsm.perturb_target)
        if model.training:
            self.fgsm.track(outputs.word_embeddings)
        result, keys = self._contrastive_loss(unwrapped, outputs)
        if model.training:
            self._pending_keys = keys if unwrapped.config.uses_target else None
            self._accumulate({"pos_cos": result.positive_cosine, "neg_cos": result.negative_cosine})
        return (result.loss, outputs) if return_outputs else result.loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self._pending_keys is not None:  # after backward: the loss never sees its own keys
            self.accelerator.unwrap_model(model).queue.enqueue(self._pending_keys)
            self._pending_keys = None
        return loss

    # ----------------------------------------------------------------- logging
    def _accumulate(self, values: dict[str, torch.Tensor]) -> None:
        for name, value in values.items():
            self._metric_sums[name] += value.detach()
        self._metric_steps += 1

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._metric_steps:
            for name, total in self._metric_sums.items():
                logs[name] = round(self.accelerator.reduce(total / self._metric_steps, "mean").item(), 4)
            self._metric_sums.clear()
            self._metric_steps = 0
            model = self.accelerator.unwrap_model(self.model)
            if self.ema_callback is not None and self.ema_callback.last_decay is not None:
                decay = self.ema_callback.last_decay
                logs["ema_decay"] = round(decay, 6)
                logs["d_trace"] = round(max_traceable_distance(decay, model.config.queue_size, self.global_batch_size), 4)
                logs["queue_fill"] = int(model.queue.queue_fill)
        super().log(logs, start_time)

    # ----------------------------------------------------------------- evaluation
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Scores STS pairs (default: STS-B dev): `{prefix}_stsb_spearman` and `{prefix}_stsb_pearson` (x100)."""
        from .evaluation.encoders import encode_with_model
        from .evaluation.sts import sts_correlation

        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("No STS pairs to evaluate: pass eval_dataset or set stsb_dev_file.")
        model = self.accelerator.unwrap_model(self.model)
        encode = lambda sentences: encode_with_model(  # noqa: E731
            model, self.processing_class, list(sentences), batch_size=self.args.per_device_eval_batch_size,
            max_length=model.config.max_seq_length,
        )
        scores = sts_correlation(encode(dataset["sentence1"]), encode(dataset["sentence2"]), dataset["score"])
        metrics = {
            f"{metric_key_prefix}_stsb_spearman": scores["spearman"],
            f"{metric_key_prefix}_stsb_pearson": scores["pearson"],
        }
        self.log(dict(metrics))  # log() adds "epoch" to the dict it gets
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    # ----------------------------------------------------------------- checkpoints and the Hub
    def _push_from_checkpoint(self, checkpoint_folder):
        """Resumable checkpoints go to a sub-folder chosen by `hub_strategy`, never the repo root."""
        from transformers.utils.hub import PushInProgress

        from .hub import push_training_checkpoint

        if not self.args.hub_always_push and self.push_in_progress is not None and not self.push_in_progress.is_done():
            return
        job = push_training_checkpoint(self, checkpoint_folder)
        if job is not None:
            self.push_in_progress = PushInProgress([job])

    def push_to_hub(self, *args, **kwargs):
        """No-op: the repo root belongs to the sentence-transformers export (`hub.publish_final_model`)."""
        return None

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.fgsm.mode == "previous":
            folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
            torch.save(self.fgsm.state_dict(), folder / FGSM_STATE_NAME.format(rank=self.args.process_index))

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        path = Path(resume_from_checkpoint) / FGSM_STATE_NAME.format(rank=self.args.process_index)
        if self.fgsm.mode == "previous" and path.is_file():
            self.fgsm.load_state_dict(torch.load(path, map_location=self.args.device))

"""`TrainingArguments` switches that cannot work with `MoCoSETrainer`, refused in one line before training.

Most of the Trainer's switches work with MoCoSE as they are (docs/trainer_switches.md has the table and
the test of each). `check_trainer_switches`, called once from `MoCoSETrainer.__init__`, refuses the
ones that would crash at some later step or be silently ignored:

- `neftune_noise_alpha`: NEFTune adds noise to the word embeddings to regularise instruction
  fine-tuning (SFT) of generative models. MoCoSE's perturbation of those embeddings is FGSM
  (`fgsm_mode`, `fgsm_epsilon`); a second, random one on the shared table would also reach the target.
- `label_smoothing_factor` > 0: smooths the labels of a classification or language-modelling loss;
  the InfoNCE loss has no labels, so the Trainer would ignore it without a word.
- `fp16` where the Trainer runs on the CPU: accelerate then trains in fp32, without autocast or loss
  scaling, without a word (bf16 autocast does run on the CPU).
- `max_seq_length` and `eval_max_seq_length` longer than the encoder's position limit: a tensor-size
  error at the first step or evaluation otherwise.
- `metric_for_best_model` naming a metric `evaluate()` never returns: transformers' KeyError at the
  first evaluation otherwise.
"""

from __future__ import annotations

from ..models.encoding import check_length_fits_encoder
from .sts_evaluation import STS_EVALUATOR_NAME

# What `MoCoSETrainer.evaluate` scores (trainer/sts_evaluation.py), as `{prefix}_{name}`.
STS_METRICS = (f"{STS_EVALUATOR_NAME}_spearman", f"{STS_EVALUATOR_NAME}_pearson")


def check_trainer_switches(trainer) -> None:
    """Raises a one-line `ValueError` naming the first switch of `trainer.args` that cannot work (module docstring)."""
    args = trainer.args
    config = trainer.accelerator.unwrap_model(trainer.model).config
    refuse_meaningless_switches(args)
    refuse_fp16_on_cpu(args)
    check_sequence_lengths(args, config, trainer.processing_class)
    if trainer.compute_metrics is None:  # a user's compute_metrics may add metrics we cannot name
        check_metric_for_best_model(args, trainer.eval_dataset)


def refuse_meaningless_switches(args) -> None:
    """NEFTune and label smoothing: devices of other losses, ignored by MoCoSE's."""
    if args.neftune_noise_alpha is not None:
        raise ValueError(
            f"neftune_noise_alpha={args.neftune_noise_alpha!r} (NEFTune) is noise on the word embeddings for instruction "
            "fine-tuning of generative models; MoCoSE perturbs those embeddings with FGSM instead (fgsm_mode, "
            "fgsm_epsilon). Leave neftune_noise_alpha unset."
        )
    if args.label_smoothing_factor:
        raise ValueError(
            f"label_smoothing_factor={args.label_smoothing_factor!r} smooths the labels of a classification loss; the "
            "contrastive InfoNCE loss has none, so it would do nothing. Set label_smoothing_factor to 0."
        )


def refuse_fp16_on_cpu(args) -> None:
    """accelerate ignores fp16 on the CPU (no autocast, no grad scaler): say so rather than train fp32 unasked."""
    if args.fp16 and args.device.type == "cpu":
        raise ValueError(
            "fp16=True does nothing when training on the CPU: accelerate runs fp32 there, without autocast or loss "
            "scaling. Use bf16=True for mixed precision on the CPU, or train on a GPU."
        )


def check_sequence_lengths(args, config, tokenizer) -> None:
    """The training length (the model's `max_seq_length`) and `eval_max_seq_length` fit the encoder."""
    check_length_fits_encoder("max_seq_length", config.max_seq_length, config, tokenizer, "for training")
    if args.eval_max_seq_length is not None:
        check_length_fits_encoder("eval_max_seq_length", args.eval_max_seq_length, config, tokenizer,
                                  "for evaluation")


def produced_metrics(eval_dataset) -> list[str]:
    """The metric names `MoCoSETrainer.evaluate` returns during training, as `metric_for_best_model` reads them.

    `Trainer.evaluate` prefixes each dataset of a dict of eval datasets with `eval_{name}_`.
    """
    names = list(eval_dataset) if isinstance(eval_dataset, dict) else [None]
    prefixes = ["eval" if name is None else f"eval_{name}" for name in names]
    return [f"{prefix}_{metric}" for prefix in prefixes for metric in STS_METRICS]


def check_metric_for_best_model(args, eval_dataset) -> None:
    """Refuses a `metric_for_best_model` the STS evaluation never returns, when training evaluates.

    transformers reads the metric at every evaluation during training (best checkpoint,
    `load_best_model_at_end`, `save_strategy="best"`, plateau schedulers), adding `eval_` when missing.
    """
    metric = args.metric_for_best_model
    if metric is None or str(getattr(args.eval_strategy, "value", args.eval_strategy)) == "no":
        return
    produced = produced_metrics(eval_dataset)
    if (metric if metric.startswith("eval_") else f"eval_{metric}") not in produced:
        raise ValueError(
            f"metric_for_best_model={metric!r} is never computed: MoCoSETrainer's evaluation returns "
            f"{', '.join(produced)} (Spearman and Pearson x 100 on the STS pairs; the eval_ prefix may be left out)."
        )


__all__ = ["check_trainer_switches", "produced_metrics"]

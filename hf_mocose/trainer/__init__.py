"""The `transformers.Trainer` front end: `MoCoSETrainer` and `MoCoSETrainingArguments` (TRL's trainer/config pair).

- `training_args`: `MoCoSETrainingArguments`, every field with its help, checked before any work.
- `mocose_trainer`: `MoCoSETrainer`: `compute_loss` and `log` (the step), and the `Trainer` hooks of saving,
  resuming, evaluation and the Hub (its module docstring lists them).
- `inputs`: what the trainer accepts (a model id or folder, a loaded encoder, raw text, no tokenizer).
- `checks`: what is refused before any work: a model that cannot be loaded, Trainer switches that cannot work.
- `sts_evaluation`: `Trainer.evaluate` as STS-B dev Spearman.

May import: `hf_mocose.models`, `augmentation`, `data`, `launch`, `publishing`. Never `st_loss`, evaluation or the CLI.
"""

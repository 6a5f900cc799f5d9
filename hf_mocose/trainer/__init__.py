"""The `transformers.Trainer` front end: `MoCoSETrainer` and `MoCoSETrainingArguments` (TRL's trainer/config pair).

- `training_args`: `MoCoSETrainingArguments`, every field with its help, checked before any work.
- `mocose_trainer`: `MoCoSETrainer`, which overrides only `compute_loss` (an adapter of `models.objective`), `log`
  and the checkpoint/evaluation/Hub hooks of `Trainer` (with FSDP's `SHARDED_STATE_DICT` save completed).
- `inputs`: what the trainer accepts (a model id or folder, a loaded encoder, raw text, no tokenizer).
- `checks`: what is refused before any work, in one line: a model id or folder that cannot be loaded (one Hub
  request), Trainer switches that cannot work.
- `sts_evaluation`: `Trainer.evaluate` as STS-B dev Spearman.

May import: `hf_mocose.models`, `methods`, `data`, `training`, `publishing`. Never `st_loss`, evaluation or the
command line.
"""

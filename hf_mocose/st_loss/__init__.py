"""The sentence-transformers front end: `MoCoSELoss` for `SentenceTransformerTrainer`, and what it needs there.

- `loss`: `MoCoSELoss`, an adapter of the training step `MoCoSETrainer` runs too (`models.objective`), with its
  own heads, EMA target and queue, around any `SentenceTransformer`.
- `callback`: `MoCoSELossCallback` (`callbacks=[loss.callback]`): the EMA, the loss state in checkpoints, checks.
- `checkpoint`: the loss state in the Trainer's checkpoints and its restore; `distributed`: the heads' gradients
  across processes and under `max_grad_norm`. `callback` and `checkpoint` take the loss as an argument and never
  import `loss`, which builds them.

May import: `hf_mocose.models`, `methods`, `data`, `training`, `publishing`. Never `trainer`, evaluation or the
command line.
"""

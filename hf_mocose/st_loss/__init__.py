"""The sentence-transformers front end: `MoCoSELoss` for `SentenceTransformerTrainer`, and what it needs there.

- `loss`: `MoCoSELoss`, an adapter of the training step `MoCoSETrainer` runs too (`models.objective`), with its
  own heads, EMA target and queue, around any `SentenceTransformer`.
- `callback`: `MoCoSELossCallback` (`callbacks=[loss.callback]`): the EMA, the loss state in the Trainer's
  checkpoints and its restore, checks. It takes the loss as an argument and never imports `loss`, which builds it.
- `distributed`: the heads' gradients across processes and under `max_grad_norm`.

May import: `hf_mocose.models`, `methods`, `data`, `training`, `publishing`. Never `trainer`, evaluation or the
command line.
"""

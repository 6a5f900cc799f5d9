"""The sentence-transformers front end: `MoCoSELoss` for `SentenceTransformerTrainer`, and what it needs there.

- `loss`: `MoCoSELoss`, an adapter of the training step `MoCoSETrainer` runs too (`models.objective`), with its
  own heads, EMA target and queue, around any `SentenceTransformer`.
- `callback`: `MoCoSELossCallback` (`callbacks=[loss.callback]`): the EMA, the heads' clip, the loss state saved with
  the Trainer's checkpoints and restored, the step metrics logged. It takes the loss as an argument and never
  imports `loss`, which builds it.
- `checkpoints`: the loss state in a checkpoint's `mocose_loss/` folder (where, writing, reading).
- `inputs`: what the loss accepts as training data (text columns, no labels, batches across processes).
- `distributed`: the heads' gradients across processes and under `max_grad_norm`.

May import: `hf_mocose.models`, `augmentation`, `data`, `launch`, `publishing`. Never `trainer`, evaluation or the
command line.
"""

"""The sentence-transformers front end: `MoCoSELoss` for `SentenceTransformerTrainer`, and what it needs there.

- `loss`: `MoCoSELoss`, the same queue, InfoNCE, EMA, FGSM and heads as `MoCoSETrainer`, around any `SentenceTransformer`.
- `callback`: `MoCoSELossCallback` (`callbacks=[loss.callback]`): the EMA, the loss state in checkpoints, checks.
- `checkpoint`: the loss state in the Trainer's checkpoints and its restore; `distributed`: the heads' gradients
  across processes and under `max_grad_norm`; `contract`: the protocol `callback` and `checkpoint` read the loss by.

May import: `hf_mocose.models`, `methods`, `data`, `training`, `publishing`. Never `trainer`, evaluation or the
command line.
"""

"""The model: `MoCoSEConfig` and `MoCoSEModel` (online and EMA target branches, heads, key queue) and their parts.

- `settings`: the method settings, each declared once (default, help, card label) and validated in one place.
- `configuration`: `MoCoSEConfig` (the encoder's config nested inside); `modeling`: `MoCoSEModel`, one
  `PreTrainedModel` around a transformers encoder; `encoder_init`: the encoders a model starts from.
- `branches` (`ContrastiveBranches`: every method's heads, EMA target and queue) and `objective`
  (`ContrastiveObjective`: every method's training step), both shared by the two front ends.
- `heads`, `pooling` ([CLS] / mean), `queue` (`KeyQueue`), `losses` (InfoNCE, IFCL's Twins loss), `ema` (the EMA
  target and `EMATargetCallback`), `mtd` (d_trace, its planner and `hf-mocose mtd`), `encoding` (training vs
  inference sentence lengths, sentence embeddings in length-sorted batches).

May import: `hf_mocose.augmentation`. Never the front ends, publishing, evaluation or the command line.
"""

"""The model: `MoCoSEConfig` and `MoCoSEModel` (online and EMA target branches, heads, key queue) and what they are made of.

- `settings`: the method settings, each declared once (default, help, card label) and validated in one place.
- `configuration`: `MoCoSEConfig` (the encoder's config nested inside; its method fields from `settings`).
- `branches`: `ContrastiveBranches`, the heads, EMA target and queue of every method, built and run for both front
  ends (moco's `MoCo(base_encoder)`).
- `modeling`: `MoCoSEModel`, one `PreTrainedModel` holding the branches as state around a transformers encoder.
- `encoder_init`: building and loading the encoders a model starts from.
- `objective`: `ContrastiveObjective`, the training step of every method (FGSM, the loss, the enqueue, the step
  metrics), used by both front ends.
- `heads` (pooler, projection, predictor), `pooling` ([CLS] / mean), `queue` (`KeyQueue`, the FIFO of keys),
  `losses` (InfoNCE with queue weights, IFCL's Twins loss), `ema` (the EMA target: schedule, pairs, and
  `EMATargetCallback`, its update after every optimizer step), `mtd` (the maximum traceable distance d_trace,
  its planner and `hf-mocose mtd`).
- `encoding`: training vs inference sentence lengths, and sentence embeddings in length-sorted batches.

May import: `hf_mocose.augmentation`. Never the front ends, publishing, evaluation or the command line.
"""

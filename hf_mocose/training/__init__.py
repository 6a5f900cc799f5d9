"""What both front ends (`MoCoSETrainer` and `MoCoSELoss`) share to train besides the step and the EMA (`models`):
sharding rules, checkpoints, launch checks, mixed precision.

- `sharding`: what a launch may be: what `accelerate launch` started (several processes asked for, one started:
  refused), which engines the EMA target can follow (FSDP2 yes; FSDP1, ZeRO-3 and DeepSpeed with bf16/fp16
  refused), the launch-time refusals, FSDP2's set-up, and the library notices hf-mocose's own settings set off.
- `checkpoints`: which checkpoint a run resumes from, whether a folder is whole and fits the model, and the
  `training_args.json` every saved model carries (what model cards read instead of unpickling).
- `precision`: mixed precision: the target's no-grad forward under the online forward's autocast (`MoCoSELoss`),
  and whether this CPU computes bf16 natively (`bf16: auto`, the quickstart's).

May import: `hf_mocose.models`, `hf_mocose.methods`, `hf_mocose.data`. Never the front ends, publishing,
evaluation or the command line.
"""

"""What both front ends (`MoCoSETrainer` and `MoCoSELoss`) share to train: the EMA callback, sharding rules, checkpoints.

- `callbacks`: `EMATargetCallback`, the EMA update of the target branch after every optimizer step.
- `sharding`: which engines the EMA target can follow (FSDP2 yes; FSDP1 and ZeRO-3 refused) and FSDP2's set-up.
- `checkpoints`: which checkpoint a run resumes from, whether a folder is whole and fits the model, and the
  `training_args.json` every saved model carries (what model cards read instead of unpickling).
- `precision`: mixed precision: the target's no-grad forward under the online forward's autocast (`MoCoSELoss`),
  and whether this CPU computes bf16 natively (`bf16: auto`, the quickstart's).

May import: `hf_mocose.models`, `hf_mocose.methods`, `hf_mocose.data`. Never the front ends, publishing,
evaluation or the command line.
"""

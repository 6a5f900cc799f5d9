"""What both front ends share to train besides the step and the EMA: sharding, checkpoints, mixed precision.

- `sharding`: what a launch may be (processes, which engines the EMA target can follow: FSDP2 yes; FSDP1, ZeRO-3
  and DeepSpeed with bf16/fp16 refused), FSDP2's set-up, and the notices hf-mocose's own settings set off.
- `checkpoints`: which checkpoint a run resumes from, and whether a folder is whole and fits the model.
- `preflight`: what is refused before the first step: an unwritable or foreign `output_dir`, a non-UTF-8 file.
- `precision`: the target's forward under the online forward's autocast (`MoCoSELoss`), and `bf16: auto`.

May import: `hf_mocose.models`, `methods`, `data`. Never the front ends, publishing, evaluation or the CLI.
"""

"""How a run is launched, shared by both front ends: processes and sharding, precision, checkpoints, preflight.

- `sharding`: what a launch may be (processes, which engines the EMA target can follow: FSDP2 yes; FSDP1, ZeRO-3
  and DeepSpeed with bf16/fp16 refused), FSDP2's set-up, and the notices hf-mocose's own settings set off.
- `precision`: the target's forward under the online forward's autocast (`MoCoSELoss`), and `bf16: auto`.
- `checkpoints`: which checkpoint a run resumes from, and whether a folder is whole and fits the model.
- `run_folder`: one run per `output_dir` (its lock, taken by `preflight`), and a save that cannot be written (full
  disk) said in one line, with room for a checkpoint checked before the first step.
- `stop_request`: SIGTERM, SIGUSR1 or SIGINT as a stop request every process acts on at the same step: the step's
  checkpoint, then exit status 75 (`STOPPED_EXIT_STATUS`); transformers' `enable_jit_checkpoint` refused.
- `preflight`: what is refused before the first step by every front end: what the launch's batch or the data
  rules out, an unwritable or foreign `output_dir`, a training file that is not UTF-8.

May import: `hf_mocose.models`, `augmentation`, `data`. Never the front ends, publishing, evaluation or the CLI.
"""

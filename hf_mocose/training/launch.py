"""What `accelerate launch` started, and the library notices that hf-mocose's own settings set off.

- `refuse_one_process_of_several`: `accelerate launch --num_processes 2` without `--multi_gpu` (with `--cpu`,
  or on a machine without GPUs) runs accelerate's single-process launcher: ONE process trains, and the
  model card would say "1 x CPU process". It leaves a trace: that launcher exports `MASTER_ADDR` when
  asked for several processes, but no `RANK`/`WORLD_SIZE` (which every multi-process launcher sets).
- `quiet_library_notices`: notices a user cannot act on, caused by settings hf-mocose chose on purpose.
"""

from __future__ import annotations

import os
import warnings

# Set by every launcher that starts several processes (torchrun/accelerate's multi-process launchers, MPI).
_WORLD_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
CPU_PROCESSES_HINT = ("accelerate launch --multi_gpu --num_processes N --num_machines 1 --mixed_precision no "
                      "--dynamo_backend no <script> ... --use_cpu true, or torchrun --nproc_per_node N <script> ...")


def refuse_one_process_of_several(environ=None) -> None:
    """A `ValueError` (one line) when `accelerate launch` was asked for several processes but started one."""
    env = os.environ if environ is None else environ
    launched_by_accelerate = "ACCELERATE_MIXED_PRECISION" in env and "ACCELERATE_DYNAMO_BACKEND" in env
    if launched_by_accelerate and "MASTER_ADDR" in env and not any(name in env for name in _WORLD_VARIABLES):
        raise ValueError(
            "accelerate launch started ONE process although more were asked for: without --multi_gpu (with --cpu, "
            "or on a machine without GPUs) --num_processes N runs accelerate's single-process launcher (this "
            "process has MASTER_ADDR but no RANK or WORLD_SIZE). For N CPU processes use " + CPU_PROCESSES_HINT
            + "; for one, leave out --num_processes."
        )


def quiet_library_notices(args) -> None:
    """Silences, for this process, the notices that hf-mocose's own defaults set off and that ask nothing of the user.

    - torch 2.13 deprecates DDP's `broadcast_buffers` in favour of `forward_sync_buffers`, and warns whenever
      it is passed; accelerate passes it (`DistributedDataParallelKwargs` has no `forward_sync_buffers`)
      exactly when it differs from True, i.e. with hf-mocose's `ddp_broadcast_buffers=False` (the queue
      is the same on every rank; broadcasting it at every forward would cost a copy per step).
    - without an accelerator the Trainer's default `dataloader_pin_memory=True` only makes torch warn
      that it pins nothing: it is turned off.
    """
    if args.ddp_broadcast_buffers is False:
        quiet_ddp_broadcast_buffers_notice()
    if args.dataloader_pin_memory and args.device.type == "cpu":
        args.dataloader_pin_memory = False


def quiet_ddp_broadcast_buffers_notice() -> None:
    """torch 2.13's FutureWarning for DDP's `broadcast_buffers`, which accelerate passes whenever the training
    arguments set `ddp_broadcast_buffers=False` (hf-mocose's default, and sentence-transformers')."""
    warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)

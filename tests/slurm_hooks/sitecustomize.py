"""A slowed training step for tests/test_slurm.py, in every process of a job whose PYTHONPATH holds this folder.

MOCOSE_TEST_STEP_SECONDS=S: each `Trainer.training_step` first sleeps S seconds, in the job's first run only (no
SLURM_RESTART_COUNT yet), so that a signal SLURM sends at its own pace (its time limits are checked every 30 s)
finds the run still training; the requeued run trains at full speed. Sleeping changes no number the run computes.
"""

import os
import sys
import time

SECONDS = float(os.environ.get("MOCOSE_TEST_STEP_SECONDS") or 0)


def _slow_down_once_loaded(event, args):
    # An audit hook sees every import: once transformers.trainer has its Trainer, its step is wrapped (once).
    trainer = sys.modules.get("transformers.trainer") if event == "import" else None
    if trainer is None or not hasattr(trainer, "Trainer") or hasattr(trainer.Trainer, "_slowed_by_test"):
        return
    step = trainer.Trainer.training_step

    def training_step(self, *args, **kwargs):
        time.sleep(SECONDS)
        return step(self, *args, **kwargs)

    trainer.Trainer.training_step, trainer.Trainer._slowed_by_test = training_step, True


if SECONDS and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
    sys.addaudithook(_slow_down_once_loaded)

"""`scripts/train.py`'s driver with a stop signal sent at a chosen moment, for tests/test_stop_request.py.

    python tests/stop_worker.py [train.py flags]            (or under accelerate launch)

The moment, from the environment (each unset: not sent):
    STOP_AT_STEP="RANK:STEP:SIGNAL"    the process of rank RANK signals itself as optimizer step STEP+1 begins
    STOP_IN_SAVE="FOLDER:SIGNAL[,...]" signals itself while writing the weights of the folder FOLDER (checkpoint-N, final)
    STOP_IN_EVALUATION="STEP:SIGNAL"   signals itself inside the evaluation at step STEP
"""

import os
import signal
import sys
from pathlib import Path

import transformers.modeling_utils as modeling_utils

from hf_mocose.commands.train import cli_main
from hf_mocose.launch.stop_request import StopOnRequestCallback
from hf_mocose.trainer.mocose_trainer import MoCoSETrainer


def _send(name: str) -> None:
    os.kill(os.getpid(), getattr(signal, name))


if at_step := os.environ.get("STOP_AT_STEP"):
    rank, step, name = at_step.split(":")

    def on_step_begin(self, args, state, control, **kwargs):
        if args.process_index == int(rank) and state.global_step == int(step):
            _send(name)

    StopOnRequestCallback.on_step_begin = on_step_begin

if in_save := os.environ.get("STOP_IN_SAVE"):
    signal_in = dict(entry.split(":") for entry in in_save.split(","))
    real_save = modeling_utils.safe_save_file

    def save_with_signal(tensors, filename, metadata=None):
        if name := signal_in.get(Path(filename).parent.name):
            _send(name)  # the handler runs now, in the middle of this folder's save
        return real_save(tensors, filename, metadata=metadata)

    modeling_utils.safe_save_file = save_with_signal

if in_evaluation := os.environ.get("STOP_IN_EVALUATION"):
    step, name = in_evaluation.split(":")
    real_evaluate = MoCoSETrainer.evaluate

    def evaluate_with_signal(self, *args, **kwargs):
        if self.state.global_step == int(step):
            _send(name)
        return real_evaluate(self, *args, **kwargs)

    MoCoSETrainer.evaluate = evaluate_with_signal

if __name__ == "__main__":
    sys.exit(cli_main(sys.argv[1:]))

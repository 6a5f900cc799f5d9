"""A stop request: SIGTERM, SIGUSR1 or SIGINT ends a run at an optimizer-step boundary with a checkpoint to resume from.

A time limit (SLURM), an eviction (Kubernetes, a spot instance) or a Ctrl-C sends one of these signals, to one
process or to all of them. In a training process the signal only sets a flag (`install_stop_handlers`: a second
signal during the save therefore cannot cut it short). `StopOnRequestCallback` all-reduces that flag at the end of
every optimizer step (one one-element tensor per step, on every rank, so a signal that reached one rank stops them
all at the same step) and, when one rank holds it, asks the Trainer for its periodic save of that step
(`control.should_save`: the same code, the same files: queue, EMA target, FGSM sign, RNG states, data position)
and for the end of training. Once `train()` is over, the run raises `StopRequested`, a `SystemExit` with status
`STOPPED_EXIT_STATUS` (75, sysexits' EX_TEMPFAIL): no final model, no export, no card; the main process prints one
line with the step, the checkpoint and how to resume. A request that comes after the last step is not a stop: the
run saves its final model and export and exits 0.

A training process started by a launcher (`accelerate launch`, `torchrun`) also asks the kernel for SIGTERM when
its launcher dies (`stop_with_parent`): a launcher killed outright (SIGKILL, or SIGUSR1's default action) still
leaves a saved checkpoint, and no training process runs on orphaned holding the run folder's lock.

May import: nothing of hf_mocose.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

STOPPED_EXIT_STATUS = 75  # EX_TEMPFAIL: stopped on request, resume with --resume_from_checkpoint last
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
# Set in a training process's environment by the launchers whose death should stop it: torch elastic's workers
# (accelerate launch with several processes, torchrun) and accelerate's one-process launcher.
LAUNCHER_ENVIRONMENT = ("TORCHELASTIC_RUN_ID", "ACCELERATE_DYNAMO_MODE")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
logger = logging.getLogger(__name__)

_received: list[int] = []  # the stop signals this process received, in order
_previous: dict[int, object] = {}  # signal -> the handler before install_stop_handlers
_owner: list[object] = []  # the callback that installed them, if one did (the driver's are nobody's)


class StopRequested(SystemExit):
    """Raised once a stopped run's checkpoint is saved, on every process: exits with `STOPPED_EXIT_STATUS`, so a
    script that called `train()` stops there too (no final model, no export)."""

    def __init__(self, step: int, checkpoint: str | None):
        super().__init__(STOPPED_EXIT_STATUS)
        self.step, self.checkpoint = step, checkpoint


def _record(signum, frame) -> None:
    _received.append(signum)  # nothing else: a handler runs between any two bytecodes, a save included


def install_stop_handlers(owner: object | None = None) -> bool:
    """Makes SIGTERM, SIGUSR1 and SIGINT a stop request in this process (main thread only); under a launcher, asks
    for SIGTERM when it dies. Returns whether `owner` now holds them, to give back with `restore_handlers` (False:
    the driver's are in, or not the main thread). A callback's left in by a `train()` that raised (no
    `on_train_end` came) pass to the next callback's `train()`, without that run's request."""
    if _previous and _owner and owner is not None:
        _owner[:] = [owner]
        _received.clear()
        return True
    if _previous or threading.current_thread() is not threading.main_thread():
        return False
    _owner[:] = [] if owner is None else [owner]
    _previous.update({signum: signal.signal(signum, _record) for signum in STOP_SIGNALS})
    if any(name in os.environ for name in LAUNCHER_ENVIRONMENT):
        stop_with_parent()
    return True


def restore_handlers() -> None:
    """Gives back the handlers `install_stop_handlers` replaced; forgets any request."""
    for signum, handler in _previous.items():
        signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    _previous.clear()
    _received.clear()
    _owner.clear()


def stop_with_parent() -> None:
    """Linux: SIGTERM to this process when its parent dies (`prctl(PR_SET_PDEATHSIG)`); elsewhere nothing."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def requested_signal() -> int | None:
    """The first stop signal this process received, or None."""
    return _received[0] if _received else None


def agreed_signal(device) -> int:
    """The stop signal any process of the run received (0: none): one all-reduce (max) when there are several."""
    import torch
    import torch.distributed as dist

    received = requested_signal() or 0
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return received
    flag = torch.tensor([received], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def refuse_jit_checkpoint(args) -> None:
    """Refuses transformers' `enable_jit_checkpoint` (transformers >= 5.1): it saves from whichever event follows
    SIGTERM on each process (possibly after the step's keys entered the queue, before the step counts), and the run
    then ends as if finished (final model, export, card)."""
    if getattr(args, "enable_jit_checkpoint", False):
        raise ValueError("enable_jit_checkpoint=True is refused: transformers' SIGTERM checkpoint can save a step half "
                         "done (its keys already in the queue) and then writes the final model and export of the "
                         "unfinished run. Leave it off: hf-mocose itself stops on SIGTERM, SIGUSR1 or SIGINT at a "
                         f"step boundary with a complete checkpoint (exit status {STOPPED_EXIT_STATUS}; "
                         "docs/distributed.md, 'Time limits and preemption').")


class StopOnRequestCallback(TrainerCallback):
    """Turns a stop request into the periodic save of the step every process has just finished, then the end of
    training (the module docstring). `end_run()` after `train()` raises `StopRequested` if the run stopped."""

    def __init__(self, resume_hint: str = "--resume_from_checkpoint last"):
        self.resume_hint = resume_hint
        self.stopped_at: int | None = None
        self.signal: int | None = None
        self.checkpoint: str | None = None
        self._saved = False
        self._installed = False

    def on_train_begin(self, args, state, control, **kwargs):
        self.stopped_at = self.signal = self.checkpoint = None
        self._saved = False
        self._installed = install_stop_handlers(owner=self)  # the driver's (installed at its start): kept

    def on_step_end(self, args, state, control, **kwargs):
        if 0 < state.max_steps <= state.global_step:
            return  # the last step: the run finishes, its final save and export go on (every rank skips alike)
        if signum := agreed_signal(args.device):
            self.stopped_at, self.signal = state.global_step, signum
            control.should_save = control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        if self.stopped_at is not None and state.global_step == self.stopped_at:
            self._saved = True
            self.checkpoint = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            # Nothing after this save may touch it: save_total_limit=1 would delete it at the end of training as
            # "not the best", and load_best_model_at_end would load a model that is never saved.
            state.best_model_checkpoint = None

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.stopped_at is not None:  # the loop left the epoch early: no epoch-end evaluation or second save,
            control.should_evaluate = control.should_log = False
            control.should_save = not self._saved  # save_strategy="best" let the evaluation veto the step's save

    def on_train_end(self, args, state, control, **kwargs):
        self.release()

    def release(self) -> None:
        """A script's own handlers again once `train()` is over (also when it raised)."""
        if self._installed:
            restore_handlers()
            self._installed = False

    def end_run(self, args) -> None:
        """After `train()`: on a stopped run, waits for every process, prints the line (main process) and raises
        `StopRequested`; otherwise nothing."""
        if self.stopped_at is None:
            return
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # every process has written its part of the checkpoint: all leave together
        if args.process_index == 0:
            name = signal.Signals(self.signal).name
            print(f"Stopped on request ({name}) at step {self.stopped_at}: {self.checkpoint} is complete; resume with "
                  f"{self.resume_hint} (exit status {STOPPED_EXIT_STATUS}).", flush=True)
        raise StopRequested(self.stopped_at, self.checkpoint)

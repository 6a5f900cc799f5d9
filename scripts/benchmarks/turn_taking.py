"""Round-robin turn taking between trainers that run in threads, one optimizer step per turn.

Used by benchmark_train.py (step timing), benchmark_quality.py (equal training time per variant) and
gpu_check's throughput section (`StepTimer` alone): variants that take turns step by step see the same
machine noise.
"""

from __future__ import annotations

import threading
import time

import torch
from transformers import TrainerCallback


class Baton:
    """Round-robin turn taking between the variants' training threads: exactly one runs at a time."""

    def __init__(self, names):
        self.order = list(names)
        self.events = {name: threading.Event() for name in names}
        self.lock = threading.Lock()

    def wait(self, name: str) -> None:
        self.events[name].wait()
        self.events[name].clear()

    def pass_on(self, name: str, finished: bool = False) -> None:
        with self.lock:
            if name not in self.order:
                return
            i = self.order.index(name)
            nxt = self.order[(i + 1) % len(self.order)]
            if finished:
                self.order.remove(name)
                if not self.order:
                    return
                if nxt == name:
                    return
            self.events[nxt].set()

    def start(self) -> None:
        with self.lock:
            if self.order:
                self.events[self.order[0]].set()


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TakeTurns(TrainerCallback):
    """With a `baton`: sets `ready` and waits for the first turn once set-up is done (the first `on_step_begin`),
    then hands the turn on after every step. Without one it does nothing; subclasses measure around it."""

    def __init__(self, name: str = "", baton: Baton | None = None, ready: threading.Event | None = None):
        self.name, self.baton, self.ready = name, baton, ready
        self._started = False

    def on_step_begin(self, args, state, control, **kwargs):
        if self.baton is not None and not self._started:
            self._started = True
            self.ready.set()
            self.baton.wait(self.name)

    def on_step_end(self, args, state, control, **kwargs):
        if self.baton is not None:
            finished = control.should_training_stop or state.global_step >= state.max_steps
            self.baton.pass_on(self.name, finished=finished)
            if not finished:
                self.baton.wait(self.name)


class StepTimer(TakeTurns):
    """Times on_step_begin -> on_step_end (`step_s`, the device synchronised at both ends) and the time from
    getting the turn back to the next step (`data_s`: fetching and collating the batch)."""

    def __init__(self, name: str = "", baton: Baton | None = None, ready: threading.Event | None = None,
                 device: torch.device = torch.device("cpu")):
        super().__init__(name, baton, ready)
        self.device = device
        self.step_s: list[float] = []
        self.data_s: list[float] = []
        self._t0 = self._resumed = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self._resumed is not None:
            self.data_s.append(time.perf_counter() - self._resumed)
        super().on_step_begin(args, state, control, **kwargs)
        sync_device(self.device)
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        sync_device(self.device)
        self.step_s.append(time.perf_counter() - self._t0)
        super().on_step_end(args, state, control, **kwargs)
        self._resumed = time.perf_counter()


def start_in_turn(trainer, name: str, baton: Baton, ready: threading.Event, errors: dict) -> threading.Thread:
    """Starts `trainer.train()` in its own thread and returns once its set-up is done (its `TakeTurns` set `ready`),
    so that each trainer's set-up runs alone. An error lands in `errors[name]` and hands the turn on."""

    def target():
        try:
            trainer.train()
        except BaseException as err:  # noqa: BLE001 - reported by the caller, must not block the others
            errors[name] = repr(err)
            ready.set()
            baton.pass_on(name, finished=True)

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    ready.wait()
    return thread


def run_turns(baton: Baton, threads: list[threading.Thread]) -> None:
    """Gives the first turn and waits until every trainer is done."""
    baton.start()
    for thread in threads:
        thread.join()

"""Round-robin turn taking between trainers that run in threads, one optimizer step per turn.

Used by scripts/benchmark_train.py (step timing) and scripts/benchmark_quality.py (equal training time per
variant): variants that take turns step by step see the same machine noise.
"""

from __future__ import annotations

import threading
import time

import torch


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


def make_step_timer(name: str, baton: Baton, ready: threading.Event, device: torch.device):
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Times on_step_begin -> on_step_end and hands the turn to the next variant after each step."""

        def __init__(self):
            self.step_s: list[float] = []
            self.data_s: list[float] = []
            self._t0 = None
            self._resumed = None

        def on_step_begin(self, args, state, control, **kwargs):
            if self._resumed is None:  # first step: set-up is done, wait for the first turn
                ready.set()
                baton.wait(name)
            else:
                self.data_s.append(time.perf_counter() - self._resumed)
            sync_device(device)
            self._t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            sync_device(device)
            self.step_s.append(time.perf_counter() - self._t0)
            finished = state.global_step >= state.max_steps
            baton.pass_on(name, finished=finished)
            if not finished:
                baton.wait(name)
            self._resumed = time.perf_counter()

    return StepTimer()

"""Cross-cutting training work done by callbacks: the EMA update of the target branch.

Runs once per optimizer step (after `optimizer.step()`), never inside `forward`: under gradient
accumulation a `forward`-time update would run once per micro-batch, and on stray forwards (eval).
One implementation serves both front ends: `MoCoSEModel` (for `MoCoSETrainer`) and `MoCoSELoss`
(for `SentenceTransformerTrainer`) each describe their online/target pairs with `ema_tensor_pairs`.
Under FSDP2 the pairs are collected again once the model is sharded and the EMA interpolates each
rank's local shards, with no communication (`hf_mocose.sharding`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn
from transformers import TrainerCallback

from .sharding import check_twin_layout, is_sharded, local_shards

# The reference code (xbdxwyh/mocose, class EMA) ramps eta over this many steps whatever the run length.
REFERENCE_EMA_HORIZON = 15000

EMATensorPairs = tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]


def validate_ema_decay(start: float, end: float, horizon: int | None = None,
                       names: tuple[str, str] = ("ema_decay_start", "ema_decay_end")) -> None:
    """Raises a `ValueError` naming the argument (`names`) whose decay lies outside [0, 1], or a bad horizon."""
    for name, value in zip(names, (start, end)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value!r}.")
    if horizon is not None and (isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1):
        raise ValueError(f"ema_decay_horizon must be a whole number of optimizer steps >= 1 (or None for the "
                         f"run length), got {horizon!r}.")


def ema_tensor_pairs(module_pairs: Iterable[tuple[nn.Module, nn.Module]], skip: Iterable[torch.Tensor] = ()) -> EMATensorPairs:
    """Matching tensors of online modules and their target copies, for the EMA update.

    Parameters are paired by name; floating buffers that both modules have are paired too (they
    are copied, not interpolated). Tensors in `skip` (e.g. word embeddings both branches share)
    are left out. Each pair must be laid out alike (`sharding.check_twin_layout`): both unsharded,
    or both FSDP2 `DTensor`s sharded the same way.

    Returns:
        `(online_params, target_params, online_buffers, target_buffers)`.
    """
    skipped = {id(t) for t in skip}
    online_params, target_params, online_buffers, target_buffers = [], [], [], []
    for online, target in module_pairs:
        target_named = dict(target.named_parameters())
        for name, param in online.named_parameters():
            if id(param) not in skipped:
                check_twin_layout(name, param, target_named[name])
                online_params.append(param)
                target_params.append(target_named[name])
        target_named_buffers = dict(target.named_buffers())
        for name, buffer in online.named_buffers():
            if name in target_named_buffers and buffer.is_floating_point():
                online_buffers.append(buffer)
                target_buffers.append(target_named_buffers[name])
    return online_params, target_params, online_buffers, target_buffers


def ema_decay_at(step: int, total_steps: int, start: float, end: float, horizon: int | None = None) -> float:
    r"""The cosine-ramped EMA decay :math:`\eta(t) = \eta_{end} - (\eta_{end} - \eta_{start})(\cos(\pi t/T) + 1)/2`.

    `step` t counts optimizer steps from 0; the ramp reaches `end` at t = T and stays there.
    T is `horizon` when given (the reference code's fixed 15,000 steps), else `total_steps`, the run
    length. `start == end` gives a constant decay.
    """
    length = total_steps if horizon is None else horizon
    if length <= 0:
        return end
    t = min(max(step, 0), length)
    return end - (end - start) * (math.cos(math.pi * t / length) + 1) / 2


def ema_decay_range(start: float, end: float, horizon: int | None, max_steps: int) -> tuple[float, float]:
    """Smallest and largest eta a run of `max_steps` optimizer steps applies.

    Without a horizon (or with `max_steps` not known yet, <= 0) the ramp is taken to span `start..end`;
    a horizon longer than the run stops the ramp short of `end`.
    """
    last = end if horizon is None or max_steps <= 0 else ema_decay_at(max_steps - 1, max_steps, start, end, horizon)
    return min(start, last), max(start, last)


class EMATargetCallback(TrainerCallback):
    """theta_target <- eta * theta_target + (1 - eta) * theta_online after every optimizer step.

    Parameters are interpolated with one fused `torch._foreach_lerp_` over flat tensor lists; floating
    buffers are copied. The decay follows `ema_decay_at(global_step)`. The lists are built at
    construction and again at `on_train_begin`, after `accelerator.prepare()`: FSDP2 replaces the
    parameters by `DTensor`s, whose local shards (`sharding.local_shards`) are then interpolated in
    place, each rank its own, with no communication (the target is sharded like the online branch).

    Args:
        model: what owns both branches and names their pairs with `ema_parameter_pairs()`: the
            (unwrapped) `MoCoSEModel`, or a `MoCoSELoss`.
        decay_start, decay_end: eta at the first step and at the end of the ramp.
        horizon: optimizer steps the ramp takes (None: the run's `max_steps`).
    """

    def __init__(self, model, decay_start: float = 0.75, decay_end: float = 0.95, horizon: int | None = None):
        validate_ema_decay(decay_start, decay_end, horizon)
        self.decay_start, self.decay_end, self.horizon = decay_start, decay_end, horizon
        self.bind(model)
        self.last_decay: float | None = None

    def bind(self, model) -> None:
        """(Re)binds to `model` and reads the pairs its `ema_parameter_pairs()` names, e.g. after its online model
        was replaced (`MoCoSELoss` under `model_init`)."""
        self._owner = model
        self.collect_pairs()

    def collect_pairs(self) -> None:
        """(Re)reads the owner's online/target tensor pairs, e.g. once FSDP2 has replaced the parameters."""
        online_p, target_p, online_b, target_b = self._owner.ema_parameter_pairs()
        self._online_params, self._target_params = online_p, target_p
        self._online_buffers, self._target_buffers = online_b, target_b
        self._sharded = any(is_sharded(t) for t in online_p)

    def decay_at(self, step: int, total_steps: int) -> float:
        return ema_decay_at(step, total_steps, self.decay_start, self.decay_end, self.horizon)

    @torch.no_grad()
    def update(self, decay: float) -> None:
        """One EMA step with decay `decay`."""
        # lerp_(online, w): target += w * (online - target), i.e. eta*target + (1-eta)*online for w = 1-eta.
        target, online = self._target_params, self._online_params
        if self._sharded:  # local shards, looked up at each step: FSDP2 may re-point them (e.g. on a state-dict load)
            target, online = local_shards(target), local_shards(online)
        torch._foreach_lerp_(target, online, 1.0 - decay)
        if self._target_buffers:
            torch._foreach_copy_(self._target_buffers, self._online_buffers)
        self.last_decay = decay

    def on_train_begin(self, args, state, control, **kwargs):
        self.collect_pairs()  # after accelerator.prepare(): the parameters FSDP2 put in place

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.update(self.decay_at(state.global_step, state.max_steps))

"""The EMA target: the decay schedule, the online/target tensor pairs, their local shards, and the update.

theta_target <- eta * theta_target + (1 - eta) * theta_online, with eta following `ema_decay_at(step)`.
`MoCoSEModel` and `MoCoSELoss` name their pairs with `ema_tensor_pairs`; `EMATargetCallback` applies the
update after each `optimizer.step()` (as TRL's `SyncRefModelCallback`), never inside `forward`, which runs
once per micro-batch and on evaluation too. Under FSDP2 both twins are `DTensor`s sharded alike, so each rank
interpolates its local shards (`local_shards`) with no communication (`check_twin_layout` checks the layout).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import torch
from torch import nn
from transformers import TrainerCallback

try:  # torch >= 2.4
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - older torch has no FSDP2 either
    DTensor = None


class EMATensorPairs(NamedTuple):
    """Matching tensors of both branches: `*_params` are averaged, `*_buffers` copied (the EMA leaves them
    nothing to average: floating buffers, and the embedding module under `shared_embeddings="module"`)."""

    online_params: list[torch.Tensor]
    target_params: list[torch.Tensor]
    online_buffers: list[torch.Tensor]
    target_buffers: list[torch.Tensor]


def is_sharded(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a `DTensor` (an FSDP2 parameter)."""
    return DTensor is not None and isinstance(tensor, DTensor)


def local_shards(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's local part: a `DTensor`'s local shard (the storage FSDP2 and the optimizer update,
    so in-place ops on it change the parameter), any other tensor as it is. No communication."""
    with torch.no_grad():  # to_local() then returns the local tensor itself, not an autograd view
        return [t.to_local() if is_sharded(t) else t for t in tensors]


def check_twin_layout(name: str, online: torch.Tensor, target: torch.Tensor) -> None:
    """Raises a `ValueError` naming `name` unless `online` and `target` are both unsharded, or both `DTensor`s
    with the same mesh, placements and local shape (so their local shards pair up element for element)."""
    if is_sharded(online) != is_sharded(target):
        which = "online" if is_sharded(online) else "target"
        raise ValueError(f"EMA pair {name!r}: only the {which} tensor is sharded (FSDP2). The target must be sharded "
                         "like the online branch (the same fully_shard calls on both), or neither.")
    if is_sharded(online):
        if online.device_mesh != target.device_mesh or online.placements != target.placements:
            raise ValueError(f"EMA pair {name!r} is sharded differently: online {online.placements} on "
                             f"{online.device_mesh}, target {target.placements} on {target.device_mesh}. Shard both "
                             "with the same mesh and placements.")
        if online.to_local().shape != target.to_local().shape:
            raise ValueError(f"EMA pair {name!r}: local shards of shape {tuple(online.to_local().shape)} (online) "
                             f"and {tuple(target.to_local().shape)} (target) do not pair up.")


def ema_tensor_pairs(module_pairs: Iterable[tuple[nn.Module, nn.Module]], skip: Iterable[torch.Tensor] = ()) -> EMATensorPairs:
    """`EMATensorPairs` of online modules and their target copies: parameters paired by name, floating buffers
    both have (copied, not averaged), without the tensors in `skip` (e.g. the shared word embeddings)."""
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
    return EMATensorPairs(online_params, target_params, online_buffers, target_buffers)


def ema_decay_at(step: int, total_steps: int, start: float, end: float, horizon: int | None = None) -> float:
    r"""The cosine-ramped EMA decay :math:`\eta(t) = \eta_{end} - (\eta_{end} - \eta_{start})(\cos(\pi t/T) + 1)/2`.

    `step` t counts optimizer steps from 0; the ramp reaches `end` at t = T and stays there. T is `horizon`
    when given (the reference code's fixed 15,000 steps), else `total_steps`. `start == end`: a constant decay."""
    length = total_steps if horizon is None else horizon
    if length <= 0:
        return end
    t = min(max(step, 0), length)
    return end - (end - start) * (math.cos(math.pi * t / length) + 1) / 2


def ema_decay_range(start: float, end: float, horizon: int | None, max_steps: int) -> tuple[float, float]:
    """Smallest and largest eta a run of `max_steps` optimizer steps applies (a horizon longer than the run stops
    the ramp short of `end`; without a horizon, or `max_steps` <= 0 not known yet, it spans `start..end`)."""
    last = end if horizon is None or max_steps <= 0 else ema_decay_at(max_steps - 1, max_steps, start, end, horizon)
    return min(start, last), max(start, last)


class EMATargetCallback(TrainerCallback):
    """theta_target <- eta * theta_target + (1 - eta) * theta_online after every optimizer step: one fused
    `torch._foreach_lerp_` over the parameters, buffers copied, eta = `ema_decay_at(global_step)`.

    `model` (the unwrapped `MoCoSEModel`, or a `MoCoSELoss`) names the pairs with `ema_parameter_pairs()`, read
    again at `on_train_begin`, after `accelerator.prepare()` (FSDP2 puts `DTensor`s in place). `decay_start` /
    `decay_end`: eta at the first step and at the end of the ramp of `horizon` optimizer steps (None: the run's
    `max_steps`). `pairs`: the `EMATensorPairs` last collected; `last_decay`: the last update's decay (or None)."""

    def __init__(self, model, decay_start: float = 0.75, decay_end: float = 0.95, horizon: int | None = None):
        self.decay_start, self.decay_end, self.horizon = decay_start, decay_end, horizon
        self.bind(model)
        self.last_decay: float | None = None

    def bind(self, model) -> None:
        """(Re)binds to `model` and reads the pairs its `ema_parameter_pairs()` names, e.g. after its online model
        was replaced (`MoCoSELoss` under `model_init`)."""
        self._owner = model
        self.collect_pairs()

    def collect_pairs(self) -> None:
        """(Re)reads the owner's online/target tensor pairs (`pairs`), e.g. once FSDP2 has replaced the parameters."""
        self.pairs = EMATensorPairs(*self._owner.ema_parameter_pairs())
        self._sharded = any(is_sharded(t) for t in self.pairs.online_params)

    def decay_at(self, step: int, total_steps: int) -> float:
        return ema_decay_at(step, total_steps, self.decay_start, self.decay_end, self.horizon)

    @torch.no_grad()
    def update(self, decay: float) -> None:
        """One EMA step with decay `decay`."""
        # lerp_(online, w): target += w * (online - target), i.e. eta*target + (1-eta)*online for w = 1-eta.
        online, target, sources, copies = self.pairs
        if self._sharded:  # local shards, looked up at each step: FSDP2 may re-point them (e.g. on a state-dict load)
            target, online = local_shards(target), local_shards(online)
            # DTensor has no foreach copy; the copied parameters (shared_embeddings="module") are sharded alike.
            copies, sources = local_shards(copies), local_shards(sources)
        if target:  # a method without a target (SimCSE, IFCL under MoCoSELoss) has no pairs
            torch._foreach_lerp_(target, online, 1.0 - decay)
        if copies:
            torch._foreach_copy_(copies, sources)
        self.last_decay = decay

    def on_train_begin(self, args, state, control, **kwargs):
        self.collect_pairs()  # after accelerator.prepare(): the parameters FSDP2 put in place

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.update(self.decay_at(state.global_step, state.max_steps))

"""The EMA target's arithmetic: the decay schedule, the online/target tensor pairs, and their local shards.

theta_target <- eta * theta_target + (1 - eta) * theta_online, with eta following `ema_decay_at(step)`.
`MoCoSEModel` (for `MoCoSETrainer`) and `MoCoSELoss` (for `SentenceTransformerTrainer`) each name their
pairs with `ema_tensor_pairs`; `hf_mocose.training.callbacks.EMATargetCallback` applies the update after
every optimizer step. Under FSDP2 each parameter is a `DTensor` and its twin is sharded alike, so the EMA
interpolates each rank's local shards (`local_shards`) with no communication (`check_twin_layout` refuses
a pair laid out otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

try:  # torch >= 2.4
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - older torch has no FSDP2 either
    DTensor = None

# The reference code (xbdxwyh/mocose, class EMA) ramps eta over this many steps whatever the run length.
REFERENCE_EMA_HORIZON = 15000

EMATensorPairs = tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]


def is_sharded(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a `DTensor` (an FSDP2 parameter)."""
    return DTensor is not None and isinstance(tensor, DTensor)


def local_shards(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's local part: a `DTensor`'s local shard (the storage FSDP2 and the optimizer update,
    so in-place ops on it change the parameter), any other tensor as it is. No communication."""
    with torch.no_grad():  # to_local() then returns the local tensor itself, not an autograd view
        return [t.to_local() if is_sharded(t) else t for t in tensors]


def check_twin_layout(name: str, online: torch.Tensor, target: torch.Tensor) -> None:
    """Raises a `ValueError` naming `name` unless `target` is laid out like `online`, so that their local
    shards pair up element for element: both unsharded, or both `DTensor`s on the same mesh with the same
    placements and local shape."""
    if is_sharded(online) != is_sharded(target):
        which = "online" if is_sharded(online) else "target"
        raise ValueError(
            f"EMA pair {name!r}: only the {which} tensor is sharded (FSDP2). The target must be sharded like the "
            "online branch (the same fully_shard calls on both), or neither."
        )
    if is_sharded(online):
        if online.device_mesh != target.device_mesh or online.placements != target.placements:
            raise ValueError(
                f"EMA pair {name!r} is sharded differently: online {online.placements} on {online.device_mesh}, "
                f"target {target.placements} on {target.device_mesh}. Shard both with the same mesh and placements."
            )
        if online.to_local().shape != target.to_local().shape:
            raise ValueError(f"EMA pair {name!r}: local shards of shape {tuple(online.to_local().shape)} (online) "
                             f"and {tuple(target.to_local().shape)} (target) do not pair up.")


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

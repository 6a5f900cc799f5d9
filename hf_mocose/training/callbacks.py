"""Cross-cutting training work done by callbacks: the EMA update of the target branch.

Runs once per optimizer step (after `optimizer.step()`), never inside `forward`: under gradient
accumulation a `forward`-time update would run once per micro-batch, and on stray forwards (eval).
One implementation serves both front ends: `MoCoSEModel` (for `MoCoSETrainer`) and `MoCoSELoss`
(for `SentenceTransformerTrainer`) each describe their online/target pairs with `ema_tensor_pairs`
(`hf_mocose.models.ema`, with the decay schedule).
Under FSDP2 the pairs are collected again once the model is sharded and the EMA interpolates each
rank's local shards, with no communication (`hf_mocose.training.sharding`).
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback

from ..models.ema import ema_decay_at, is_sharded, local_shards


class EMATargetCallback(TrainerCallback):
    """theta_target <- eta * theta_target + (1 - eta) * theta_online after every optimizer step.

    Parameters are interpolated with one fused `torch._foreach_lerp_` over flat tensor lists; floating
    buffers are copied. The decay follows `ema_decay_at(global_step)`. The lists are built at
    construction and again at `on_train_begin`, after `accelerator.prepare()`: FSDP2 replaces the
    parameters by `DTensor`s, whose local shards (`hf_mocose.models.ema.local_shards`) are then interpolated in
    place, each rank its own, with no communication (the target is sharded like the online branch).

    Args:
        model: what owns both branches and names their pairs with `ema_parameter_pairs()`: the
            (unwrapped) `MoCoSEModel`, or a `MoCoSELoss`.
        decay_start, decay_end: eta at the first step and at the end of the ramp.
        horizon: optimizer steps the ramp takes (None: the run's `max_steps`).
    """

    def __init__(self, model, decay_start: float = 0.75, decay_end: float = 0.95, horizon: int | None = None):
        # The schedule comes checked from the method settings (`hf_mocose.models.settings.validate_settings`).
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
        copies, sources = self._target_buffers, self._online_buffers
        if self._sharded:  # local shards, looked up at each step: FSDP2 may re-point them (e.g. on a state-dict load)
            target, online = local_shards(target), local_shards(online)
            # DTensor has no foreach copy; the copied parameters (shared_embeddings="module") are sharded alike.
            copies, sources = local_shards(copies), local_shards(sources)
        torch._foreach_lerp_(target, online, 1.0 - decay)
        if copies:
            torch._foreach_copy_(copies, sources)
        self.last_decay = decay

    def on_train_begin(self, args, state, control, **kwargs):
        self.collect_pairs()  # after accelerator.prepare(): the parameters FSDP2 put in place

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.update(self.decay_at(state.global_step, state.max_steps))

"""`MoCoSELoss` across processes and under `max_grad_norm`: the heads' gradients as `MoCoSETrainer` has them.

`MoCoSETrainer`'s DDP averages and clips heads and encoder together; `SentenceTransformerTrainer` wraps and clips
the `SentenceTransformer` alone, while `MoCoSELoss` keeps its heads. `HeadGradients` restores the same semantics:
at the end of the last micro-batch's backward (after DDP's averaging) the heads' gradients are averaged in one
all-reduce and the model's norm is read; at `on_pre_optimizer_step`, after the Trainer clipped the model alone,
every gradient is rescaled into one joint clip: g * min(1, max_grad_norm / (||(g_model, g_heads)|| + 1e-6)).
The logged `grad_norm` stays the Trainer's (model only); the joint one is `head_gradients.last_grad_norm`.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
from accelerate.state import GradientState
from torch import Tensor, nn
from torch.autograd import Variable
from torch.nn.utils import get_total_norm

from ..compat import get_world_size
from ..launch.sharding import (accelerator_sharding, launch_sharding, quiet_ddp_broadcast_buffers_notice,
                                 refuse_one_process_of_several, refuse_unsupported_sharding)

DEEPSPEED_REFUSAL = ("MoCoSELoss does not support DeepSpeed (its engine reduces and clips the gradients of the model "
                     "it wraps, not those of the heads in the loss): launch with DDP.")


def refuse_sharded_loss_launch() -> None:
    """No FSDP of any version (FSDP2's `prepare()` cannot map the optimizer state of the heads, which live in the
    loss, onto the sharded model) and no DeepSpeed; read from the accelerator, else from the launch environment
    (the loss is built before `prepare()`)."""
    from accelerate.state import AcceleratorState, is_initialized
    fsdp_version, zero_stage, _ = accelerator_sharding(AcceleratorState()) if is_initialized() else launch_sharding()
    refuse_unsupported_sharding("MoCoSELoss", fsdp_version, None, fsdp2_supported=False)
    if zero_stage is not None:
        raise ValueError(DEEPSPEED_REFUSAL)
    refuse_one_process_of_several()  # `accelerate launch --cpu --num_processes 2` starts one
    quiet_ddp_broadcast_buffers_notice()  # sentence-transformers' ddp_broadcast_buffers=False sets it off


def refuse_unsupported_launch(args) -> None:
    """One-line refusals before the first step: FSDP (`refuse_sharded_loss_launch`) and DeepSpeed (they wrap, shard
    and clip the model alone, not the heads and target the loss keeps), fp16 loss scaling under a gradient clip."""
    from accelerate.state import AcceleratorState, is_initialized
    from accelerate.utils import DistributedType
    refuse_sharded_loss_launch()
    if is_initialized() and AcceleratorState().distributed_type == DistributedType.DEEPSPEED:
        raise ValueError(DEEPSPEED_REFUSAL)
    if getattr(args, "fp16", False) and args.max_grad_norm > 0:
        raise ValueError(f"MoCoSELoss does not support fp16 with max_grad_norm={args.max_grad_norm} (its joint clip of "
                         "model and heads reads the model's gradients while they still carry the loss scale): use "
                         "bf16=True, or max_grad_norm=0.")


def broadcast_from_first_rank(*modules: nn.Module) -> None:
    """Every tensor of `modules` (parameters and buffers) set to rank 0's on every process."""
    for module in modules:
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, src=0)


def _after_backward(fn) -> None:
    """Runs `fn` after the running backward and the final callbacks queued during it: DDP queues its averaging
    after a callback queued from the loss's hook, so a second hop (callbacks may queue more) runs `fn` after it."""
    engine = Variable._execution_engine
    engine.queue_callback(lambda: engine.queue_callback(fn))


class HeadGradients:
    """The heads' gradient averaging and the joint clip (the module docstring), for one run of a `MoCoSELoss`."""

    def __init__(self):
        self.max_grad_norm = 0.0  # the Trainer's (set at `on_train_begin`); <= 0 clips nothing
        self.last_grad_norm: Tensor | None = None  # the joint pre-clip norm at the last optimizer step (0-dim)
        self.reductions = 0  # all-reduces of head gradients so far (one per optimizer step under several processes)
        self._model_norm: Tensor | None = None
        self._ran = self._finished = False  # this step: the loss ran in training; its last micro-batch's backward ended

    def watch(self, loss: Tensor, model: nn.Module, heads: nn.Module) -> None:
        """Called by the loss with its training value: the backward of `loss` ends with `_finish_backward`."""
        if loss.requires_grad:
            self._ran = True
            loss.register_hook(lambda grad: _after_backward(partial(self._finish_backward, model, heads)))

    def _finish_backward(self, model: nn.Module, heads: nn.Module) -> None:
        if not GradientState().sync_gradients:  # an earlier micro-batch of the step: gradients keep accumulating
            return
        self._finished = True
        grads = [p.grad for p in heads.parameters() if p.grad is not None]
        world = get_world_size()
        if world > 1 and grads:
            # One flat all-reduce per step (accelerate's `reduce` runs one per tensor); SUM, then divide: gloo has no AVG.
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            flat /= world
            for grad, part in zip(grads, flat.split([g.numel() for g in grads])):
                grad.copy_(part.view_as(grad))
            self.reductions += 1
        if self.max_grad_norm > 0:
            self._model_norm = get_total_norm([p.grad for p in model.parameters() if p.grad is not None])

    def clip(self, model: nn.Module, heads: nn.Module) -> None:
        """At `on_pre_optimizer_step`: turns the Trainer's clip of the model alone into a joint clip. A step of
        another loss (several datasets, each with its loss) leaves the heads without gradient: nothing to do."""
        ran, finished, self._ran, self._finished = self._ran, self._finished, False, False
        if ran and not finished:
            raise RuntimeError("MoCoSELoss ran in this optimizer step, but the backward of its last micro-batch did "
                               "not go through the value MoCoSELoss returned (another loss's batch, or a replaced "
                               "value), so its heads were neither averaged across processes nor clipped with the "
                               "model: with several losses, train with gradient_accumulation_steps 1.")
        if self.max_grad_norm <= 0 or not ran:
            return
        model_grads = [p.grad for p in model.parameters() if p.grad is not None]
        head_grads = [p.grad for p in heads.parameters() if p.grad is not None]
        model_norm = self._model_norm
        head_norm = get_total_norm(head_grads).to(model_norm.device) if head_grads else torch.zeros_like(model_norm)
        total = torch.linalg.vector_norm(torch.stack([model_norm, head_norm]))
        joint = (self.max_grad_norm / (total + 1e-6)).clamp(max=1.0)
        applied = (self.max_grad_norm / (model_norm + 1e-6)).clamp(max=1.0)  # what the Trainer's clip did
        if model_grads:
            torch._foreach_mul_(model_grads, (joint / applied).to(model_grads[0].device))
        if head_grads:
            torch._foreach_mul_(head_grads, joint.to(head_grads[0].device))
        self.last_grad_norm, self._model_norm = total, None

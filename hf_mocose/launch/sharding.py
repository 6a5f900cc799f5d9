"""What a launch may be: how many processes, which sharding, and what the EMA target can follow.

FSDP2 is supported: accelerate shards each target tensor like its online twin, so the EMA interpolates each rank's
local shards with no communication; the key queue is a plain buffer, never sharded. Refused (`configure_sharding`,
and `refuse_sharded_launch` before any model is built): FSDP1 (flat parameters), ZeRO-3 (it loads the encoder
partitioned), DeepSpeed with bf16/fp16 (it casts the frozen target too) and torch.compile + FGSM under FSDP2.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch
from torch import nn
from transformers import TrainerCallback

from ..models.ema import is_sharded

FSDP2_CONFIG = "configs/accelerate/fsdp2.yaml"
EMBED_METHOD = "embed"
ZERO_STAGE_UNKNOWN = -1  # DeepSpeed is on, but no ZeRO stage could be read from its settings
MIXED_PRECISIONS = ("bf16", "fp16", "fp8")
# Set by every launcher that starts several processes (torchrun/accelerate's multi-process launchers, MPI).
_WORLD_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
CPU_PROCESSES_HINT = ("accelerate launch --multi_gpu --num_processes N --num_machines 1 --mixed_precision no "
                      "--dynamo_backend no <script> ... --use_cpu true, or torchrun --nproc_per_node N <script> ...")


def refuse_one_process_of_several(environ=None) -> None:
    """A `ValueError` (one line) when `accelerate launch` was asked for several processes but started one."""
    env = os.environ if environ is None else environ
    launched_by_accelerate = "ACCELERATE_MIXED_PRECISION" in env and "ACCELERATE_DYNAMO_BACKEND" in env
    if launched_by_accelerate and "MASTER_ADDR" in env and not any(name in env for name in _WORLD_VARIABLES):
        raise ValueError("accelerate launch started ONE process although more were asked for: without --multi_gpu "
                         "(with --cpu, or on a machine without GPUs) --num_processes N runs accelerate's "
                         "single-process launcher (this process has MASTER_ADDR but no RANK or WORLD_SIZE). For N CPU "
                         "processes use " + CPU_PROCESSES_HINT + "; for one, leave out --num_processes.")


def quiet_library_notices(args) -> None:
    """Silences warnings hf-mocose's defaults set off: DDP's `broadcast_buffers`, torch's pin memory on CPU."""
    if args.ddp_broadcast_buffers is False:
        quiet_ddp_broadcast_buffers_notice()
    if args.dataloader_pin_memory and args.device.type == "cpu":
        args.dataloader_pin_memory = False


def quiet_ddp_broadcast_buffers_notice() -> None:
    """Silences torch's warning on DDP's deprecated `broadcast_buffers`, passed by accelerate when False (ours)."""
    warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)


def refuse_sharded_launch(args) -> None:
    """`configure_sharding`'s refusals, read from the launch environment and the arguments before the model is
    built (under ZeRO-3 building it fails obscurely), plus a DeepSpeed precision transformers would refuse late."""
    fsdp_version, zero_stage, mixed_precision = launch_sharding(args)
    _refuse(f"method={args.method!r}", args.method == "mocose", fsdp_version, zero_stage, mixed_precision,
            compiled_by(args), getattr(args, "fgsm_mode", "off"))
    half = {"fp16": "fp16"}.get(mixed_precision, "bf16")
    if zero_stage is not None and mixed_precision in MIXED_PRECISIONS and not getattr(args, half, False):
        raise ValueError(f"DeepSpeed with mixed_precision {mixed_precision} (from the accelerate or DeepSpeed config) "
                         f"needs {half}: true in the training arguments, which transformers checks against DeepSpeed's "
                         f"config: add --{half} true, or launch with --mixed_precision no.")


def configure_sharding(trainer, config) -> None:
    """`MoCoSETrainer.__init__`'s sharding set-up: refuses what the EMA cannot follow; under FSDP2 makes the target
    fp32 like the online masters (mixed precision) and adds `ShardedModelCallback`. No-op without FSDP/DeepSpeed."""
    fsdp_version, zero_stage, mixed_precision = accelerator_sharding(trainer.accelerator.state)
    _refuse(f"method={config.method!r}", config.uses_target, fsdp_version, zero_stage, mixed_precision,
            compiled_by(trainer.args), trainer.args.fgsm_mode)
    if fsdp_version == 2:
        if config.uses_target and trainer.accelerator.mixed_precision != "no":
            match_target_to_master_weights(trainer.accelerator.unwrap_model(trainer.model))
        trainer.add_callback(ShardedModelCallback())


def compiled_by(args) -> str | None:
    """What compiles the model, in the user's words: `torch_compile=True`, or the launch config's `dynamo_backend`
    (accelerate compiles the prepared model then too, whatever `torch_compile` says); None when nothing does."""
    backend = os.environ.get("ACCELERATE_DYNAMO_BACKEND", "no").lower()
    return "torch_compile=True" if getattr(args, "torch_compile", False) else (
        None if backend == "no" else f"dynamo_backend {backend!r} (the accelerate config)")


def _refuse(owner: str, uses_target: bool, fsdp_version, zero_stage, mixed_precision, compiled, fgsm_mode):
    if uses_target:
        refuse_unsupported_sharding(owner, fsdp_version, zero_stage, mixed_precision)
        if fsdp_version == 2 and compiled and fgsm_mode != "off":
            raise ValueError(f"{compiled} with fgsm_mode={fgsm_mode!r} is not supported under FSDP2 (FGSM would "
                             "look up the sharded word embeddings outside the root module's forward): set fgsm_mode "
                             "off or compile nothing (torch_compile false, dynamo_backend no) under FSDP2, or train "
                             "the compiled FGSM run with DDP (configs/accelerate/ddp.yaml).")
    if zero_stage in (3, ZERO_STAGE_UNKNOWN):  # every method: the model is built by copying whole encoder weights
        stage = "stage 3" if zero_stage == 3 else "an unreadable stage (zero_optimization.stage)"
        raise ValueError(f"hf-mocose does not support DeepSpeed ZeRO {stage}: transformers then loads the encoder "
                         "partitioned (empty tensors on every rank), and MoCoSEModel is built by copying the encoder's "
                         f"weights into its branches and heads. Shard with FSDP2 instead ({FSDP2_CONFIG}), or use ZeRO "
                         "stage 1 or 2.")


def refuse_unsupported_sharding(owner: str, fsdp_version: int | None, zero_stage: int | None,
                                mixed_precision: str = "no", *, fsdp2_supported: bool = True) -> None:
    """Refuses the sharding the EMA target cannot follow, before any step. `owner` names what refuses;
    `zero_stage` is None without DeepSpeed; `fsdp2_supported=False` for a front end without FSDP2 (`MoCoSELoss`)."""
    if fsdp_version is not None and not fsdp2_supported:
        raise ValueError(f"{owner} does not support FSDP: accelerate's FSDP2 maps the optimizer's parameters onto the "
                         "sharded model and fails on trainable weights outside it (the loss's online heads). Train "
                         "with DDP, or shard with MoCoSETrainer, which supports FSDP2 (docs/distributed.md).")
    if fsdp_version not in (None, 2):
        raise ValueError(f"{owner} does not support FSDP version {fsdp_version} (flat parameters the EMA target cannot "
                         f"follow): use FSDP2, fsdp_version: 2 ({FSDP2_CONFIG}), or DDP.")
    if zero_stage == ZERO_STAGE_UNKNOWN:
        raise ValueError(f"{owner}: the DeepSpeed config gives no ZeRO stage hf-mocose can read "
                         "(zero_optimization.stage), and ZeRO-3 is not supported: set the stage to 0, 1 or 2 "
                         f"explicitly, or shard with FSDP2 ({FSDP2_CONFIG}).")
    if zero_stage == 3:
        raise ValueError(f"{owner} does not support DeepSpeed ZeRO stage 3 (it empties the parameters the EMA target "
                         f"interpolates): shard with FSDP2 instead ({FSDP2_CONFIG}), or use DDP.")
    if zero_stage is not None and mixed_precision in MIXED_PRECISIONS:
        half = "fp16" if mixed_precision == "fp16" else "bf16"  # fp8 runs on bf16 under DeepSpeed
        raise ValueError(f"{owner} does not support DeepSpeed (ZeRO stage {zero_stage}) with mixed_precision "
                         f"{mixed_precision}: DeepSpeed casts the whole model to {half}, the EMA target included, and "
                         f"the EMA's small steps would round away. Use FSDP2 ({FSDP2_CONFIG}) or DDP "
                         f"(configs/accelerate/ddp.yaml) with {mixed_precision}, which keep the target fp32, or "
                         "DeepSpeed with mixed_precision: no.")


def accelerator_sharding(state) -> tuple[int | None, int | None, str]:
    """`(fsdp_version, zero_stage, mixed_precision)` of an `AcceleratorState` (None for what is not in use)."""
    from accelerate.utils import DistributedType
    plugin = getattr(state, "fsdp_plugin", None)
    fsdp_version = getattr(plugin, "fsdp_version", 1) if state.distributed_type == DistributedType.FSDP else None
    deepspeed = getattr(state, "deepspeed_plugin", None) if state.distributed_type == DistributedType.DEEPSPEED else None
    mixed_precision = str(getattr(state, "mixed_precision", "no"))
    if deepspeed is None:
        return fsdp_version, None, mixed_precision
    # Under DeepSpeed accelerate's state says "no" and leaves the precision to the DeepSpeed config.
    _, stated_precision = deepspeed_config_settings(getattr(deepspeed, "deepspeed_config", None) or {})
    return fsdp_version, deepspeed.zero_stage, stated_precision or mixed_precision


def deepspeed_config_settings(config) -> tuple[int, str | None]:
    """`(zero_stage, mixed_precision)` a DeepSpeed config (a JSON file path or a dict) states: stage 0 when absent,
    `ZERO_STAGE_UNKNOWN` when unreadable; "bf16"/"fp16" when its section says `enabled: true`, else None."""
    if not isinstance(config, dict):
        try:
            config = json.loads(Path(config).read_text())
        except (OSError, ValueError):
            return ZERO_STAGE_UNKNOWN, None
    stage = (config.get("zero_optimization") or {}).get("stage", 0)
    stage = int(stage) if str(stage).isdigit() else ZERO_STAGE_UNKNOWN
    return stage, next((name for name in ("bf16", "fp16") if (config.get(name) or {}).get("enabled") is True), None)


def launch_sharding(args=None) -> tuple[int | None, int | None, str]:
    """`(fsdp_version, zero_stage, mixed_precision)` that `accelerate launch` (its environment) or the training
    arguments (`fsdp`, `fsdp_config`, `deepspeed`, `bf16`/`fp16`) ask for, read before any model is built."""
    fsdp_version = zero_stage = None
    if plugin_args := getattr(args, "fsdp_plugin_args", None):  # (None without args)
        fsdp_version = int(plugin_args.get("fsdp_version", 1))
    elif os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):
        fsdp_version = int(os.environ.get("FSDP_VERSION", "1"))  # accelerate's own default
    mixed_precision = getattr(args, "mixed_precision", None) or os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if getattr(args, "bf16", False) or getattr(args, "fp16", False):
        mixed_precision = "bf16" if args.bf16 else "fp16"
    ds_config = getattr(args, "deepspeed", None) or os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    ds_config = None if ds_config == "none" else ds_config  # accelerate's word for no file
    stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
    if ds_config:  # the file's stage wins over accelerate's zero_stage, as in accelerate's DeepSpeedPlugin
        zero_stage, stated_precision = deepspeed_config_settings(ds_config)
        if mixed_precision not in MIXED_PRECISIONS and stated_precision:
            mixed_precision = stated_precision
    elif stage is not None or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true"):
        stage = stage or "2"  # accelerate's DeepSpeedPlugin default
        zero_stage = int(stage) if stage.isdigit() else ZERO_STAGE_UNKNOWN
    return fsdp_version, zero_stage, str(mixed_precision)


def match_target_to_master_weights(model: nn.Module) -> list[str]:
    """Upcasts the target's floating tensors to fp32 before `prepare` (under FSDP2 with mixed precision accelerate
    upcasts only trainable parameters; the EMA must run in fp32 on both). Returns the names it changed."""
    changed = []
    for prefix, module in zip(("target_encoder", "target_pooler", "target_projection"), model.target_modules()):
        for name, param in module.named_parameters():
            if param.is_floating_point() and param.dtype != torch.float32:
                param.data = param.data.float()
                changed.append(f"{prefix}.{name}")
    return changed


class ShardedModelCallback(TrainerCallback):
    """What a model sharded by FSDP2 needs once prepared (`on_train_begin`): `embed` (the evaluation path, which
    bypasses `forward`) registered as an FSDP forward method, so it gathers the parameters; the replicated buffers
    (the key queue) broadcast from rank 0, as DDP does at wrap time (FSDP2 syncs nothing)."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        import torch.distributed as dist
        from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method
        if not isinstance(model, FSDPModule):
            return
        if not getattr(model, "_hf_mocose_fsdp_embed", False):
            register_fsdp_forward_method(model, EMBED_METHOD)
            model._hf_mocose_fsdp_embed = True
        if dist.is_initialized() and dist.get_world_size() > 1:
            for buffer in model.buffers():
                if not is_sharded(buffer):
                    dist.broadcast(buffer, src=0)

"""Worker for tests/test_fsdp.py: MoCoSETrainer under accelerate's FSDP2 plugin, 2 CPU processes over gloo.

    torchrun --nproc_per_node 2 tests/fsdp_worker.py ENCODER OUT_DIR STS_DEV OPTIONS_JSON   (FSDP2, or DDP with "ddp")
    accelerate launch --config_file configs/accelerate/<engine>.yaml tests/fsdp_worker.py --train-script RECIPE ARGS...
        (scripts/train.py itself, with the shims; tests/test_launch_matrix.py)

TEST-ONLY SHIM (`enable_fsdp_on_cpu`): accelerate attaches its FSDP plugin only on accelerator devices;
with `use_cpu` it leaves the distributed type at MULTI_CPU and the Trainer silently trains DDP. The shim
does, for MULTI_CPU, the three assignments accelerate's own GPU branch does (distributed type FSDP, the
plugin, its mixed precision). Everything after that is the real code path: `Trainer` -> `accelerator.prepare`
-> `fsdp2_prepare_model` -> `fully_shard`, DCP / full state-dict checkpoints, `load_fsdp_model`.
`enable_deepspeed_on_cpu` does the same for a DeepSpeed launch (accelerate's DEEPSPEED branch also skips
`use_cpu`): the distributed type, DeepSpeed's communication over the gloo group, the plugin and its precision.

The global batch is 8 sentences per optimizer step whatever the number of processes. Options (JSON):
`state_dict_type`, `fgsm_mode`, `optim`, `learning_rate`, `bf16` (mixed precision), `load_bf16` (parameters
loaded in bf16, as `dtype=bfloat16` would), `ddp` (2 processes without FSDP: the unsharded reference),
`accumulation` (gradient accumulation steps; the micro-batch shrinks so the global batch stays 8),
`shared_embeddings` (the model's), `resume` (also resume from checkpoint-2 into OUT_DIR/resumed and train to
the end; the optimizer state is recorded as saved at step 2 and as loaded back), `push_repo` (end with
`trainer.push_to_hub()` to that repo at HF_ENDPOINT).
Each rank writes rank{r}.pt: losses, the full state (gathered), its own queue, the EMA checks, the layout.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from transformers import TrainerCallback

sys.path.insert(0, os.path.dirname(__file__))
from conftest import make_trainer  # noqa: E402

STEPS = 4


def enable_fsdp_on_cpu() -> None:
    """Lets accelerate use its FSDP plugin over gloo on CPU (see the module docstring). Test only."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = init


def enable_deepspeed_on_cpu() -> None:
    """Lets accelerate use its DeepSpeed plugin over gloo on CPU, as `enable_fsdp_on_cpu` does for FSDP. Test only."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def init(self, *args, deepspeed_plugin=None, **kwargs):
        original(self, *args, deepspeed_plugin=deepspeed_plugin, **kwargs)
        if deepspeed_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            from deepspeed import comm

            comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)  # on the group accelerate made
            self.distributed_type = DistributedType.DEEPSPEED
            deepspeed_plugin.set_mixed_precision(self._mixed_precision)
            deepspeed_plugin.select(_from_accelerator_state=True)
            self.deepspeed_plugins = deepspeed_plugin
            self._mixed_precision = "no"  # as accelerate does: DeepSpeed's config carries the precision
            PartialState._shared_state["distributed_type"] = DistributedType.DEEPSPEED

    AcceleratorState.__init__ = init


def load_parameters_in_bf16() -> None:
    """MoCoSEModel.from_pretrained gives bf16 parameters (buffers stay fp32), as loading with dtype=bfloat16."""
    from hf_mocose import MoCoSEModel

    load = MoCoSEModel.from_pretrained.__func__

    def from_pretrained(cls, *args, **kwargs):
        model = load(cls, *args, **kwargs)
        for param in model.parameters():
            param.data = param.data.to(torch.bfloat16)
        return model

    MoCoSEModel.from_pretrained = classmethod(from_pretrained)


class EMAProbe:
    """Wraps `EMATargetCallback.update`: counts the collectives it issues and checks that it lerps the
    local shards in place, exactly, in fp32."""

    def __init__(self, callback):
        self.callback, self.steps = callback, []
        self._update = callback.update
        callback.update = self

    def __call__(self, decay):
        from torch.distributed.tensor.debug import CommDebugMode

        from hf_mocose.models.ema import is_sharded, local_shards

        cb = self.callback
        targets, onlines = local_shards(cb.pairs.target_params), local_shards(cb.pairs.online_params)
        before = [t.detach().clone() for t in targets]
        pointers = [t.data_ptr() for t in targets]
        expected = torch._foreach_lerp(before, onlines, 1.0 - decay)
        with CommDebugMode() as comm:
            self._update(decay)
        after = local_shards(cb.pairs.target_params)
        copied = zip(local_shards(cb.pairs.target_buffers), local_shards(cb.pairs.online_buffers))
        self.steps.append({
            # copied, not lerped: buffers, and the embedding module's parameters under shared_embeddings="module"
            "copied_exact": all(torch.equal(t, o) for t, o in copied),
            "copied_sharded": sum(is_sharded(t) for t in cb.pairs.target_buffers),
            "collectives": comm.get_total_counts(),
            "all_sharded": all(is_sharded(t) for t in cb.pairs.target_params + cb.pairs.online_params),
            "in_place": [t.data_ptr() for t in after] == pointers,
            "exact": all(torch.equal(a, e) for a, e in zip(after, expected)),
            "moved": any(not torch.equal(a, b) for a, b in zip(after, before)),
            "dtypes": sorted({str(t.dtype) for t in after + onlines}),
            "local_elements": sum(t.numel() for t in after),
        })


def control_collectives() -> int:
    """What CommDebugMode counts for one all_reduce: shows that a zero count above is not blind."""
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as comm:
        dist.all_reduce(torch.ones(1))
    return comm.get_total_counts()


def full_state(model) -> dict:
    """Every tensor of the model state, whole (sharded ones all-gathered), on the CPU."""
    from hf_mocose.models.ema import is_sharded

    return {k: (v.full_tensor() if is_sharded(v) else v).detach().cpu().clone() for k, v in model.state_dict().items()}


def layout(model) -> dict:
    from torch.distributed.fsdp import FSDPModule

    from hf_mocose.models.ema import is_sharded

    params = dict(model.named_parameters())
    return {
        "fsdp_units": sorted(name or "<root>" for name, m in model.named_modules() if isinstance(m, FSDPModule)),
        "placements": sorted({str(p.placements) for p in params.values() if is_sharded(p)}),
        "unsharded": sorted(name for name, p in params.items() if not is_sharded(p)),
        "target_dtypes": sorted({str(p.dtype) for n, p in params.items() if n.startswith("target_")}),
        "param_dtype": str(model._get_fsdp_state()._mp_policy.param_dtype),
    }


class OptimizerStateProbe(TrainerCallback):
    """Keeps this rank's local optimizer state (e.g. AdamW's moments) as saved in checkpoint-`step` (`on_save`)
    and as loaded back on resume (`on_train_begin`, which the Trainer calls after loading it)."""

    def __init__(self, step: int):
        self.step, self.saved, self.loaded = step, None, None

    @staticmethod
    def local_state(optimizer) -> list[dict]:
        from hf_mocose.models.ema import local_shards

        params = [p for group in optimizer.param_groups for p in group["params"]]
        return [{k: local_shards([v])[0].detach().clone() if isinstance(v, torch.Tensor) else v
                 for k, v in optimizer.state[p].items()} for p in params]

    def on_save(self, args, state, control, optimizer=None, **kwargs):
        if state.global_step == self.step:
            self.saved = self.local_state(optimizer)

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        if state.global_step == self.step:
            self.loaded = self.local_state(optimizer)


def build(encoder, out_dir, sts_dev, world, options):
    accumulation = options.get("accumulation", 1)
    settings = dict(
        n_sentences=128, per_device_train_batch_size=8 // world // accumulation, gradient_accumulation_steps=accumulation,
        shared_embeddings=options.get("shared_embeddings", "word"), max_steps=STEPS, encoder_dropout=0.0,
        head_dropout=0.0, pad_to_max_length=True, queue_size=40, queue_init_size=4, save_strategy="steps",
        save_steps=2, optim=options.get("optim", "sgd"), learning_rate=options.get("learning_rate", 0.1), sentence_pooling="cls_dense", stsb_dev_file=sts_dev,
        fgsm_mode=options.get("fgsm_mode", "previous"), fgsm_epsilon=0.01, fgsm_epsilon_unit="embedding_rms",
        bf16=options.get("bf16", False),
    )
    if world > 1 and not options.get("ddp"):
        settings.update(fsdp=True, fsdp_config={
            "version": 2, "transformer_layer_cls_to_wrap": ["BertLayer"],
            "state_dict_type": options.get("state_dict_type", "SHARDED_STATE_DICT")})
    trainer = make_trainer(encoder, out_dir, **settings)
    rank = trainer.args.process_index
    if rank > 0:  # another queue on rank 1: training must start every rank from rank 0's
        trainer.model.queue.reset(generator=torch.Generator().manual_seed(1234))
    return trainer


def losses_of(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def main():
    if sys.argv[1] == "--train-script":
        enable_fsdp_on_cpu()
        if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
            enable_deepspeed_on_cpu()
        from hf_mocose.commands.train import cli_main

        sys.exit(cli_main(sys.argv[2:]))
    encoder, out_dir, sts_dev, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not options.get("ddp"):
        enable_fsdp_on_cpu()
    if options.get("load_bf16"):
        load_parameters_in_bf16()
    trainer = build(encoder, out_dir, sts_dev, world, options)
    probe = EMAProbe(trainer.ema_callback)
    optimizer_probe = OptimizerStateProbe(step=2)
    trainer.add_callback(optimizer_probe)
    trainer.train()
    rank = trainer.args.process_index
    result = {
        "world_size": trainer.args.world_size, "fsdp": trainer.is_fsdp_enabled, "losses": losses_of(trainer),
        "state": full_state(trainer.model), "queue": {k: v.clone() for k, v in trainer.model.queue.state_dict().items()},
        "ema": probe.steps, "control_collectives": control_collectives(),
        "layout": layout(trainer.model) if trainer.is_fsdp_enabled else None,
        "eval": trainer.evaluate()["eval_stsb_spearman"],
    }
    if options.get("push_repo"):  # every process saves <out_dir>/final; rank 0 exports and uploads
        trainer.args.hub_model_id = options["push_repo"]
        trainer.push_to_hub()
    else:
        from hf_mocose.publishing.hub import publish_final_model

        final = os.path.join(out_dir, "final")
        trainer.save_model(final)
        publish_final_model(trainer, final)  # the export, on rank 0: <out_dir>/sentence-transformers
    if options.get("resume"):
        resumed = build(encoder, os.path.join(out_dir, "resumed"), sts_dev, world, options)
        resumed_probe, resumed_optimizer = EMAProbe(resumed.ema_callback), OptimizerStateProbe(step=2)
        resumed.add_callback(resumed_optimizer)
        resumed.train(resume_from_checkpoint=os.path.join(out_dir, "checkpoint-2"))
        result["resumed"] = {"losses": losses_of(resumed), "state": full_state(resumed.model), "ema": resumed_probe.steps,
                             "optimizer_saved": optimizer_probe.saved, "optimizer_loaded": resumed_optimizer.loaded}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    print(json.dumps({"rank": rank, "losses": result["losses"]}), flush=True)


if __name__ == "__main__":
    main()

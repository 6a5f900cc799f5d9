"""hf_mocose.launch.sharding in one process: what is refused, the target's dtype, the save split, and FSDP2 on a
world of one (gloo, in this process) for the EMA's local shards. The 2-process runs are in test_fsdp.py."""

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from hf_mocose import MoCoSEModel
from hf_mocose.models.ema import check_twin_layout, local_shards
from hf_mocose.trainer.mocose_trainer import complete_sharded_save
from hf_mocose.models.ema import EMATargetCallback
from hf_mocose.launch.sharding import (
    ShardedModelCallback,
    configure_sharding,
    match_target_to_master_weights,
)

LAUNCH_ENV = ("ACCELERATE_USE_FSDP", "FSDP_VERSION", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED_ZERO_STAGE",
              "ACCELERATE_DEEPSPEED_CONFIG_FILE", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_DYNAMO_BACKEND")
DEEPSPEED = {"ACCELERATE_USE_DEEPSPEED": "true"}


@pytest.fixture
def tiny_model(tiny_encoder):
    return MoCoSEModel.from_pretrained(tiny_encoder, queue_size=8, queue_init_size=2)


def _fake_trainer(model, distributed_type, fsdp_version=None, zero_stage=None, mixed_precision="no",
                  torch_compile=False, fgsm_mode="previous"):
    deepspeed = None
    if zero_stage is not None:  # accelerate's state then says "no": the precision is in the DeepSpeed config
        deepspeed = SimpleNamespace(zero_stage=zero_stage, deepspeed_config={
            "zero_optimization": {"stage": zero_stage}, **{k: {"enabled": k == mixed_precision} for k in ("bf16", "fp16")}})
    state = SimpleNamespace(
        distributed_type=distributed_type,
        fsdp_plugin=SimpleNamespace(fsdp_version=fsdp_version) if fsdp_version else None,
        deepspeed_plugin=deepspeed,
        mixed_precision="no" if deepspeed else mixed_precision,
    )
    callbacks = []
    accelerator = SimpleNamespace(state=state, mixed_precision=mixed_precision, unwrap_model=lambda m: m)
    args = SimpleNamespace(torch_compile=torch_compile, fgsm_mode=fgsm_mode)
    return SimpleNamespace(accelerator=accelerator, model=model, args=args, add_callback=callbacks.append,
                           callbacks=callbacks)


@pytest.mark.parametrize("kind, version, stage, message", [
    ("FSDP", 1, None, "does not support FSDP version 1.*fsdp2.yaml"),
    ("DEEPSPEED", None, 3, "does not support DeepSpeed ZeRO stage 3.*FSDP2.*fsdp2.yaml"),
])
def test_what_the_ema_target_cannot_follow_is_refused(tiny_model, kind, version, stage, message):
    from accelerate.utils import DistributedType

    trainer = _fake_trainer(tiny_model, DistributedType[kind], version, stage)
    with pytest.raises(ValueError, match=message):
        configure_sharding(trainer, tiny_model.config)


@pytest.mark.parametrize("mixed_precision", ["bf16", "fp16"])
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_deepspeed_with_mixed_precision_is_refused_for_the_ema_target(tiny_model, stage, mixed_precision):
    """DeepSpeed casts the whole module, the frozen target included, to bf16/fp16: the EMA would run on half copies."""
    from accelerate.utils import DistributedType

    trainer = _fake_trainer(tiny_model, DistributedType.DEEPSPEED, zero_stage=stage, mixed_precision=mixed_precision)
    with pytest.raises(ValueError, match=f"DeepSpeed \\(ZeRO stage {stage}\\) with mixed_precision {mixed_precision}.*"
                                         "FSDP2 .*fsdp2.yaml.* or DDP .*ddp.yaml"):
        configure_sharding(trainer, tiny_model.config)


@pytest.mark.parametrize("mixed_precision", ["bf16", "fp16", "no"])
def test_the_precision_is_read_from_accelerates_deepspeed_plugin(mixed_precision):
    """Under DeepSpeed accelerate's state says mixed_precision "no" and its plugin's config holds the precision."""
    from accelerate.utils import DeepSpeedPlugin, DistributedType

    from hf_mocose.launch.sharding import accelerator_sharding

    plugin = DeepSpeedPlugin(zero_stage=2)
    plugin.set_mixed_precision(mixed_precision)  # what AcceleratorState does with the launch's precision
    state = SimpleNamespace(distributed_type=DistributedType.DEEPSPEED, deepspeed_plugin=plugin, mixed_precision="no")
    assert accelerator_sharding(state) == (None, 2, mixed_precision)


def test_compiled_fgsm_is_refused_under_fsdp2_only(tiny_model):
    """FGSM on a compiled model looks the word embeddings up before the root forward, which FSDP2 forbids."""
    from accelerate.utils import DistributedType

    compiled_fgsm = dict(torch_compile=True, fgsm_mode="previous")
    with pytest.raises(ValueError, match="torch_compile=True with fgsm_mode='previous' is not supported under FSDP2"):
        configure_sharding(_fake_trainer(tiny_model, DistributedType.FSDP, 2, **compiled_fgsm), tiny_model.config)
    configure_sharding(_fake_trainer(tiny_model, DistributedType.FSDP, 2, torch_compile=True, fgsm_mode="off"),
                       tiny_model.config)
    configure_sharding(_fake_trainer(tiny_model, DistributedType.MULTI_CPU, **compiled_fgsm), tiny_model.config)


def test_fgsm_compiled_by_the_accelerate_config_is_refused_under_fsdp2_too(tiny_model, monkeypatch):
    """accelerate compiles the model for the launch config's `dynamo_backend` whatever `torch_compile` says."""
    from accelerate.utils import DistributedType

    from hf_mocose.launch.sharding import refuse_sharded_launch

    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "INDUCTOR")
    refused = r"dynamo_backend 'inductor' \(the accelerate config\) with fgsm_mode='previous' is not supported under FSDP2"
    with pytest.raises(ValueError, match=refused):
        configure_sharding(_fake_trainer(tiny_model, DistributedType.FSDP, 2), tiny_model.config)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    with pytest.raises(ValueError, match=refused):
        refuse_sharded_launch(SimpleNamespace(method="mocose", fsdp_plugin_args=None, fgsm_mode="previous"))
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "NO")
    refuse_sharded_launch(SimpleNamespace(method="mocose", fsdp_plugin_args=None, fgsm_mode="previous"))


@pytest.mark.parametrize("kind, version, stage", [("FSDP", 2, None), ("DEEPSPEED", None, 2), ("MULTI_CPU", None, None)])
def test_fsdp2_zero2_and_ddp_are_accepted(tiny_model, kind, version, stage):
    from accelerate.utils import DistributedType

    trainer = _fake_trainer(tiny_model, DistributedType[kind], version, stage)
    configure_sharding(trainer, tiny_model.config)
    assert [type(c) for c in trainer.callbacks] == ([ShardedModelCallback] if version == 2 else [])


def test_simcse_has_no_target_and_is_refused_only_zero3(tiny_encoder, monkeypatch):
    """No EMA target: FSDP1, DeepSpeed with bf16 pass; ZeRO-3 is refused for every method (the model is built from
    whole encoder weights, which ZeRO-3 loads partitioned), in the trainer and at launch."""
    from accelerate.utils import DistributedType

    from hf_mocose.launch.sharding import refuse_sharded_launch

    model = MoCoSEModel.from_pretrained(tiny_encoder, method="simcse", queue_size=8, queue_init_size=2)
    configure_sharding(_fake_trainer(model, DistributedType.FSDP, fsdp_version=1), model.config)
    configure_sharding(_fake_trainer(model, DistributedType.DEEPSPEED, zero_stage=2, mixed_precision="bf16"), model.config)
    with pytest.raises(ValueError, match="does not support DeepSpeed ZeRO stage 3: .* loads the encoder partitioned"):
        configure_sharding(_fake_trainer(model, DistributedType.DEEPSPEED, zero_stage=3), model.config)
    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # FSDP version 1
    refuse_sharded_launch(SimpleNamespace(method="simcse", fsdp_plugin_args=None))
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    with pytest.raises(ValueError, match="does not support DeepSpeed ZeRO stage 3: .* loads the encoder partitioned"):
        refuse_sharded_launch(SimpleNamespace(method="simcse", fsdp_plugin_args=None))


def test_mixed_precision_makes_the_target_fp32_like_the_master_weights(tiny_model):
    """accelerate upcasts only trainable parameters to fp32 masters; the frozen target follows, so the EMA runs in fp32."""
    from accelerate.utils import DistributedType

    for param in tiny_model.parameters():
        param.data = param.data.to(torch.bfloat16)
    configure_sharding(_fake_trainer(tiny_model, DistributedType.FSDP, 2, mixed_precision="bf16"), tiny_model.config)
    dtypes = {name.split(".")[0]: p.dtype for name, p in tiny_model.named_parameters()}
    assert dtypes["target_encoder"] == dtypes["target_pooler"] == dtypes["target_projection"] == torch.float32
    assert dtypes["online_encoder"] == torch.bfloat16  # accelerate's own prepare() upcasts these
    assert match_target_to_master_weights(tiny_model) == []  # nothing left to change


@pytest.mark.parametrize("env, message", [
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}, None),
    ({"ACCELERATE_USE_FSDP": "true"}, "FSDP version 1"),  # accelerate's default version
    ({**DEEPSPEED, "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}, None),
    ({**DEEPSPEED, "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, "ZeRO stage 3"),
    ({**DEEPSPEED, "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2", "ACCELERATE_MIXED_PRECISION": "bf16"},
     "ZeRO stage 2\\) with mixed_precision bf16"),  # configs/accelerate/zero2.yaml as shipped
    ({**DEEPSPEED, "ACCELERATE_MIXED_PRECISION": "fp16"}, "ZeRO stage 2\\) with mixed_precision fp16"),  # default 2
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "ACCELERATE_MIXED_PRECISION": "bf16"}, None),
])
def test_launch_environment_is_read_before_the_model_is_built(monkeypatch, env, message):
    from hf_mocose.launch.sharding import refuse_sharded_launch

    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = SimpleNamespace(method="mocose", fsdp_plugin_args=None)
    if message is None:
        refuse_sharded_launch(args)
    else:
        with pytest.raises(ValueError, match=message):
            refuse_sharded_launch(args)


@pytest.mark.parametrize("config, message", [
    ({"zero_optimization": {"stage": 3}}, "ZeRO stage 3"),
    ({"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}, "ZeRO stage 2\\) with mixed_precision bf16"),
    ({"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}, None),  # follows mixed_precision: no
    ({"zero_optimization": {"stage": 1}}, None),
    ({"zero_optimization": {"stage": "three"}}, "no ZeRO stage hf-mocose can read"),
    ("not json", "no ZeRO stage hf-mocose can read"),
])
@pytest.mark.parametrize("given_as", ["accelerate_config_file", "training_argument"])
def test_the_zero_stage_of_a_deepspeed_config_file_is_read(monkeypatch, tmp_path, config, message, given_as):
    """accelerate's `deepspeed_config_file` (no `zero_stage` in the environment then) and the Trainer's `--deepspeed`."""
    import json

    from hf_mocose.launch.sharding import refuse_sharded_launch

    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "ds_config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    args = SimpleNamespace(method="mocose", fsdp_plugin_args=None, mixed_precision="no", deepspeed=None)
    if given_as == "accelerate_config_file":
        monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
        monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")  # a stale stage: the file's wins, as in accelerate
        monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(path))
    else:
        args.deepspeed = str(path)
    if message is None:
        refuse_sharded_launch(args)
    else:
        with pytest.raises(ValueError, match=message):
            refuse_sharded_launch(args)


@pytest.mark.parametrize("method", ["simcse", "ifcl"])
def test_a_deepspeed_precision_the_trainer_would_reject_is_refused_for_every_method(monkeypatch, method):
    """configs/accelerate/zero2.yaml says mixed_precision bf16; transformers' DeepSpeed set-up then requires bf16: true
    in the training arguments and otherwise stops after the model is built. No EMA target here: only that rule."""
    from hf_mocose.launch.sharding import refuse_sharded_launch

    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    with pytest.raises(ValueError, match="mixed_precision bf16 .* needs bf16: true .* add --bf16 true"):
        refuse_sharded_launch(SimpleNamespace(method=method, fsdp_plugin_args=None, bf16=False))
    refuse_sharded_launch(SimpleNamespace(method=method, fsdp_plugin_args=None, bf16=True))


def test_compiled_fgsm_under_an_fsdp2_launch_is_refused_before_the_model_is_built(monkeypatch):
    from hf_mocose.launch.sharding import refuse_sharded_launch

    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    args = SimpleNamespace(method="mocose", fsdp_plugin_args=None, torch_compile=True, fgsm_mode="exact")
    with pytest.raises(ValueError, match="torch_compile=True with fgsm_mode='exact'.*set fgsm_mode off"):
        refuse_sharded_launch(args)
    refuse_sharded_launch(SimpleNamespace(**{**vars(args), "fgsm_mode": "off"}))


def test_fsdp_training_arguments_are_read_too(tmp_path):
    from conftest import tiny_training_args

    from hf_mocose.launch.sharding import refuse_sharded_launch

    refuse_sharded_launch(tiny_training_args(tmp_path, fsdp=True, fsdp_config={"version": 2}))
    with pytest.raises(ValueError, match="FSDP version 1"):
        refuse_sharded_launch(tiny_training_args(tmp_path, fsdp=True, fsdp_config={"version": 1}))


@pytest.mark.parametrize("env, message", [
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}, "MoCoSELoss does not support FSDP.*Train with DDP, or .*"
                                                           "MoCoSETrainer"),
    ({**DEEPSPEED, "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2", "ACCELERATE_MIXED_PRECISION": "bf16"},
     "MoCoSELoss does not support DeepSpeed .* launch with DDP"),
    ({**DEEPSPEED, "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, "MoCoSELoss does not support DeepSpeed .* launch with DDP"),
])
def test_mocose_loss_refuses_an_fsdp_or_deepspeed_launch_when_built(tiny_encoder, monkeypatch, env, message):
    """accelerate's FSDP2 prepare() fails on the loss's own trainable heads, before any loss hook, and DeepSpeed
    reduces and clips only the model it wraps: refuse first, pointing to what the loss supports (DDP)."""
    import accelerate.state
    from conftest import tiny_sentence_transformer

    from hf_mocose import MoCoSELoss

    monkeypatch.setattr(accelerate.state, "is_initialized", lambda: False)  # as in a fresh `accelerate launch`
    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        MoCoSELoss(tiny_sentence_transformer(tiny_encoder))


def test_input_embeddings_are_the_online_word_embeddings(tiny_model):
    """accelerate's FSDP2 preparation calls get_input_embeddings() on every model."""
    assert tiny_model.get_input_embeddings() is tiny_model.online_encoder.embeddings.word_embeddings


def test_sharded_state_dict_saves_split_checkpoints_from_final_models(tiny_model, tiny_encoder, tmp_path):
    """SHARDED_STATE_DICT: a checkpoint gets config + tokenizer beside the DCP folder; the final model its full weights."""
    from transformers import AutoTokenizer

    from hf_mocose import MoCoSETrainingArguments

    saved = []
    plugin = SimpleNamespace(state_dict_type="StateDictType.SHARDED_STATE_DICT")
    args = MoCoSETrainingArguments(output_dir=str(tmp_path), report_to="none")
    trainer = SimpleNamespace(
        is_fsdp_enabled=True, state=SimpleNamespace(global_step=2), args=args,
        processing_class=AutoTokenizer.from_pretrained(tiny_encoder), model=tiny_model,
        accelerator=SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), unwrap_model=lambda m: m,
                                    get_state_dict=lambda m: {"gathered": torch.ones(1)}),
        _save=lambda output_dir, state_dict: saved.append((output_dir, state_dict)),
    )
    complete_sharded_save(trainer, str(tmp_path / "checkpoint-2"))
    written = {p.name for p in (tmp_path / "checkpoint-2").iterdir()}
    assert {"config.json", "tokenizer.json", "training_args.bin", "card_facts.json"} <= written
    assert saved == []
    complete_sharded_save(trainer, str(tmp_path / "final"))
    assert [d for d, _ in saved] == [str(tmp_path / "final")] and "gathered" in saved[0][1]
    plugin.state_dict_type = "StateDictType.FULL_STATE_DICT"  # Trainer.save_model saves those itself
    complete_sharded_save(trainer, str(tmp_path / "other"))
    assert len(saved) == 1 and not (tmp_path / "other").exists()


# ----------------------------------------------------------------- FSDP2 on a world of one (this process)
@pytest.fixture
def mesh(tmp_path):
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_twin_layout_is_checked(mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    sharded = distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)])
    check_twin_layout("w", sharded, distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)]))
    check_twin_layout("w", torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match="'w': only the online tensor is sharded"):
        check_twin_layout("w", sharded, torch.zeros(4, 3))
    with pytest.raises(ValueError, match="'w' is sharded differently"):
        check_twin_layout("w", sharded, distribute_tensor(torch.randn(4, 3), mesh, [Replicate()]))
    (local,) = local_shards([sharded])
    assert not local.requires_grad and local.data_ptr() == sharded._local_tensor.data_ptr()


def test_ema_callback_built_before_fully_shard_updates_the_sharded_target(mesh, tiny_model):
    """As in MoCoSETrainer: the callback is built before prepare(); on_train_begin re-reads the DTensor parameters."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.debug import CommDebugMode

    callback = EMATargetCallback(tiny_model, 0.5, 0.5)
    for layer in [*tiny_model.online_encoder.encoder.layer, *tiny_model.target_encoder.encoder.layer]:
        fully_shard(layer, mesh=mesh)
    fully_shard(tiny_model, mesh=mesh)
    callback.on_train_begin(None, None, None)
    online, target = callback.pairs.online_params, callback.pairs.target_params
    assert len(online) == len(target) > 0 and all(type(t).__name__ == "DTensor" for t in online + target)
    before = [t.to_local().clone() for t in target]
    for tensor in local_shards(online):
        tensor.zero_()
    with CommDebugMode() as comm:
        callback.update(0.5)
    assert comm.get_total_counts() == 0
    for old, new in zip(before, local_shards(target)):
        assert torch.equal(new, old * 0.5)

"""bf16 autocast on the CPU, both front ends: the EMA target's no-grad forward runs under the online forward's
autocast, the EMA target itself stays fp32 and moves by the exact fp32 lerp, and resume is exact.

(Under FSDP2's bf16 mixed precision the same holds for `MoCoSETrainer`: tests/test_fsdp.py checks the target's
dtype and every EMA step's in `test_ema_lerps_local_shards_without_communication` and
`test_full_state_dict_resume_is_exact_under_bf16_mixed_precision`.)
"""

import pytest
import torch
from conftest import make_st_trainer, make_trainer
from test_st_loss import _losses
from test_st_loss_runs import _assert_states_equal, _loss_state, _resume_setup

from hf_mocose.launch.precision import AutocastState, cpu_has_native_bf16, recorded_autocast

FRONT_ENDS = ["trainer", "st"]


# ----------------------------------------------------------------- the helpers
def test_recorded_autocast_reads_the_autocast_inside_the_forward():
    outer = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with recorded_autocast(outer[0]) as plain:
        outer(torch.ones(2, 4))
    with recorded_autocast(outer[0]) as mixed, torch.autocast("cpu", dtype=torch.bfloat16):
        outer(torch.ones(2, 4))
    assert plain["state"] == AutocastState("cpu", None)
    assert mixed["state"] == AutocastState("cpu", torch.bfloat16)
    assert not outer[0]._forward_pre_hooks  # the hook lives as long as the block


def test_autocast_state_enters_the_recorded_autocast_and_none_turns_it_off():
    linear = torch.nn.Linear(4, 4)
    with AutocastState("cpu", torch.bfloat16).context():
        assert linear(torch.ones(1, 4)).dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16), AutocastState("cpu", None).context():
        assert linear(torch.ones(1, 4)).dtype == torch.float32  # the online forward ran without: so does the target


@pytest.mark.parametrize("probes", [{"_is_avx512_bf16_supported": True}, {"_is_amx_tile_supported": True},
                                    {"_is_avx512_bf16_supported": False, "_is_amx_tile_supported": False}, {}],
                         ids=["avx512_bf16", "amx", "neither", "torch_without_probes"])
def test_cpu_has_native_bf16_asks_torchs_cpu_probes(monkeypatch, probes):
    from hf_mocose.launch import precision

    for name in precision.NATIVE_BF16_CPU_PROBES:
        monkeypatch.delattr(torch.cpu, name, raising=False)
        if name in probes:
            monkeypatch.setattr(torch.cpu, name, lambda value=probes[name]: value, raising=False)
    assert cpu_has_native_bf16() == any(probes.values())


# ----------------------------------------------------------------- training, both front ends
def _build(front_end, encoder, tmp_path, bf16, **overrides):
    """(trainer, its EMA callback, a module inside the target's forward, the target's modules)."""
    if front_end == "trainer":
        trainer = make_trainer(encoder, tmp_path, bf16=bf16, **overrides)
        return trainer, trainer.ema_callback, trainer.model.target_encoder, trainer.model.target_modules()
    trainer = make_st_trainer(encoder, tmp_path, bf16=bf16, **overrides)
    loss = trainer.loss
    return trainer, loss.callback, loss.target_encoder[0], [loss.target_encoder, loss.target_head]


class EMASpy:
    """Wraps an EMA callback's `update`: keeps, per step, the target before, the online weights and the decay,
    and the target after."""

    def __init__(self, ema):
        self.steps, update = [], ema.update

        def spied(decay):
            before = [t.detach().clone() for t in ema.pairs.target_params]
            update(decay)
            self.steps.append((before, [o.detach().clone() for o in ema.pairs.online_params], decay,
                               [t.detach().clone() for t in ema.pairs.target_params]))

        ema.update = spied


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "fp32"])
@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_the_target_forward_follows_the_online_autocast_and_the_ema_target_stays_fp32(front_end, bf16, tiny_encoder,
                                                                                      tmp_path):
    trainer, ema, target_encoder, target_modules = _build(front_end, tiny_encoder, tmp_path, bf16, max_steps=2)
    seen = []
    target_encoder.register_forward_pre_hook(
        lambda module, args: seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None))
    spy = EMASpy(ema)
    trainer.train()
    assert seen and set(seen) == {torch.bfloat16 if bf16 else None}
    assert all(torch.isfinite(torch.tensor(_losses(trainer))))
    for module in target_modules:
        assert {p.dtype for p in module.parameters()} == {torch.float32}
    assert len(spy.steps) == 2
    for before, online, decay, after in spy.steps:  # the fp32 lerp, to the last bit: nothing rounded to bf16
        assert all(t.dtype == torch.float32 for t in after)
        expected = [torch.lerp(b, o, 1.0 - decay) for b, o in zip(before, online)]
        assert all(torch.equal(a, e) for a, e in zip(after, expected))
    moves = torch.cat([(a - b).flatten() for a, b in zip(spy.steps[-1][3], spy.steps[-1][0])])
    assert moves.abs().max() > 0


def test_resume_is_exact_under_bf16_with_the_trainer(tiny_encoder, tmp_path):
    common = dict(max_steps=6, save_strategy="steps", save_steps=3, fgsm_epsilon=1e-2, bf16=True)
    full = make_trainer(tiny_encoder, tmp_path / "full", **common)
    full.train()
    resumed = make_trainer(tiny_encoder, tmp_path / "resumed", **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    assert _losses(resumed)[-3:] == pytest.approx(_losses(full)[-3:], abs=1e-5)
    for name, tensor in full.model.state_dict().items():
        assert torch.allclose(tensor, resumed.model.state_dict()[name], atol=1e-5), name


def test_resume_is_exact_under_bf16_with_mocose_loss(tiny_encoder, tmp_path):
    full = make_st_trainer(tiny_encoder, tmp_path, bf16=True, **_resume_setup())
    full.train()
    losses, state = _losses(full), _loss_state(full)
    resumed = make_st_trainer(tiny_encoder, tmp_path, bf16=True, **_resume_setup())
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert _losses(resumed)[-3:] == pytest.approx(losses[-3:], abs=1e-5)
    _assert_states_equal(_loss_state(resumed), state, atol=1e-5)


# ----------------------------------------------------------------- `bf16: auto` (the quickstart recipe)
@pytest.mark.parametrize("native, flags, expected, note", [
    (True, [], True, "bf16: auto -> bf16 autocast: this CPU computes bf16 natively"),
    (False, [], False, "bf16: auto -> fp32: this CPU has no native bf16"),
    (True, ["--bf16", "false"], False, None),
    (False, ["--bf16", "true", "--use_cpu", "true"], True, None),
    (True, ["--bf16=False"], False, None),
], ids=["native", "emulated", "user_false_wins", "user_true_wins", "user_equals_form"])
def test_auto_bf16_picks_bf16_on_a_cpu_with_native_bf16_and_the_users_flag_wins(monkeypatch, capsys, tmp_path, native,
                                                                                flags, expected, note):
    from hf_mocose.commands.train import parse_args
    from hf_mocose.launch import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"output_dir: {tmp_path}\nbf16: auto\n")
    _, args = parse_args([str(recipe), *flags])
    assert args.bf16 is expected and (args.mixed_precision == "bf16") is expected
    printed = capsys.readouterr().out
    assert (note in printed) if note else "bf16: auto" not in printed


def test_auto_bf16_from_the_command_line_and_in_the_quickstart_recipe(monkeypatch, tmp_path):
    from conftest import REPO_ROOT

    from hf_mocose.commands.train import parse_args
    from hf_mocose.launch import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert parse_args(["--output_dir", str(tmp_path), "--bf16", "auto"])[1].bf16
    assert parse_args([str(REPO_ROOT / "training_args" / "quickstart.yaml"), "--output_dir", str(tmp_path)])[1].bf16
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert not parse_args([str(REPO_ROOT / "training_args" / "quickstart.yaml"), "--output_dir", str(tmp_path)])[1].bf16


def _gpu_bf16(monkeypatch, native: bool) -> None:
    """A CUDA GPU simulated: native bf16 (Ampere and later) or only emulated (a V100, a T4), which
    `is_bf16_supported()` counts unless `including_emulation=False`."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native or including_emulation)


@pytest.mark.parametrize("native", [True, False], ids=["native", "emulated_only"])
def test_auto_bf16_on_a_cuda_gpu_is_bf16_where_it_computes_bf16_natively(monkeypatch, native):
    from hf_mocose.launch import precision

    _gpu_bf16(monkeypatch, native)
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: not native)  # the GPU decides, not the CPU
    chosen, why = precision.choose_auto_bf16(torch.device("cuda", 0))
    assert chosen is native
    assert why == ("this GPU computes bf16 natively (torch.cuda.is_bf16_supported)" if native else
                   "this GPU has no native bf16; TF32 matmuls only with --tf32 true (default: full fp32)")
    assert precision.choose_auto_bf16(torch.device("cuda"), deepspeed=True)[0] is False
    assert precision.choose_auto_bf16(torch.device("mps"))[0] is False


def test_auto_bf16_on_a_simulated_gpu_turns_bf16_on_and_says_so(monkeypatch, capsys, tmp_path):
    """The whole parse with the training device simulated as CUDA: bf16 autocast, `use_cpu` left alone."""
    import transformers
    from transformers import training_args

    from hf_mocose.commands.train import parse_args

    _gpu_bf16(monkeypatch, True)
    on_cpu = transformers.TrainingArguments.device.fget  # still run: it sets up the process state on the CPU
    monkeypatch.setattr(transformers.TrainingArguments, "device", property(lambda self: on_cpu(self) and
                                                                           torch.device("cuda", 0)))
    monkeypatch.setattr(training_args, "is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)  # so bf16 does not mean the CPU
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"output_dir: {tmp_path}\nbf16: auto\n")
    args = parse_args([str(recipe)])[1]
    assert args.bf16 and args.mixed_precision == "bf16" and not args.use_cpu and args.tf32 is None
    first = capsys.readouterr().out.strip().splitlines()[0]
    assert first == ("bf16: auto -> bf16 autocast: this GPU computes bf16 natively (torch.cuda.is_bf16_supported). "
                     "--bf16 true/false decides instead.")


def test_auto_bf16_stays_fp32_under_deepspeed(monkeypatch, capsys, tmp_path):
    """DeepSpeed would cast the EMA target to bf16 with it (and MoCoSE refuses that launch): `bf16: auto` keeps
    fp32 there, so the quickstart trains under `zero2.yaml --mixed_precision no` as the refusal advises."""
    from hf_mocose.commands import train
    from hf_mocose.commands.train import parse_args
    from hf_mocose.launch import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    # What `launch_sharding` reads from `accelerate launch --config_file configs/accelerate/zero2.yaml` (the real
    # launch needs the deepspeed package: tests/test_launch_matrix.py, `mocose-zero2-fp32`).
    monkeypatch.setattr(train, "launch_sharding", lambda args=None: (None, 2, "no"))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"output_dir: {tmp_path}\nbf16: auto\n")
    assert not parse_args([str(recipe)])[1].bf16
    assert "bf16: auto -> fp32: under DeepSpeed" in capsys.readouterr().out

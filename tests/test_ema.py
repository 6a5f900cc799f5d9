"""EMA target: schedule, update rule, once per optimizer step, never optimised (both front ends)."""

import math

import pytest
import torch
from conftest import make_st_trainer, make_trainer, tiny_sentence_transformer

from hf_mocose.models.mtd import max_traceable_distance
from hf_mocose.models.ema import ema_decay_at
from hf_mocose.models.ema import EMATargetCallback


def test_cosine_ramp_start_middle_end():
    assert ema_decay_at(0, 100, 0.75, 0.95) == pytest.approx(0.75)
    assert ema_decay_at(50, 100, 0.75, 0.95) == pytest.approx(0.85)
    assert ema_decay_at(100, 100, 0.75, 0.95) == pytest.approx(0.95)
    assert ema_decay_at(25, 100, 0.75, 0.95) == pytest.approx(0.95 - 0.2 * (math.cos(math.pi / 4) + 1) / 2)
    assert ema_decay_at(37, 100, 0.9, 0.9) == pytest.approx(0.9)  # constant


def test_max_traceable_distance():
    assert max_traceable_distance(0.95, 512, 64) == pytest.approx(20 + 8)
    assert math.isinf(max_traceable_distance(1.0, 512, 64))


def _ema_owner(front_end, tiny_encoder):
    """What names the online/target pairs for `EMATargetCallback` in each front end, and its callback."""
    from hf_mocose import MoCoSELoss, MoCoSEModel

    if front_end == "trainer":
        model = MoCoSEModel.from_pretrained(tiny_encoder, queue_size=8, queue_init_size=2)
        return model, EMATargetCallback(model, 0.9, 0.9)
    loss = MoCoSELoss(tiny_sentence_transformer(tiny_encoder), queue_size=8, queue_init_size=3)
    return loss, loss.callback


@pytest.mark.parametrize("front_end", ["trainer", "st_loss"])
def test_update_rule_and_buffers(tiny_encoder, front_end):
    owner, callback = _ema_owner(front_end, tiny_encoder)
    online_p, target_p, _, _ = owner.ema_parameter_pairs()
    assert all(torch.equal(o, t) for o, t in zip(online_p, target_p))  # the target starts as a copy
    with torch.no_grad():
        for p in online_p:
            p.add_(torch.randn_like(p))
    before = [t.clone() for t in target_p]
    callback.update(0.9)
    for online, target, old in zip(online_p, target_p, before):
        assert torch.allclose(target, 0.9 * old + 0.1 * online, atol=1e-6)
    callback.update(0.0)  # decay 0: the target becomes a copy (collapse ablation)
    assert all(torch.equal(o, t) for o, t in zip(online_p, target_p))


@pytest.mark.parametrize("front_end", ["trainer", "st_loss"])
def test_one_update_per_optimizer_step_under_accumulation(tiny_encoder, tmp_path, monkeypatch, front_end):
    if front_end == "trainer":
        trainer = make_trainer(tiny_encoder, tmp_path, gradient_accumulation_steps=3, max_steps=4)
        callback = trainer.ema_callback
    else:
        trainer = make_st_trainer(tiny_encoder, tmp_path, gradient_accumulation_steps=3, max_steps=4,
                                  loss_kwargs=dict(queue_size=60, queue_init_size=3))
        callback = trainer.loss.callback
    decays = []
    original = callback.update
    monkeypatch.setattr(callback, "update", lambda d: (decays.append(d), original(d)))
    trainer.train()
    assert decays == pytest.approx([ema_decay_at(t, 4, 0.75, 0.95) for t in range(4)])
    if front_end == "st_loss":
        assert int(trainer.loss.queue.queue_fill) == 3 + 4 * 3 * 4  # every micro-batch is enqueued
        return
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert history[-1]["ema_decay"] == pytest.approx(decays[-1], abs=1e-6)
    # d_trace uses the global batch: 4 per device x 3 accumulation steps
    assert history[-1]["d_trace"] == pytest.approx(1 / (1 - decays[-1]) + 10 / 12, abs=1e-3)


def test_target_not_optimised_and_gets_no_gradient(tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path, max_steps=2)
    model = trainer.model
    target_before = [p.clone() for m in model.target_modules() for p in m.parameters()]
    trainer.train()
    optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    targets = [p for m in model.target_modules() for p in m.parameters()]
    assert not optimised & {id(p) for p in targets}
    assert all(p.grad is None and not p.requires_grad for p in targets)
    # ... yet the target moved (by EMA)
    assert any(not torch.equal(a, b) for a, b in zip(target_before, targets))


# ----------------------------------------------------------------------------- schedule horizon
def test_horizon_fixes_the_ramp_length_whatever_the_run_length():
    # The reference code's schedule: 0.75 -> 1.0 over 15,000 steps, for runs of any length.
    for total in (1000, 15000, 15625):
        assert ema_decay_at(0, total, 0.75, 1.0, horizon=15000) == pytest.approx(0.75)
        assert ema_decay_at(7500, total, 0.75, 1.0, horizon=15000) == pytest.approx(0.875)
    assert ema_decay_at(1000, 1000, 0.75, 1.0, horizon=15000) == pytest.approx(
        1.0 - 0.25 * (math.cos(math.pi * 1000 / 15000) + 1) / 2)  # a short run never gets near 1.0
    assert ema_decay_at(15624, 15625, 0.75, 1.0, horizon=15000) == 1.0  # past the horizon eta stays at the end
    assert ema_decay_at(50, 100, 0.75, 0.95, horizon=None) == pytest.approx(0.85)  # None: the run length


@pytest.mark.parametrize("horizon", [0, -5, 2.5, True])
def test_bad_horizon_is_rejected(tmp_path, horizon):
    from conftest import tiny_training_args

    with pytest.raises(ValueError, match=f"ema_decay_horizon .*{horizon!r}"):
        tiny_training_args(tmp_path, ema_decay_horizon=horizon)


def test_trainer_applies_and_logs_the_horizon_schedule(tiny_encoder, tmp_path, monkeypatch):
    trainer = make_trainer(tiny_encoder, tmp_path, ema_decay_start=0.5, ema_decay_end=1.0, ema_decay_horizon=8,
                           max_steps=4)
    decays = []
    original = trainer.ema_callback.update
    monkeypatch.setattr(trainer.ema_callback, "update", lambda d: (decays.append(d), original(d)))
    trainer.train()
    expected = [ema_decay_at(t, 8, 0.5, 1.0) for t in range(4)]  # half the ramp: eta ends near 0.65, not 1.0
    assert decays == pytest.approx(expected)
    logged = [h for h in trainer.state.log_history if "ema_decay" in h]
    assert [h["ema_decay"] for h in logged] == pytest.approx(expected, abs=1e-6)
    assert logged[-1]["d_trace"] == pytest.approx(1 / (1 - expected[-1]) + 10 / 4, abs=1e-3)


def test_target_mtd_window_follows_the_horizon(tiny_encoder, tmp_path):
    # eta ramps 0.5 -> 1.0 over 8 steps, so a 4-step run only reaches eta(3) ~ 0.65: the target is reachable
    # (1/(1-0.65) < 7) although the ramp's end, 1.0, alone would exceed any target.
    trainer = make_trainer(tiny_encoder, tmp_path, queue_size=40, queue_init_size=40, target_mtd=7.0,
                           ema_decay_start=0.5, ema_decay_end=1.0, ema_decay_horizon=8, max_steps=4)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "d_trace" in h]
    assert len(logged) == 4
    for entry in logged:
        assert entry["d_trace"] == pytest.approx(7.0, abs=1 / 8 + 1e-3)
    with pytest.raises(ValueError, match="EMA alone gives"):  # a run as long as the ramp reaches eta = 1
        make_trainer(tiny_encoder, tmp_path, queue_size=40, queue_init_size=40, target_mtd=7.0,
                     ema_decay_start=0.5, ema_decay_end=1.0, ema_decay_horizon=8, max_steps=20)

"""EMA target: schedule, update rule, once per optimizer step, never optimised."""

import math

import pytest
import torch

from conftest import make_trainer
from hf_mocose.callbacks import EMATargetCallback, ema_decay_at
from hf_mocose.mtd import max_traceable_distance


def test_cosine_ramp_start_middle_end():
    assert ema_decay_at(0, 100, 0.75, 0.95) == pytest.approx(0.75)
    assert ema_decay_at(50, 100, 0.75, 0.95) == pytest.approx(0.85)
    assert ema_decay_at(100, 100, 0.75, 0.95) == pytest.approx(0.95)
    assert ema_decay_at(25, 100, 0.75, 0.95) == pytest.approx(0.95 - 0.2 * (math.cos(math.pi / 4) + 1) / 2)
    assert ema_decay_at(37, 100, 0.9, 0.9) == pytest.approx(0.9)  # constant


def test_max_traceable_distance():
    assert max_traceable_distance(0.95, 512, 64) == pytest.approx(20 + 8)
    assert math.isinf(max_traceable_distance(1.0, 512, 64))


def test_update_rule_and_buffers(tiny_encoder):
    from hf_mocose import MoCoSEModel

    model = MoCoSEModel.from_pretrained(tiny_encoder, queue_size=8, queue_init_size=2)
    callback = EMATargetCallback(model, 0.9, 0.9)
    online_p, target_p, _, _ = model.ema_parameter_pairs()
    with torch.no_grad():
        for p in online_p:
            p.add_(torch.randn_like(p))
    before = [t.clone() for t in target_p]
    callback.update(0.9)
    for online, target, old in zip(online_p, target_p, before):
        assert torch.allclose(target, 0.9 * old + 0.1 * online, atol=1e-6)
    callback.update(0.0)  # decay 0: the target becomes a copy (collapse ablation)
    assert all(torch.equal(o, t) for o, t in zip(online_p, target_p))


def test_one_update_per_optimizer_step_under_accumulation(tiny_encoder, tmp_path, monkeypatch):
    trainer = make_trainer(tiny_encoder, tmp_path, gradient_accumulation_steps=3, max_steps=4)
    decays = []
    original = trainer.ema_callback.update
    monkeypatch.setattr(trainer.ema_callback, "update", lambda d: (decays.append(d), original(d)))
    trainer.train()
    assert decays == pytest.approx([ema_decay_at(t, 4, 0.75, 0.95) for t in range(4)])
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

"""The step metrics both front ends log come from one place (`ContrastiveObjective.logged_metrics`), with one
definition of d_trace = 1/(1-eta) + K/B: K the queue entries in use, B the keys the training batches enqueued."""

from __future__ import annotations

import pytest
import torch
from conftest import make_st_trainer, make_trainer

from hf_mocose.data.corpus import python_docs_sentences

METRICS = {"pos_cos", "neg_cos", "key_cos", "queue_fill", "ema_decay", "d_trace"}


def _logged(trainer) -> list[dict]:
    return [entry for entry in trainer.state.log_history if "d_trace" in entry]


def test_d_trace_uses_the_batch_that_trained_not_the_one_asked_for(tiny_encoder, tmp_path):
    """6 sentences at a per-device batch of 8 train in batches of 6: B is 6 (it was 8, a batch that never existed)."""
    trainer = make_trainer(tiny_encoder, tmp_path, sentences=python_docs_sentences()[:6], max_steps=2,
                           per_device_train_batch_size=8, queue_size=6, queue_init_size=0)
    trainer.train()
    last = _logged(trainer)[-1]
    assert last["d_trace"] == pytest.approx(1 / (1 - last["ema_decay"]) + 6 / 6, abs=1e-3)


def test_both_front_ends_log_the_same_metrics_from_one_computation(tiny_encoder, tmp_path, monkeypatch):
    """Same names, same d_trace definition; each logging step computes them once (one `logged_metrics` call)."""
    from hf_mocose.models.objective import ContrastiveObjective

    calls = []
    original = ContrastiveObjective.logged_metrics

    def counting(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ContrastiveObjective, "logged_metrics", counting)
    trainer = make_trainer(tiny_encoder, tmp_path / "trainer", max_steps=2, queue_size=12, queue_init_size=0)
    trainer.train()
    st = make_st_trainer(tiny_encoder, tmp_path / "st", max_steps=2, loss_kwargs=dict(queue_size=12, queue_init_size=0))
    st.train()
    for run in (trainer, st):
        entries = _logged(run)
        assert len(entries) == 2 and all(METRICS <= entry.keys() for entry in entries)
        batch = run.args.per_device_train_batch_size * run.args.gradient_accumulation_steps
        for entry in entries:
            assert entry["d_trace"] == pytest.approx(1 / (1 - entry["ema_decay"]) + 12 / batch, abs=1e-3)
    assert len(calls) == 4  # one per logging step (2 steps x 2 runs), none besides


def test_logged_metrics_average_the_steps_since_the_last_log_and_reset(tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path, max_steps=1)
    objective = trainer.objective
    objective._accumulate({"pos_cos": torch.tensor(0.2), "neg_cos": torch.tensor(0.0), "key_cos": torch.tensor(0.5)})
    objective._accumulate({"pos_cos": torch.tensor(0.4), "neg_cos": torch.tensor(0.2), "key_cos": torch.tensor(0.5)})
    objective.keys_per_batch = 4
    logs = objective.logged_metrics(trainer.model.queue, decay=0.9, accumulation_steps=2)
    assert logs["pos_cos"] == pytest.approx(0.3) and logs["neg_cos"] == pytest.approx(0.1)
    assert logs["d_trace"] == pytest.approx(1 / (1 - 0.9) + trainer.model.queue.capacity / 8)
    assert objective.logged_metrics(trainer.model.queue, decay=0.9) == {}  # nothing since: nothing logged

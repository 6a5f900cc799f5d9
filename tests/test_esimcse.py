"""ESimCSE (Wu et al., COLING 2022) as a configuration of the shared step, and word repetition as every method's switch.

ESimCSE: the query is the sentence, the key its word-repeated copy, both online with dropout (keys with gradient,
in-batch negatives); a momentum (EMA) encoder, sharing the online heads, embeds each batch's sentences into the
queue; no predictor, no FGSM. Both front ends run it through `ContrastiveObjective.step`.
"""

import math

import numpy as np
import pytest
import torch
from conftest import make_st_trainer, make_trainer, tiny_sentence_transformer, tiny_training_args
from torch.nn import functional as F

from hf_mocose.augmentation.views import repeat_words, repeat_words_in_batch
from hf_mocose.models.settings import take_settings, validate_settings


def _undouble(row, doubled):
    """`row` with the doubled tokens at the given (original) positions collapsed again."""
    out, i = [], 0
    for position in range(len(row) - len(doubled)):
        out.append(row[i])
        i += 2 if position in doubled else 1
    return out


def test_word_repetition_draws_as_the_authors_code():
    rng = np.random.default_rng(0)
    rows = [list(range(100, 100 + n)) for n in (2, 3, 8, 20, 32, 32, 32, 32)]
    repeated = repeat_words(rows, 0.32, rng)
    for row, new in zip(rows, repeated):
        extra = len(new) - len(row)
        assert 0 <= extra <= max(0, min(10, int(0.32 * len(row))) - 1)  # randrange(min(10, int(rate * L)))
        assert new[0] == row[0] and new[-1] == row[-1] and new[1] != row[0] and new[-2] != row[-1] or len(row) < 3
        doubled = {p for p in range(len(row)) if new.count(row[p]) == 2}
        assert 0 not in doubled and len(row) - 1 not in doubled and len(doubled) == extra  # never [CLS] or [SEP]
        assert _undouble(new, doubled) == row
    assert repeated[0] == rows[0]  # int(0.32 * 2) == 0: nothing repeated
    assert any(len(n) > len(r) for r, n in zip(rows, repeated))
    assert repeat_words(rows, 0.0, rng) == rows


def test_word_repetition_on_a_padded_batch_keeps_the_pads_out():
    ids = torch.tensor([[101, 5, 6, 7, 8, 9, 10, 11, 12, 102], [101, 5, 6, 102, 0, 0, 0, 0, 0, 0]])
    mask = (ids != 0).long()
    out = repeat_words_in_batch({"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)},
                                0.5, np.random.default_rng(3), pad_id=0)
    lengths = out["attention_mask"].sum(1).tolist()
    assert lengths[0] >= 10 and lengths[1] >= 4 and out["input_ids"].shape[1] == max(lengths)
    assert out["token_type_ids"].eq(0).all() and out["input_ids"][0, -1 if lengths[0] == max(lengths) else 0] != 0


def test_settings_resolve_the_repetition_rate_by_method():
    from hf_mocose.models.settings import ARGS_SETTINGS

    esimcse = take_settings({"method": "esimcse"}, ARGS_SETTINGS)
    assert esimcse["word_repetition_rate"] == 0.32
    assert take_settings({"method": "mocose"}, ARGS_SETTINGS)["word_repetition_rate"] == 0.0
    assert take_settings({"method": "simcse", "word_repetition_rate": 0.2}, ARGS_SETTINGS)["word_repetition_rate"] == 0.2
    with pytest.raises(ValueError, match=r"word_repetition_rate must be in \[0, 1\], got 1.5"):
        validate_settings({"word_repetition_rate": 1.5})


def test_esimcse_under_the_trainer_queues_the_momentum_encoders_anchors(tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path, method="esimcse", queue_size=16, queue_init_size=0, max_steps=1,
                           encoder_dropout=0.0, head_dropout=0.0, projection_layers=0, ema_decay_start=0.995,
                           ema_decay_end=0.995, target_dropout=False)
    model = trainer.model
    assert hasattr(model, "target_encoder") and not hasattr(model, "predictor") and not hasattr(model, "target_pooler")
    assert trainer.fgsm.mode == "off" and trainer.args.word_repetition_rate == 0.32
    inputs = next(iter(trainer.get_train_dataloader()))
    assert "positive_input_ids" in inputs  # the word-repeated positive, padded on its own
    assert (inputs["positive_attention_mask"].sum(1) >= inputs["attention_mask"].sum(1)).all()
    with torch.no_grad():
        out = model(**inputs)
        anchors = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).query
    assert torch.allclose(out.target_embedding, anchors, atol=1e-5)  # target == online at step 0, online heads
    assert not torch.allclose(out.key, out.query, atol=1e-4)  # the key is the repeated copy
    before = [p.detach().clone() for p in model.online_encoder.parameters()]
    trainer.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.online_encoder.parameters()))
    assert math.isfinite(trainer.state.log_history[0]["loss"])
    assert torch.allclose(model.queue.newest_first()[:4], F.normalize(out.target_embedding, dim=1).flip(0), atol=1e-5)
    online, target, _, _ = model.ema_parameter_pairs()
    assert len(online) == len(target) == len(list(p for n, p in model.target_encoder.named_parameters()
                                                    if "word_embeddings" not in n))


def test_word_repetition_is_a_switch_for_every_method(tiny_encoder, tmp_path):
    for method in ("mocose", "simcse"):
        off = make_trainer(tiny_encoder, tmp_path / f"{method}0", method=method, queue_size=16, queue_init_size=0)
        assert "positive_input_ids" not in next(iter(off.get_train_dataloader()))
        on = make_trainer(tiny_encoder, tmp_path / method, method=method, queue_size=16, queue_init_size=0,
                          word_repetition_rate=0.5, max_steps=2)
        batch = next(iter(on.get_train_dataloader()))
        assert (batch["positive_attention_mask"].sum(1) > batch["attention_mask"].sum(1)).any()
        on.train()
        assert all(math.isfinite(h["loss"]) for h in on.state.log_history if "loss" in h)
    with pytest.raises(ValueError, match="word_repetition_rate"):
        tiny_training_args(tmp_path, word_repetition_rate=-0.1)


def test_esimcse_under_the_loss(tiny_encoder, tmp_path):
    trainer = make_st_trainer(tiny_encoder, tmp_path, max_steps=3,
                              loss_kwargs=dict(method="esimcse", queue_size=32, queue_init_size=0))
    loss = trainer.loss
    assert loss.target_encoder is not None and loss.target_head is None and "predictor" not in loss.online_head._modules
    assert loss.fgsm.mode == "off" and loss.settings["word_repetition_rate"] == 0.32
    assert len(loss.ema_parameter_pairs().online_params) == len(list(loss.target_encoder.parameters()))
    assert "ESimCSE" in loss.citation
    target_before = [p.detach().clone() for p in loss.target_encoder.parameters()]
    trainer.train()
    assert int(loss.queue.queue_fill) == 3 * 4  # each step's 4 momentum embeddings
    assert any(not torch.equal(a, b) for a, b in zip(target_before, loss.target_encoder.parameters()))  # the EMA moved


def test_word_repetition_under_the_loss_repeats_the_positive(tiny_encoder, monkeypatch):
    import hf_mocose.st_loss.loss as loss_module
    from hf_mocose import MoCoSELoss

    loss = MoCoSELoss(tiny_sentence_transformer(tiny_encoder), method="simcse", word_repetition_rate=0.5)
    seen = []
    original = loss_module.repeat_words_in_batch
    monkeypatch.setattr(loss_module, "repeat_words_in_batch", lambda *a: seen.append((a[0], original(*a))) or seen[-1][1])
    model = loss.model
    features = model.tokenize(["a fairly long sentence with many words in it for sure", "another long one here too"])
    loss._ready = True
    model.train()
    assert math.isfinite(loss([features]).item())
    (given, repeated), = seen
    assert given is features and (repeated["attention_mask"].sum(1) >= features["attention_mask"].sum(1)).all()
    model.eval()
    loss([features])
    assert len(seen) == 1  # never outside training

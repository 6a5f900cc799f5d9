"""FGSM on the word embeddings: exact, previous, off."""

import pytest
import torch
from conftest import make_trainer

NO_DROPOUT = dict(encoder_dropout=0.0, head_dropout=0.0, fgsm_epsilon=1e-3, pad_to_max_length=True)


def _recording(trainer, monkeypatch):
    """Records the perturbation each forward of the (unwrapped) model receives."""
    seen = []
    model = trainer.model
    original = model.forward

    def forward(*args, embedding_perturbation=None, **kwargs):
        seen.append(embedding_perturbation)
        return original(*args, embedding_perturbation=embedding_perturbation, **kwargs)

    monkeypatch.setattr(model, "forward", forward)
    return seen


def _batch(trainer):
    return next(iter(trainer.get_train_dataloader()))


def test_exact_moves_inputs_by_epsilon_sign_gradient(tiny_encoder, tmp_path, monkeypatch):
    trainer = make_trainer(tiny_encoder, tmp_path, fgsm_mode="exact", **NO_DROPOUT)
    model = trainer.model.train()
    inputs = _batch(trainer)
    # the gradient of the clean loss w.r.t. the word embeddings, computed independently
    clean = model(**inputs)
    loss, _ = trainer.objective.loss(clean, model.queue)
    (gradient,) = torch.autograd.grad(loss.loss, clean.word_embeddings)
    seen = _recording(trainer, monkeypatch)
    outputs = trainer.compute_loss(model, inputs, return_outputs=True)[1]
    assert seen[0] is None and seen[1] is not None  # clean pass, then the perturbed one
    assert torch.equal(seen[1], 1e-3 * torch.sign(gradient))
    word = model.online_encoder.get_input_embeddings()(inputs["input_ids"])
    assert torch.allclose(outputs.word_embeddings - word, 1e-3 * torch.sign(gradient), atol=1e-7)


def test_previous_reuses_last_gradient(tiny_encoder, tmp_path, monkeypatch):
    trainer = make_trainer(tiny_encoder, tmp_path, fgsm_mode="previous", **NO_DROPOUT)
    model = trainer.model.train()
    batches = iter(trainer.get_train_dataloader())
    seen = _recording(trainer, monkeypatch)
    first = next(batches)
    loss = trainer.compute_loss(model, first)
    assert seen[-1] is None  # nothing to reuse yet
    loss.backward()
    stored = trainer.fgsm.last_gradient_sign.clone()
    assert stored.shape == (*first["input_ids"].shape, 32)
    trainer.compute_loss(model, next(batches))
    assert torch.equal(seen[-1], 1e-3 * stored)  # one forward only, with the previous gradient's sign
    assert len(seen) == 2


def test_previous_fits_a_sign_of_another_shape():
    """Dynamic padding (sentence-transformers) or a short last batch: the previous sign is cropped or
    zero-filled to the current (B, L, H); an equal shape is used as it is."""
    from hf_mocose.models.objective import FGSMPerturbation

    fgsm = FGSMPerturbation("previous", epsilon=0.5)
    sign = torch.sign(torch.randn(4, 6, 8))
    fgsm.last_gradient_sign = sign
    assert torch.equal(fgsm.previous_perturbation(torch.Size((4, 6, 8))), 0.5 * sign)
    shorter = fgsm.previous_perturbation(torch.Size((2, 3, 8)))  # fewer sentences, shorter padding
    assert torch.equal(shorter, 0.5 * sign[:2, :3])
    longer = fgsm.previous_perturbation(torch.Size((5, 9, 8)))  # more sentences, longer padding
    assert longer.shape == (5, 9, 8)
    assert torch.equal(longer[:4, :6], 0.5 * sign)
    assert not longer[4:].any() and not longer[:, 6:].any()


def test_off_changes_nothing(tiny_encoder, tmp_path, monkeypatch):
    trainer = make_trainer(tiny_encoder, tmp_path, fgsm_mode="off", **NO_DROPOUT)
    model = trainer.model.train()
    inputs = _batch(trainer)
    seen = _recording(trainer, monkeypatch)
    outputs = trainer.compute_loss(model, inputs, return_outputs=True)[1]
    assert seen == [None]
    word = model.online_encoder.get_input_embeddings()(inputs["input_ids"])
    assert torch.equal(outputs.word_embeddings, word)
    assert trainer.fgsm.last_gradient_sign is None


def test_online_view_only(tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path, fgsm_mode="exact", fgsm_views="online", **NO_DROPOUT)
    model = trainer.model.train()
    inputs = _batch(trainer)
    plain_key = model(**inputs).key
    _, outputs = trainer.compute_loss(model, inputs, return_outputs=True)
    assert torch.equal(outputs.key, plain_key)  # target saw the clean embeddings
    trainer.fgsm.views = "both"
    _, outputs = trainer.compute_loss(model, inputs, return_outputs=True)
    assert not torch.equal(outputs.key, plain_key)


@pytest.mark.parametrize("kwargs,match", [({"fgsm_mode": "pgd"}, "fgsm_mode 'pgd'"), ({"fgsm_epsilon": -1.0}, "fgsm_epsilon")])
def test_bad_fgsm_settings(tmp_path, kwargs, match):
    from conftest import tiny_training_args

    with pytest.raises(ValueError, match=match):
        tiny_training_args(tmp_path, **kwargs)


def test_embedding_rms_unit_scales_the_step_to_the_embeddings(tiny_encoder, tmp_path, monkeypatch):
    settings = {**NO_DROPOUT, "fgsm_epsilon": 0.1}
    trainer = make_trainer(tiny_encoder, tmp_path, fgsm_mode="exact", fgsm_epsilon_unit="embedding_rms", **settings)
    model = trainer.model.train()
    inputs = _batch(trainer)
    seen = _recording(trainer, monkeypatch)
    trainer.compute_loss(model, inputs)
    word = model.online_encoder.get_input_embeddings()(inputs["input_ids"])
    rms = word.detach().pow(2).mean().sqrt()
    step = seen[1].abs()
    # every entry moves by 10 % of the batch's RMS entry (where the gradient is non-zero)
    assert torch.allclose(step[step > 0], 0.1 * rms)
    assert step.max() > 1e3 * 5e-9  # the paper's absolute 5e-9 would be invisible next to it


def test_embedding_rms_unit_in_previous_mode_and_resume_state(tiny_encoder, tmp_path, monkeypatch):
    trainer = make_trainer(tiny_encoder, tmp_path, fgsm_mode="previous", fgsm_epsilon_unit="embedding_rms",
                           **{**NO_DROPOUT, "fgsm_epsilon": 0.1})
    model = trainer.model.train()
    batches = iter(trainer.get_train_dataloader())
    seen = _recording(trainer, monkeypatch)
    first = next(batches)
    trainer.compute_loss(model, first).backward()
    word = model.online_encoder.get_input_embeddings()(first["input_ids"]).detach()
    first_sign = trainer.fgsm.last_gradient_sign.clone()
    second = next(batches)
    trainer.compute_loss(model, second).backward()
    # the step of batch 2 is sized by batch 1's embeddings, with batch 1's gradient sign
    assert torch.allclose(seen[-1], 0.1 * word.pow(2).mean().sqrt() * first_sign)
    # checkpointed per rank: the sign and the step size of the same (latest) batch travel together
    state = trainer.fgsm.state_dict()
    second_word = model.online_encoder.get_input_embeddings()(second["input_ids"]).detach() + seen[-1]
    assert torch.allclose(torch.as_tensor(state["last_step_size"]), 0.1 * second_word.pow(2).mean().sqrt())
    assert not torch.equal(state["last_gradient_sign"], first_sign)


def test_unknown_epsilon_unit_is_refused(tmp_path):
    from conftest import tiny_training_args

    with pytest.raises(ValueError, match="fgsm_epsilon_unit 'percent'"):
        tiny_training_args(tmp_path, fgsm_epsilon_unit="percent")

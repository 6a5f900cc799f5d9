"""Switches that give the MoCoSE reference code's readings: `projection_dim` (its `out_size`, the paper's
Table 6a) and `shared_embeddings: module` (its target reads the online embedding module)."""

import pytest
import torch
from conftest import build_tiny_encoder, make_trainer

from hf_mocose import MoCoSEModel
from hf_mocose.models.configuration import MoCoSEConfig
from hf_mocose.models.ema import EMATargetCallback


# ----------------------------------------------------------------------------- projection_dim
def test_projection_dim_sets_the_width_of_keys_queries_and_queue_not_of_the_sentence_embedding(tiny_encoder):
    model = MoCoSEModel.from_pretrained(tiny_encoder, projection_dim=48, queue_size=16, queue_init_size=4).eval()
    # As the reference's out_size: the last projection Linear maps hidden (32) -> 48, the predictor stays at 48.
    assert model.online_projection[0].weight.shape == (48, 32)
    assert model.target_projection[0].weight.shape == (48, 32)
    assert [m.weight.shape for m in model.predictor if isinstance(m, torch.nn.Linear)] == [(48, 48), (48, 48)]
    assert model.queue.keys.shape == (16, 48)
    ids = torch.randint(1000, 2000, (3, 7))
    out = model(input_ids=ids)
    assert out.query.shape == (3, 48) and out.key.shape == (3, 48)
    assert model.embed(ids).shape == (3, 32)  # the sentence embedding is read before the heads


def test_projection_dim_with_two_projection_blocks_widens_only_the_last(tiny_encoder):
    model = MoCoSEModel.from_pretrained(tiny_encoder, projection_dim=16, projection_layers=2, predictor_dim=8,
                                        queue_size=8, queue_init_size=0)
    linears = [m.weight.shape for m in model.online_projection if isinstance(m, torch.nn.Linear)]
    assert linears == [(32, 32), (16, 32)]
    assert [m.weight.shape for m in model.predictor if isinstance(m, torch.nn.Linear)] == [(8, 16), (16, 8)]


def test_projection_dim_trains_end_to_end_and_survives_a_checkpoint(tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path, projection_dim=24, fgsm_mode="off")
    trainer.train()
    assert trainer.model.queue.keys.shape[1] == 24 and int(trainer.model.queue.queue_fill) == 10
    trainer.model.save_pretrained(tmp_path / "saved")
    reloaded = MoCoSEModel.from_pretrained(tmp_path / "saved")
    assert reloaded.config.projection_dim == 24 and reloaded.config.key_dim == 24
    assert torch.equal(reloaded.queue.keys, trainer.model.queue.keys)


@pytest.mark.parametrize("kwargs,match", [
    ({"projection_dim": 64, "projection_layers": 0}, "projection_dim=64 needs projection_layers >= 1"),
    ({"projection_dim": 0}, "projection_dim must be a whole number >= 1"),
])
def test_bad_projection_dim_is_refused_before_training(tmp_path, kwargs, match):
    from hf_mocose.trainer.training_args import MoCoSETrainingArguments

    with pytest.raises(ValueError, match=match):
        MoCoSETrainingArguments(output_dir=str(tmp_path), **kwargs)
    with pytest.raises(ValueError, match=match):
        MoCoSEConfig(**kwargs)


# ----------------------------------------------------------------------------- shared_embeddings
def _embedding_tensors(encoder):
    e = encoder.embeddings
    return {"position": e.position_embeddings.weight, "token_type": e.token_type_embeddings.weight,
            "layer_norm": e.LayerNorm.weight}


@torch.no_grad()
def _one_ema_step(model, decay=0.9):
    """Moves every online parameter (as an optimizer step would), then runs one EMA update."""
    before = {n: p.clone() for n, p in model.target_encoder.named_parameters()}
    for p in model.online_encoder.parameters():
        p.add_(torch.randn_like(p))
    EMATargetCallback(model).update(decay)
    return before


@pytest.mark.parametrize("shared", ["word", "module"])
def test_shared_embeddings_module_copies_the_embedding_module_while_the_rest_is_averaged(tiny_encoder, shared):
    model = MoCoSEModel.from_pretrained(tiny_encoder, shared_embeddings=shared, queue_size=8, queue_init_size=0)
    before = _one_ema_step(model, decay=0.9)
    online, target = _embedding_tensors(model.online_encoder), _embedding_tensors(model.target_encoder)
    for name in online:
        old = before[{"position": "embeddings.position_embeddings.weight",
                      "token_type": "embeddings.token_type_embeddings.weight",
                      "layer_norm": "embeddings.LayerNorm.weight"}[name]]
        expected = online[name] if shared == "module" else 0.9 * old + 0.1 * online[name]
        assert torch.allclose(target[name], expected, atol=1e-6), name
    layer = "encoder.layer.0.attention.self.query.weight"  # the encoder itself is averaged either way
    online_layer = dict(model.online_encoder.named_parameters())[layer]
    target_layer = dict(model.target_encoder.named_parameters())[layer]
    assert torch.allclose(target_layer, 0.9 * before[layer] + 0.1 * online_layer, atol=1e-6)
    assert not any(p.requires_grad for p in model.target_encoder.parameters())
    assert all(p.requires_grad for p in model.online_encoder.embeddings.parameters())


def test_shared_embedding_module_trains_end_to_end_and_is_kept_by_checkpoints(tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path, shared_embeddings="module", fgsm_mode="off")
    trainer.train()
    model = trainer.model
    for name, tensor in _embedding_tensors(model.online_encoder).items():
        assert torch.equal(tensor, _embedding_tensors(model.target_encoder)[name]), name
    layer_online = model.online_encoder.encoder.layer[0].output.dense.weight
    assert not torch.equal(layer_online, model.target_encoder.encoder.layer[0].output.dense.weight)
    model.save_pretrained(tmp_path / "saved")
    assert MoCoSEModel.from_pretrained(tmp_path / "saved").config.shared_embeddings == "module"


def test_shared_embedding_module_works_for_distilbert(tmp_path):
    encoder = build_tiny_encoder(tmp_path / "distil", model_type="distilbert")
    model = MoCoSEModel.from_pretrained(encoder, shared_embeddings="module", queue_size=8, queue_init_size=0)
    _one_ema_step(model, decay=0.5)
    assert torch.equal(model.online_encoder.embeddings.position_embeddings.weight,
                       model.target_encoder.embeddings.position_embeddings.weight)


@pytest.mark.parametrize("kwargs,match", [
    ({"shared_embeddings": "all"}, "Unknown shared_embeddings 'all'"),
    ({"shared_embeddings": "module", "method": "simcse"}, "only method='mocose' has"),
])
def test_bad_shared_embeddings_is_refused_before_training(tmp_path, kwargs, match):
    from hf_mocose.trainer.training_args import MoCoSETrainingArguments

    with pytest.raises(ValueError, match=match):
        MoCoSETrainingArguments(output_dir=str(tmp_path), **kwargs)

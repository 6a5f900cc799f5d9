"""MoCoSEModel: construction around an encoder, branches, pooling, save/load round trip."""

import pytest
import torch
from transformers import AutoConfig, AutoModel

from hf_mocose import MoCoSEConfig, MoCoSEModel

SMALL = dict(queue_size=12, queue_init_size=4)


@pytest.fixture
def model(tiny_encoder):
    return MoCoSEModel.from_pretrained(tiny_encoder, **SMALL)


def _batch(n=3, length=7):
    ids = torch.randint(1000, 2000, (n, length))
    ids[:, 0] = 101
    return ids, torch.ones_like(ids)


def test_builds_around_plain_encoder(model, tiny_encoder):
    plain = AutoModel.from_pretrained(tiny_encoder)
    assert model.config.model_type == "mocose" and model.config.queue_size == 12
    # online encoder = checkpoint; pooler Linear initialised from the checkpoint's pooler dense
    for name, tensor in plain.state_dict().items():
        if name.startswith("pooler."):
            continue
        assert torch.equal(model.online_encoder.state_dict()[name], tensor), name
    assert torch.equal(model.online_pooler.weight, plain.pooler.dense.weight)
    assert model.online_encoder.pooler is None and model.target_encoder.pooler is None


def test_target_is_a_frozen_copy_with_own_storage(model):
    online_p, target_p, _, _ = model.ema_parameter_pairs()
    assert len(online_p) == len(target_p) > 0
    for online, target in zip(online_p, target_p):
        assert torch.equal(online, target)
        assert online.data_ptr() != target.data_ptr()
        assert not target.requires_grad
    # word embeddings are shared: the target keeps a 1-row placeholder
    assert model.target_encoder.get_input_embeddings().weight.shape[0] == 1


def test_forward_shapes_and_target_gets_no_gradient(model):
    ids, mask = _batch()
    out = model(input_ids=ids, attention_mask=mask)
    assert out.query.shape == (3, 32) and out.key.shape == (3, 32)
    assert out.word_embeddings.shape == (3, 7, 32)
    assert out.query.requires_grad and not out.key.requires_grad
    (out.query.sum() + out.key.sum()).backward()
    assert all(p.grad is None for m in model.target_modules() for p in m.parameters())
    assert model.online_pooler.weight.grad is not None


def test_target_dropout_switch(tiny_encoder):
    model = MoCoSEModel.from_pretrained(tiny_encoder, target_dropout=False, **SMALL)
    model.train()
    assert model.online_encoder.training and not model.target_encoder.training
    ids, mask = _batch()
    keys = [model(input_ids=ids, attention_mask=mask).key for _ in range(2)]
    assert torch.equal(keys[0], keys[1])  # deterministic target
    model_with = MoCoSEModel.from_pretrained(tiny_encoder, **SMALL).train()
    assert model_with.target_encoder.training


@pytest.mark.parametrize("pooling", ["cls", "cls_dense", "mean"])
def test_sentence_pooling(tiny_encoder, pooling):
    model = MoCoSEModel.from_pretrained(tiny_encoder, sentence_pooling=pooling, **SMALL).eval()
    ids, mask = _batch()
    mask[0, 5:] = 0
    hidden = model.online_encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    expected = {
        "cls": hidden[:, 0],
        "cls_dense": model.online_pooler(hidden[:, 0]),
        "mean": (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True),
    }[pooling]
    assert torch.allclose(model.embed(ids, mask), expected, atol=1e-6)


def test_save_load_round_trip_bit_for_bit(model, tmp_path):
    model.queue.enqueue(torch.randn(5, 32))
    with torch.no_grad():
        for p in model.target_modules()[1].parameters():
            p.add_(1.0)  # target differs from online
    model.save_pretrained(tmp_path)
    loaded = MoCoSEModel.from_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    before, after = model.state_dict(), loaded.state_dict()
    assert before.keys() == after.keys()
    for name in before:
        assert torch.equal(before[name], after[name]), name
    assert int(loaded.queue.queue_ptr) == 9 and int(loaded.queue.queue_fill) == 9
    assert loaded.config.to_dict()["queue_size"] == 12


def test_auto_classes(model, tmp_path):
    model.save_pretrained(tmp_path)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), MoCoSEConfig)
    assert isinstance(AutoModel.from_pretrained(tmp_path), MoCoSEModel)


def test_simcse_mode_has_no_target(tiny_encoder):
    model = MoCoSEModel.from_pretrained(tiny_encoder, method="simcse")
    assert not hasattr(model, "queue") and not hasattr(model, "target_encoder")
    out = model(*_batch())
    assert out.key.requires_grad  # second dropout view carries gradient


def test_rejects_non_encoder(tmp_path):
    config = AutoConfig.for_model("gpt2", n_layer=1, n_head=2, n_embd=8, vocab_size=50)
    AutoModel.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="gpt2.*not a bidirectional encoder"):
        MoCoSEModel.from_pretrained(str(tmp_path))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"queue_init_size": 20, "queue_size": 10}, "queue_init_size"),
        ({"queue_size": 0}, "queue_size"),
        ({"contrastive_temperature": 0.0}, "contrastive_temperature"),
        ({"sentence_pooling": "max"}, "sentence_pooling 'max'"),
        ({"method": "byol"}, "method 'byol'"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MoCoSEConfig(encoder_config={"model_type": "bert"}, **kwargs)


def test_distilbert_encoder(tmp_path):
    from conftest import build_tiny_encoder

    path = build_tiny_encoder(tmp_path / "distil", model_type="distilbert")
    model = MoCoSEModel.from_pretrained(path, **SMALL)
    ids, mask = _batch()
    assert model(input_ids=ids, attention_mask=mask).query.shape == (3, 32)


def test_identity_head_init_makes_the_query_a_squashed_key(tiny_encoder):
    """head_init=identity: without dropout the step-0 query is tanh(LayerNorm(key)), not a random map of it."""
    model = MoCoSEModel.from_pretrained(tiny_encoder, head_init="identity", encoder_dropout=0.0, head_dropout=0.0, **SMALL)
    model.train()
    ids, mask = _batch(n=5)
    out = model(input_ids=ids, attention_mask=mask)
    assert torch.allclose(out.query, torch.tanh(out.key), atol=1e-5)  # the key is a LayerNorm output already
    for linear in [*model.online_projection, *model.predictor]:
        if isinstance(linear, torch.nn.Linear):
            assert torch.equal(linear.weight, torch.eye(32)) and not linear.bias.any()
    # the pooler still comes from the checkpoint when it has one
    plain = AutoModel.from_pretrained(tiny_encoder)
    assert torch.equal(model.online_pooler.weight, plain.pooler.dense.weight)


def test_identity_head_init_is_the_default_and_head_inits_survive_save_load(tiny_encoder, tmp_path):
    model = MoCoSEModel.from_pretrained(tiny_encoder, **SMALL)
    assert model.config.head_init == "identity"
    assert torch.equal(model.predictor[0].weight, torch.eye(32))
    paper = MoCoSEModel.from_pretrained(tiny_encoder, head_init="random", **SMALL)
    assert not torch.equal(paper.predictor[0].weight, torch.eye(32))
    paper.save_pretrained(tmp_path / "paper")
    assert MoCoSEModel.from_pretrained(tmp_path / "paper").config.head_init == "random"
    identity = MoCoSEModel.from_pretrained(tiny_encoder, head_init="identity", predictor_dim=48, **SMALL)
    assert identity.predictor[0].weight.shape == (48, 32)
    assert torch.equal(identity.predictor[0].weight, torch.eye(48, 32))  # rectangular identity
    identity.save_pretrained(tmp_path / "m")
    reloaded = MoCoSEModel.from_pretrained(tmp_path / "m")
    assert reloaded.config.head_init == "identity"
    assert torch.equal(reloaded.predictor[0].weight, identity.predictor[0].weight)


def test_unknown_head_init_is_refused(tiny_encoder):
    with pytest.raises(ValueError, match="head_init 'zeros'"):
        MoCoSEModel.from_pretrained(tiny_encoder, head_init="zeros", **SMALL)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_heads_read_the_pooled_state_that_embed_returns(tiny_encoder, pooling):
    """Training reads what evaluation and the export pool: [CLS], or the token mean for sentence_pooling="mean"."""
    model = MoCoSEModel.from_pretrained(tiny_encoder, method="simcse", projection_layers=0, sentence_pooling=pooling)
    model.eval()  # no dropout: both views are the same deterministic function
    ids, mask = _batch(n=4, length=9)
    mask[:2, 5:] = 0  # padding: the mean must ignore it
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
        expected = model.online_pooler(model.embed(ids, mask))
    torch.testing.assert_close(out.query, expected)
    torch.testing.assert_close(out.key, expected)


def test_input_embeddings_are_the_online_encoders_shared_table(model):
    ids, mask = _batch()
    table = model.get_input_embeddings()
    assert table is model.online_encoder.get_input_embeddings()
    assert model.target_encoder.get_input_embeddings().weight.shape == (1, 32)  # the target's placeholder
    # inputs_embeds (what MoCoSETrainer passes for FGSM) gives the same forward as the lookup inside
    looked_up = model.eval()(ids, mask)
    given = model(ids, mask, inputs_embeds=table(ids))
    assert torch.equal(looked_up.query, given.query) and torch.equal(looked_up.key, given.key)
    replacement = torch.nn.Embedding(table.num_embeddings, 32)
    model.set_input_embeddings(replacement)
    assert model.online_encoder.get_input_embeddings() is replacement


def test_resize_token_embeddings_keeps_the_target_placeholder_and_reloads(model, tmp_path):
    vocab = model.config.encoder_config.vocab_size
    resized = model.resize_token_embeddings(vocab + 5)
    assert resized.weight.shape == (vocab + 5, 32) and model.get_input_embeddings() is resized
    assert model.config.encoder_config.vocab_size == vocab + 5
    assert model.target_encoder.get_input_embeddings().weight.shape == (1, 32)  # untouched: it is never read
    online_p, target_p, _, _ = model.ema_parameter_pairs()
    assert not any(p is resized.weight for p in online_p)  # the shared table stays out of the EMA
    ids, mask = _batch()
    ids[:, -1] = vocab + 4  # a new token
    out = model.eval()(ids, mask)
    model.save_pretrained(tmp_path)
    reloaded = MoCoSEModel.from_pretrained(tmp_path).eval()
    assert torch.equal(reloaded.get_input_embeddings().weight, resized.weight)
    assert torch.equal(reloaded(ids, mask).query, out.query)

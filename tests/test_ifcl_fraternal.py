"""IFCL's fraternal view: fused translation input, l_F and the Twins loss, data checks."""

import math

import pytest
import torch
from conftest import build_tiny_encoder

from hf_mocose import MoCoSEModel
from hf_mocose.commands.train import main
from hf_mocose.data.corpus import load_sentences
from hf_mocose.models.losses import twins_loss


def test_twins_loss_on_hand_made_vectors():
    h = torch.tensor([[1.0, 0.0]])
    h_plus = torch.tensor([[1.0, 1.0]])  # cos = 1/sqrt(2)
    h_minus = torch.tensor([[0.0, 1.0]])  # cos = 0
    x, x_minus = torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    margin = math.exp(1.0) - math.exp(1 / math.sqrt(2))
    expected = abs(math.exp(1 / math.sqrt(2)) - math.exp(0.0) - margin)
    assert twins_loss(h, h_plus, h_minus, x, x, x_minus).item() == pytest.approx(expected, rel=1e-6)


@pytest.fixture
def fraternal_encoder(tmp_path_factory):
    return build_tiny_encoder(tmp_path_factory.mktemp("fraternal"), model_type="distilbert", seed=1)


def test_fraternal_table_comes_from_the_fraternal_model(tiny_encoder, fraternal_encoder):
    from transformers import AutoModel

    model = MoCoSEModel.from_pretrained(tiny_encoder, method="ifcl", queue_size=8, queue_init_size=0,
                                        fraternal_model_name_or_path=fraternal_encoder)
    expected = AutoModel.from_pretrained(fraternal_encoder).get_input_embeddings().weight
    assert torch.equal(model.fraternal_embeddings.weight, expected)
    assert not model.fraternal_embeddings.weight.requires_grad


def test_width_mismatch_is_an_error(tiny_encoder, tmp_path):
    from transformers import AutoConfig, AutoModel

    AutoModel.from_config(AutoConfig.for_model("bert", hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                               intermediate_size=16, vocab_size=100)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="embedding width 16.*hidden size is 32"):
        MoCoSEModel.from_pretrained(tiny_encoder, method="ifcl", fraternal_model_name_or_path=str(tmp_path))


@pytest.mark.parametrize("epsilon", [0.0, 1.0])
def test_fusion_position_by_position(tiny_encoder, fraternal_encoder, epsilon):
    model = MoCoSEModel.from_pretrained(tiny_encoder, method="ifcl", queue_size=8, queue_init_size=0,
                                        fraternal_model_name_or_path=fraternal_encoder, fraternal_fusion=epsilon,
                                        encoder_dropout=0.0, head_dropout=0.0).eval()
    ids = torch.randint(1000, 2000, (2, 6))
    fraternal_ids = torch.randint(1000, 2000, (2, 6))
    mask = torch.ones_like(ids)
    out = model(input_ids=ids, attention_mask=mask, fraternal_input_ids=fraternal_ids, fraternal_attention_mask=mask)
    source = ids if epsilon == 1.0 else None
    if source is None:  # epsilon = 0: the fraternal view is the fraternal text alone
        embedded = model.fraternal_embeddings(fraternal_ids)
    else:
        embedded = model.online_encoder.get_input_embeddings()(ids)
    expected = model.branches.online_key(model.online_encoder(inputs_embeds=embedded, attention_mask=mask).last_hidden_state[:, 0])
    assert torch.allclose(out.fraternal_query, expected, atol=1e-6)
    assert out.input_embeddings.shape == (2, 2, 32)


def test_fraternal_column_checks(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text("sentence,german\nthe cat sleeps,die Katze schläft\na dog runs,\n")
    with pytest.raises(ValueError, match="fraternal_column 'german' is empty in 1 of 2 rows"):
        load_sentences(str(path), text_column="sentence", fraternal_column="german")
    with pytest.raises(ValueError, match="fraternal_column 'cantonese' is not in"):
        load_sentences(str(path), text_column="sentence", fraternal_column="cantonese")


def test_ifcl_with_fraternal_view_trains_end_to_end(tiny_encoder, fraternal_encoder, tmp_path):
    rows = [f"sentence number {i} about topic {i % 7}" for i in range(48)]
    path = tmp_path / "pairs.csv"
    path.write_text("text,translation\n" + "\n".join(f"{r},satz nummer {i}" for i, r in enumerate(rows)) + "\n")
    final = main(["--model_name_or_path", tiny_encoder, "--train_file", str(path), "--fraternal_column", "translation",
                  "--fraternal_model_name_or_path", fraternal_encoder, "--method", "ifcl", "--queue_size", "16",
                  "--queue_init_size", "0", "--ifcl_forgetting", "0.2", "--per_device_train_batch_size", "8",
                  "--max_steps", "4", "--logging_steps", "1", "--output_dir", str(tmp_path / "out"), "--use_cpu", "true",
                  "--eval_strategy", "no", "--save_strategy", "no", "--disable_tqdm", "true",
                  "--export_sentence_transformers", "false"])
    import json

    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    model = MoCoSEModel.from_pretrained(final)
    assert model.config.fraternal_vocab_size and int(model.queue.queue_fill) == 16
    logs = [h for h in state["log_history"] if "loss" in h]
    assert len(logs) == 4 and all({"loss_fraternal", "loss_twins"} <= h.keys() for h in logs)
    assert all(math.isfinite(h["loss_twins"]) and h["loss_twins"] >= 0 for h in logs)


def test_fraternal_needs_ifcl_and_a_model(tiny_encoder, tmp_path):
    from hf_mocose.commands.train import parse_args

    with pytest.raises(ValueError, match="set method ifcl"):
        parse_args(["--fraternal_column", "de", "--fraternal_model_name_or_path", "x", "--output_dir", str(tmp_path)])
    with pytest.raises(ValueError, match="needs fraternal_model_name_or_path"):
        parse_args(["--fraternal_column", "de", "--method", "ifcl", "--output_dir", str(tmp_path)])


@pytest.mark.parametrize("method", ["ifcl", "simcse"])
def test_without_in_batch_negatives_the_twin_key_keeps_its_gradient(tiny_encoder, tmp_path, method):
    """SimCSE/IFCL keys are a second online view: the loss must reach them (only MoCoSE's target keys are cut)."""
    from conftest import make_trainer

    if method == "simcse":  # SimCSE itself refuses in_batch_negatives=False; its keys go the in-batch way
        trainer = make_trainer(tiny_encoder, tmp_path, method=method, fgsm_mode="off")
    else:
        trainer = make_trainer(tiny_encoder, tmp_path, method=method, in_batch_negatives=False, queue_size=16,
                               queue_init_size=8, fgsm_mode="off")  # random keys as negatives: the loss is not 0
    model = trainer.model.train()
    loss, outputs = trainer.compute_loss(model, next(iter(trainer.get_train_dataloader())), return_outputs=True)
    (gradient,) = torch.autograd.grad(loss, outputs.key, allow_unused=True)
    assert gradient is not None and gradient.abs().sum() > 0


def _factorised_encoder(path, model_type, embedding_size, hidden_size, vocab_size=200, tokenizer_from=None):
    """A tiny random ALBERT/ELECTRA with factorised word embeddings (a table embedding_size wide, lifted to
    hidden_size), saved with a WordPiece tokenizer (the fraternal tokenizer only has to tokenise)."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    torch.manual_seed(3)
    config = AutoConfig.for_model(model_type, vocab_size=vocab_size, embedding_size=embedding_size, hidden_size=hidden_size,
                                  num_hidden_layers=1, num_attention_heads=4, intermediate_size=32,
                                  max_position_embeddings=64)
    AutoModel.from_config(config).save_pretrained(path)
    if tokenizer_from is not None:
        AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("model_type,lift", [("albert", "encoder.embedding_hidden_mapping_in"),
                                             ("electra", "embeddings_project")])
def test_factorised_fraternal_embeddings_are_lifted_by_the_models_own_linear(tiny_encoder, tmp_path, model_type, lift):
    """An ALBERT-shaped fraternal encoder (128-wide table, hidden size = the anchor's 32) is accepted: its word
    vectors are its table through its own pretrained lift, W e + b, as its first layer would receive them."""
    from transformers import AutoModel

    fraternal = _factorised_encoder(tmp_path / model_type, model_type, embedding_size=128, hidden_size=32)
    model = MoCoSEModel.from_pretrained(tiny_encoder, method="ifcl", queue_size=8, queue_init_size=0,
                                        fraternal_model_name_or_path=fraternal)
    source = AutoModel.from_pretrained(fraternal)
    assert source.get_input_embeddings().weight.shape == (200, 128)
    linear = source.get_submodule(lift)
    with torch.no_grad():
        expected = source.get_input_embeddings().weight @ linear.weight.T + linear.bias
    assert model.fraternal_embeddings.weight.shape == (200, 32)
    assert torch.allclose(model.fraternal_embeddings.weight, expected, atol=1e-6)


def test_the_ifcl_seeds_pairing_is_refused_with_both_widths(tmp_path):
    """The IFCL seed's German encoder (stefan-it/albert-large-german-cased: 128-wide table, hidden 1024) beside
    a BERT-base anchor (768): no width matches, and no untrained map is invented, so it is refused before training."""
    from transformers import AutoConfig, AutoModel

    anchor = tmp_path / "bert-768"
    AutoModel.from_config(AutoConfig.for_model("bert", vocab_size=100, hidden_size=768, num_hidden_layers=1,
                                               num_attention_heads=12, intermediate_size=32)).save_pretrained(anchor)
    fraternal = _factorised_encoder(tmp_path / "albert-large-shaped", "albert", embedding_size=128, hidden_size=1024)
    with pytest.raises(ValueError, match=r"factorised word embeddings of width 128, lifted to width 1024 by its own "
                                         r"pretrained `encoder.embedding_hidden_mapping_in`, but the encoder's "
                                         r"hidden size is 768"):
        MoCoSEModel.from_pretrained(str(anchor), method="ifcl", fraternal_model_name_or_path=fraternal)


def test_ifcl_trains_with_an_albert_fraternal_encoder(tiny_encoder, tmp_path):
    rows = [f"sentence number {i} about topic {i % 7}" for i in range(32)]
    path = tmp_path / "pairs.csv"
    path.write_text("text,translation\n" + "\n".join(f"{r},satz nummer {i}" for i, r in enumerate(rows)) + "\n")
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(tiny_encoder).vocab_size
    fraternal = _factorised_encoder(tmp_path / "albert", "albert", embedding_size=128, hidden_size=32,
                                    vocab_size=vocab, tokenizer_from=tiny_encoder)
    final = main(["--model_name_or_path", tiny_encoder, "--train_file", str(path), "--fraternal_column", "translation",
                  "--fraternal_model_name_or_path", fraternal, "--method", "ifcl", "--queue_size", "16",
                  "--queue_init_size", "0", "--per_device_train_batch_size", "8", "--max_steps", "2",
                  "--logging_steps", "1", "--output_dir", str(tmp_path / "out"), "--use_cpu", "true",
                  "--eval_strategy", "no", "--save_strategy", "no", "--disable_tqdm", "true",
                  "--export_sentence_transformers", "false"])
    import json

    logs = [h for h in json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"] if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss_twins"]) for h in logs)
    assert MoCoSEModel.from_pretrained(final).fraternal_embeddings.weight.shape == (vocab, 32)

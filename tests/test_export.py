"""Export to sentence-transformers: folder layout, round trip, equivalence with `MoCoSEModel.embed`, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
import torch

from hf_mocose import MoCoSEModel, cli
from hf_mocose.export import export_to_sentence_transformers, reference_embeddings

POOLINGS = ("cls", "cls_dense", "mean")
# Mixed lengths: the long one is truncated at max_seq_length, the short ones are padded in a batch.
TEXTS = [
    "A man is playing a guitar.",
    "A woman slices an onion in the kitchen while the radio plays an old song about the sea and the wind " * 3,
    "Two dogs run.",
    "Contrastive learning with a momentum encoder and a queue of negatives.",
]
MAX_LEN = 16


def make_checkpoint(encoder_path: str, folder: Path, **config) -> tuple[MoCoSEModel, object]:
    """A MoCoSE checkpoint whose online branch differs from its target branch (so exporting the wrong one fails)."""
    from transformers import AutoTokenizer

    model = MoCoSEModel.from_encoder(encoder_path, **config)
    with torch.no_grad():
        for param in [*model.online_encoder.parameters(), *model.online_pooler.parameters()]:
            param.add_(torch.randn_like(param) * 0.02)
    tokenizer = AutoTokenizer.from_pretrained(encoder_path)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def exports(tiny_encoder, tmp_path_factory):
    """pooling -> (model, tokenizer, export folder) for the three sentence_pooling modes."""
    root = tmp_path_factory.mktemp("exports")
    out = {}
    for pooling in POOLINGS:
        model, tokenizer = make_checkpoint(
            tiny_encoder, root / f"ckpt-{pooling}", sentence_pooling=pooling, queue_size=8, queue_init_size=4,
            max_seq_length=MAX_LEN,
        )
        folder = export_to_sentence_transformers(root / f"ckpt-{pooling}", root / f"st-{pooling}", write_card=False)
        out[pooling] = (model, tokenizer, folder)
    return out


@pytest.mark.parametrize("pooling", POOLINGS)
def test_sentence_transformer_reproduces_embed(exports, pooling):
    from sentence_transformers import SentenceTransformer

    model, tokenizer, folder = exports[pooling]
    st_model = SentenceTransformer(str(folder), device="cpu")
    got = st_model.encode(TEXTS, convert_to_tensor=True, batch_size=2)
    want = reference_embeddings(model, tokenizer, TEXTS)
    assert got.shape == want.shape == (len(TEXTS), model.config.hidden_size)
    assert (got.cpu() - want).abs().max().item() < 1e-5
    assert st_model.max_seq_length == MAX_LEN
    assert st_model.similarity_fn_name == "cosine"


@pytest.mark.parametrize("pooling", POOLINGS)
def test_folder_layout(exports, pooling):
    _, _, folder = exports[pooling]
    modules = json.loads((folder / "modules.json").read_text())
    types = [m["type"].rsplit(".", 1)[-1] for m in modules]
    assert types == (["Transformer", "Pooling", "Dense"] if pooling == "cls_dense" else ["Transformer", "Pooling"])
    assert json.loads((folder / "config_sentence_transformers.json").read_text())["similarity_fn_name"] == "cosine"
    pooling_config = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling_config["pooling_mode"] == ("mean" if pooling == "mean" else "cls")
    assert (folder / "2_Dense").is_dir() == (pooling == "cls_dense")
    if pooling == "cls_dense":
        dense = json.loads((folder / "2_Dense" / "config.json").read_text())
        assert dense["activation_function"] == "torch.nn.modules.linear.Identity"
    assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == MAX_LEN
    assert not list(folder.parent.glob(".st-*staging*"))  # no staging folder left behind


def test_only_the_online_branch_is_exported(exports):
    from safetensors.torch import load_file

    model, _, folder = exports["cls_dense"]
    weights = {}
    for file in folder.rglob("*.safetensors"):
        weights.update({f"{file.parent.name}/{k}": v for k, v in load_file(file).items()})
    assert not [k for k in weights if any(s in k for s in ("target", "queue", "predictor", "projection"))]
    online = model.online_encoder.state_dict()
    assert torch.equal(weights[f"{folder.name}/embeddings.word_embeddings.weight"], online["embeddings.word_embeddings.weight"])
    assert torch.equal(weights["2_Dense/linear.weight"], model.online_pooler.weight)
    assert not any((folder / name).exists() for name in ("optimizer.pt", "scheduler.pt", "training_args.bin"))


def test_encoder_loads_with_automodel_without_random_weights(exports):
    from transformers import AutoModel

    _, _, folder = exports["cls"]
    kwargs = json.loads((folder / "sentence_bert_config.json").read_text()).get("model_kwargs", {})
    assert kwargs == {"add_pooling_layer": False}  # BERT: no pooler weights were exported
    encoder, info = AutoModel.from_pretrained(folder, output_loading_info=True, **kwargs)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert encoder.config.model_type == "bert"


def test_not_a_mocose_checkpoint_is_refused(tiny_encoder, tmp_path, capsys):
    with pytest.raises(ValueError, match="is not a MoCoSE checkpoint") as info:
        export_to_sentence_transformers(tiny_encoder, tmp_path / "out")
    assert tiny_encoder in str(info.value)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        export_to_sentence_transformers(tmp_path / "nowhere", tmp_path / "out")
    code, _, err = run_cli(["export", tiny_encoder, str(tmp_path / "out")], capsys)
    assert code == 2 and tiny_encoder in err and "not a MoCoSE checkpoint" in err
    assert not (tmp_path / "out").exists()


def test_non_empty_output_dir_needs_overwrite(exports, tmp_path, capsys):
    _, _, folder = exports["cls_dense"]
    checkpoint = folder.parent / "ckpt-cls"
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("user data")
    with pytest.raises(ValueError, match="not empty") as info:
        export_to_sentence_transformers(checkpoint, target)
    assert str(target) in str(info.value)
    code, _, err = run_cli(["export", str(checkpoint), str(target)], capsys)
    assert code == 2 and "--overwrite" in err
    assert (target / "keep.txt").read_text() == "user data"

    code, out, _ = run_cli(["export", str(checkpoint), str(target), "--overwrite", "--no_card"], capsys)
    assert code == 0 and str(target) in out
    assert not (target / "keep.txt").exists() and (target / "modules.json").is_file()
    assert not (target / "2_Dense").exists()


def test_output_dir_must_not_hold_the_checkpoint(exports):
    checkpoint = exports["cls"][2].parent / "ckpt-cls"
    for target in (checkpoint, checkpoint.parent):
        with pytest.raises(ValueError, match="must not be"):
            export_to_sentence_transformers(checkpoint, target, overwrite=True)
    assert (checkpoint / "model.safetensors").is_file()


@pytest.mark.slow
def test_minilm_export_matches(minilm, tmp_path):
    from sentence_transformers import SentenceTransformer

    model, tokenizer = make_checkpoint(minilm, tmp_path / "ckpt", sentence_pooling="mean", queue_size=16,
                                       queue_init_size=4, max_seq_length=32)
    folder = export_to_sentence_transformers(tmp_path / "ckpt", tmp_path / "st", base_model="sentence-transformers/all-MiniLM-L6-v2")
    got = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_tensor=True)
    assert (got.cpu() - reference_embeddings(model, tokenizer, TEXTS)).abs().max().item() < 1e-5
    assert (folder / "README.md").is_file()

"""Export to sentence-transformers: folder layout, round trip, equivalence with `MoCoSEModel.embed`, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import run_cli

from hf_mocose import MoCoSEModel
from hf_mocose.publishing.export import (
    export_to_sentence_transformers,
    probe_sentences,
    reference_embeddings,
    verify_export,
)

POOLINGS = ("cls", "cls_dense", "mean")
# Mixed lengths: short ones padded in a batch; one longer than the training length MAX_LEN (~66 tokens), one
# longer than the export's max_seq_length (~154 tokens), truncated there.
TEXTS = [
    "A man is playing a guitar.",
    "A woman slices an onion in the kitchen while the radio plays an old song about the sea and the wind " * 3,
    "Two dogs run.",
    "Contrastive learning with a momentum encoder and a queue of negatives, " * 11,
]
MAX_LEN = 16  # the training length
# The tiny encoder has no sentence-transformers config: the export uses its position limit,
# min(tokenizer model_max_length 512, max_position_embeddings 128).
INFERENCE_LEN = 128


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
    lengths = [len(ids) for ids in tokenizer(TEXTS)["input_ids"]]
    assert lengths[1] > MAX_LEN and lengths[3] > INFERENCE_LEN  # longer than training, longer than the export
    st_model = SentenceTransformer(str(folder), device="cpu")
    assert st_model.max_seq_length == INFERENCE_LEN  # the encoder's limit, not the training length
    got = st_model.encode(TEXTS, convert_to_tensor=True, batch_size=2)
    want = reference_embeddings(model, tokenizer, TEXTS, max_length=INFERENCE_LEN)
    assert got.shape == want.shape == (len(TEXTS), model.config.hidden_size)
    assert (got.cpu() - want).abs().max().item() < 1e-5
    # The comparison can tell the lengths apart: embed() at the training length differs on the long texts.
    at_training_length = reference_embeddings(model, tokenizer, TEXTS, max_length=MAX_LEN)
    assert (got.cpu() - at_training_length)[[1, 3]].abs().amax(dim=1).min().item() > 1e-3
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
    assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == INFERENCE_LEN
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


@pytest.mark.parametrize("model_type", ["bert", "roberta", "distilbert"])
def test_encoder_loads_with_automodel_without_keywords_or_random_weights(tiny_encoder, tmp_path, model_type):
    """No `model_kwargs` for any loader to trip on (optimum's ORTModel rejects `add_pooling_layer`): the encoder
    carries its class's pooler, filled with the MoCoSE pooler Linear; DistilBERT has none to carry."""
    from conftest import build_tiny_encoder
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    encoder_path = tiny_encoder if model_type == "bert" else build_tiny_encoder(tmp_path / "enc", model_type=model_type)
    model, _ = make_checkpoint(encoder_path, tmp_path / "ckpt", queue_size=8, queue_init_size=4, max_seq_length=MAX_LEN)
    folder = export_to_sentence_transformers(tmp_path / "ckpt", tmp_path / "st", write_card=False)
    assert "model_kwargs" not in json.loads((folder / "sentence_bert_config.json").read_text())
    encoder, info = AutoModel.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]  # nothing random, no load report
    assert encoder.config.model_type == model_type
    if model_type == "distilbert":
        assert not hasattr(encoder, "pooler")
    else:
        assert torch.equal(encoder.pooler.dense.weight, model.online_pooler.weight)
        assert torch.equal(encoder.pooler.dense.bias, model.online_pooler.bias)
    loaded = SentenceTransformer(str(folder), device="cpu")[0].auto_model
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), encoder.state_dict().values()))


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
    st_model = SentenceTransformer(str(folder), device="cpu")
    assert st_model.max_seq_length == 256  # all-MiniLM-L6-v2's own sentence_bert_config.json; training used 32
    got = st_model.encode(TEXTS, convert_to_tensor=True)
    assert (got.cpu() - reference_embeddings(model, tokenizer, TEXTS, max_length=256)).abs().max().item() < 1e-5
    assert "256 tokens at inference (longer inputs are truncated); training used 32" in (folder / "README.md").read_text()


# ----------------------------------------------------------------------------- max_seq_length at inference
def save_sentence_transformers_base(encoder_path: str, folder: Path, max_seq_length: int, legacy: bool) -> str:
    """A sentence-transformers model around `encoder_path` that truncates at `max_seq_length`.

    legacy: the length is in sentence_bert_config.json and the tokenizer says 512, as in all-MiniLM-L6-v2;
    otherwise it is only the tokenizer's model_max_length, as sentence-transformers >= 6 saves it.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    transformer = Transformer(encoder_path, max_seq_length=max_seq_length)
    SentenceTransformer(modules=[transformer, Pooling(32, pooling_mode="mean")], device="cpu").save(str(folder))
    if legacy:
        for name, key, value in (("sentence_bert_config.json", "max_seq_length", max_seq_length),
                                 ("tokenizer_config.json", "model_max_length", 512)):
            config = json.loads((folder / name).read_text())
            config[key] = value
            (folder / name).write_text(json.dumps(config))
    assert SentenceTransformer(str(folder), device="cpu").max_seq_length == max_seq_length
    return str(folder)


@pytest.mark.parametrize("legacy", [True, False], ids=["sentence_bert_config", "tokenizer_config"])
def test_base_models_length_is_recorded_and_exported_after_the_base_is_gone(tiny_encoder, tmp_path, legacy):
    import shutil

    from sentence_transformers import SentenceTransformer

    base = save_sentence_transformers_base(tiny_encoder, tmp_path / "base", 40, legacy)
    model, tokenizer = make_checkpoint(base, tmp_path / "ckpt", queue_size=8, queue_init_size=4, max_seq_length=MAX_LEN)
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["base_max_seq_length"] == 40
    shutil.rmtree(base)  # e.g. exported on another machine: the recorded value is enough
    folder = export_to_sentence_transformers(tmp_path / "ckpt", tmp_path / "st", write_card=False)
    st_model = SentenceTransformer(str(folder), device="cpu")
    assert st_model.max_seq_length == 40
    got = st_model.encode(TEXTS, convert_to_tensor=True)
    assert (got.cpu() - reference_embeddings(model, tokenizer, TEXTS, max_length=40)).abs().max().item() < 1e-5


def test_checkpoint_without_recorded_length_reads_the_base_else_uses_the_position_limit(tiny_encoder, tmp_path):
    import shutil

    from sentence_transformers import SentenceTransformer

    base = save_sentence_transformers_base(tiny_encoder, tmp_path / "base", 40, legacy=True)
    make_checkpoint(base, tmp_path / "ckpt", queue_size=8, queue_init_size=4, max_seq_length=MAX_LEN)
    config_path = tmp_path / "ckpt" / "config.json"
    config = json.loads(config_path.read_text())
    del config["base_max_seq_length"]  # a checkpoint written before the length was recorded
    config_path.write_text(json.dumps(config))
    folder = export_to_sentence_transformers(tmp_path / "ckpt", tmp_path / "st", write_card=False)
    assert SentenceTransformer(str(folder), device="cpu").max_seq_length == 40  # read from encoder_config._name_or_path
    shutil.rmtree(base)
    folder = export_to_sentence_transformers(tmp_path / "ckpt", tmp_path / "st", overwrite=True, write_card=False)
    assert SentenceTransformer(str(folder), device="cpu").max_seq_length == INFERENCE_LEN


def test_max_seq_length_flag_and_bad_values(exports, tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    model, tokenizer, folder = exports["mean"]
    checkpoint = folder.parent / "ckpt-mean"
    code, _, err = run_cli(["export", str(checkpoint), str(tmp_path / "st"), "--max_seq_length", "48"], capsys)
    assert code == 0, err
    st_model = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    assert st_model.max_seq_length == 48
    got = st_model.encode(TEXTS, convert_to_tensor=True)
    assert (got.cpu() - reference_embeddings(model, tokenizer, TEXTS, max_length=48)).abs().max().item() < 1e-5
    card = (tmp_path / "st" / "README.md").read_text()
    assert f"48 tokens at inference (longer inputs are truncated); training used {MAX_LEN} tokens" in card
    assert "as in training" not in card
    for bad in ("1", str(INFERENCE_LEN + 1)):
        code, _, err = run_cli(["export", str(checkpoint), str(tmp_path / f"bad{bad}"), "--max_seq_length", bad], capsys)
        assert code == 2 and f"max_seq_length {bad}" in err and str(INFERENCE_LEN) in err
        assert not (tmp_path / f"bad{bad}").exists()


def test_verify_export_catches_truncation_at_the_training_length(exports, tmp_path):
    import shutil

    model, tokenizer, folder = exports["cls"]
    lengths = sorted(len(ids) for ids in tokenizer(probe_sentences(tokenizer, INFERENCE_LEN, MAX_LEN))["input_ids"])
    assert lengths[-2] >= 2 * MAX_LEN and lengths[-1] > INFERENCE_LEN
    assert verify_export(folder, model, tokenizer, INFERENCE_LEN) < 1e-5
    old_style = shutil.copytree(folder, tmp_path / "old-style")
    config = json.loads((old_style / "tokenizer_config.json").read_text())
    config["model_max_length"] = MAX_LEN  # what exports made before truncated at
    (old_style / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match=rf"differs from the checkpoint's embed\(\) at max_seq_length {INFERENCE_LEN}"):
        verify_export(old_style, model, tokenizer, INFERENCE_LEN)


def test_position_limit_minds_roberta_offset_and_tokenizer_sentinel(tmp_path):
    from conftest import build_tiny_encoder
    from sentence_transformers import SentenceTransformer

    from hf_mocose.models.encoding import inference_max_seq_length

    roberta = build_tiny_encoder(tmp_path / "roberta", model_type="roberta")  # 128 position embeddings
    model, tokenizer = make_checkpoint(roberta, tmp_path / "ckpt", queue_size=8, queue_init_size=4, max_seq_length=MAX_LEN)
    folder = export_to_sentence_transformers(tmp_path / "ckpt", tmp_path / "st", write_card=False)  # verified on long probes
    assert SentenceTransformer(str(folder), device="cpu").max_seq_length == 126  # RoBERTa reserves padding_idx + 1
    tokenizer.model_max_length = int(1e30)  # transformers' "no limit" sentinel
    assert inference_max_seq_length(model.config, tokenizer) == (126, "the encoder's position limit")
    assert inference_max_seq_length(model.config, tokenizer, 64) == (64, "given explicitly")


@pytest.mark.parametrize("pooling", POOLINGS)
def test_a_bf16_checkpoint_exports_within_bf16_rounding(tiny_encoder, tmp_path, pooling):
    """DeepSpeed with bf16 saves bf16 weights: the export and `embed` then compute in bf16 along different paths and
    differ by up to a bf16 rounding step (mean pooling: 0.0078 here), which failed the 1e-5 check before."""
    model, tokenizer = make_checkpoint(tiny_encoder, tmp_path / "ckpt", sentence_pooling=pooling, queue_size=8,
                                       queue_init_size=4, max_seq_length=MAX_LEN)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "ckpt")  # over the fp32 weights; the tokenizer stays
    folder = export_to_sentence_transformers(tmp_path / "ckpt", tmp_path / "st", write_card=False)
    diff = verify_export(folder, model, tokenizer, INFERENCE_LEN)
    reference = reference_embeddings(model, tokenizer, TEXTS, INFERENCE_LEN)
    assert diff <= 2 * torch.finfo(torch.bfloat16).eps * reference.abs().max().item() + 1e-6

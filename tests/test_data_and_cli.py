"""Training data loading, the recipe parser, and bad input caught before training starts."""

from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

from hf_mocose.commands.train import main, parse_args
from hf_mocose.data.corpus import BUILTIN_PYTHON_DOCS, load_sentences, python_docs_sentences, tokenize_sentences


def test_text_file_skips_blank_lines(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text("first sentence\n\n   \nsecond sentence\n")
    assert load_sentences(str(path))["text"] == ["first sentence", "second sentence"]


def test_csv_with_text_column(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("id,sentence\n1,hello there\n2,general kenobi\n")
    assert load_sentences(str(path), text_column="sentence")["text"] == ["hello there", "general kenobi"]
    with pytest.raises(ValueError, match="text_column 'text' is not in .*id, sentence"):
        load_sentences(str(path))


def test_jsonl(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "a b c"}\n{"text": ""}\n{"text": "d e f"}\n')
    assert load_sentences(str(path))["text"] == ["a b c", "d e f"]


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_sentences(str(tmp_path / "nope.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="no non-empty sentences"):
        load_sentences(str(empty))
    with pytest.raises(ValueError, match="unsupported extension '.xml'"):
        (tmp_path / "a.xml").write_text("x")
        load_sentences(str(tmp_path / "a.xml"))
    with pytest.raises(ValueError, match="No training data"):
        load_sentences()


def test_builtin_corpus_and_truncation(tiny_encoder):
    sentences = python_docs_sentences()
    assert len(sentences) > 1000 and all(s.strip() for s in sentences)
    dataset = load_sentences(BUILTIN_PYTHON_DOCS, max_train_samples=50)
    assert len(dataset) == 50
    tokenizer = AutoTokenizer.from_pretrained(tiny_encoder)
    long_sentence = {"text": [" ".join(["word"] * 200)]}
    from datasets import Dataset

    tokenized = tokenize_sentences(Dataset.from_dict(long_sentence), tokenizer, max_seq_length=12)
    assert len(tokenized[0]["input_ids"]) == 12


def test_recipe_plus_command_line_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"train_file": "x.txt", "queue_size": 64, "learning_rate": 1e-4, "output_dir": str(tmp_path)}))
    script, args = parse_args([str(recipe), "--queue_size", "128", "--use_cpu", "true"])
    assert script.train_file == "x.txt"
    assert args.queue_size == 128 and args.learning_rate == 1e-4
    assert args.contrastive_temperature == 0.05 and args.ddp_broadcast_buffers is False


def test_null_on_the_command_line_resets_an_optional_number(tmp_path, capsys):
    """`--head_learning_rate null` gives the paper's single learning rate, as `null` does in a recipe."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"train_file": "x.txt", "output_dir": str(tmp_path)}))
    assert parse_args([str(recipe)])[1].head_learning_rate == 1e-3  # the default
    _, args = parse_args([str(recipe), "--head_learning_rate", "null", "--ema_decay_horizon", "None"])
    assert args.head_learning_rate is None and args.ema_decay_horizon is None
    assert parse_args([str(recipe), "--head_learning_rate", "0.01"])[1].head_learning_rate == 0.01
    with pytest.raises(SystemExit):
        parse_args([str(recipe), "--head_learning_rate", "fast"])
    assert "invalid float (or null) value: 'fast'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a number that may not be None still refuses null
        parse_args([str(recipe), "--queue_size", "null"])


def test_recipe_with_unknown_field(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("queue_sise: 64\n")
    with pytest.raises(ValueError, match="queue_sise"):
        parse_args([str(recipe)])


def test_missing_train_file_fails_before_training(tiny_encoder, tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        main(["--model_name_or_path", tiny_encoder, "--train_file", str(tmp_path / "missing.txt"),
              "--output_dir", str(tmp_path), "--use_cpu", "true", "--eval_strategy", "no"])


def test_missing_stsb_dev(tiny_encoder, tmp_path):
    base = ["--model_name_or_path", tiny_encoder, "--train_file", BUILTIN_PYTHON_DOCS, "--output_dir", str(tmp_path),
            "--use_cpu", "true", "--stsb_dev_file", str(tmp_path / "sts-dev.csv")]
    with pytest.raises(FileNotFoundError, match="sts-dev.csv"):
        main(base)


def test_not_an_encoder_fails_before_training(tmp_path):
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model("gpt2", n_layer=1, n_head=2, n_embd=8, vocab_size=50)
    AutoModel.from_config(config).save_pretrained(tmp_path / "gpt2")
    tok = AutoTokenizer.from_pretrained(__import__("conftest").minilm_path())
    tok.save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="not a bidirectional encoder"):
        main(["--model_name_or_path", str(tmp_path / "gpt2"), "--train_file", BUILTIN_PYTHON_DOCS,
              "--output_dir", str(tmp_path / "o"), "--use_cpu", "true", "--eval_strategy", "no"])


def test_main_end_to_end_tiny(tiny_encoder, tmp_path, capsys):
    final = main(["--model_name_or_path", tiny_encoder, "--train_file", BUILTIN_PYTHON_DOCS, "--max_train_samples", "32",
                  "--per_device_train_batch_size", "8", "--max_steps", "3", "--queue_size", "16", "--queue_init_size", "4",
                  "--output_dir", str(tmp_path), "--use_cpu", "true", "--eval_strategy", "no", "--save_steps", "2",
                  "--disable_tqdm", "true", "--max_seq_length", "16", "--export_max_seq_length", "48"])
    out = capsys.readouterr().out
    assert f"Saved the final MoCoSE checkpoint to {final}" in out
    assert "No STS-B dev score" in out
    from hf_mocose import MoCoSEModel

    model = MoCoSEModel.from_pretrained(final)
    assert int(model.queue.queue_fill) == 16
    assert (tmp_path / "checkpoint-2" / "model.safetensors").is_file()
    assert (tmp_path / "final" / "tokenizer.json").is_file()
    # the end-of-training export: a sentence-transformers folder with its model card
    export = tmp_path / "sentence-transformers"
    assert f"Saved the sentence-transformers export (with its model card) to {export}" in out
    assert (export / "modules.json").is_file() and (export / "README.md").is_file()
    from sentence_transformers import SentenceTransformer

    st_model = SentenceTransformer(str(export))
    assert st_model.encode(["a sentence"]).shape == (1, 32)
    assert st_model.max_seq_length == 48 and model.config.max_seq_length == 16  # inference length, training length
    assert "48 tokens at inference (longer inputs are truncated); training used 16 tokens" in (export / "README.md").read_text()
    # scripts/train.py keeps the text beside the tokens, so the card's training data shows the sentences as written
    card = (export / "README.md").read_text()
    first = python_docs_sentences()[0]
    assert "* Size: 32 training sentences" in card and f"<code>{first[:40]}" in card and "decoded from the tokens" not in card


def test_export_length_default_and_bad_value_fails_before_training(tiny_encoder, tmp_path):
    from sentence_transformers import SentenceTransformer

    argv = ["--model_name_or_path", tiny_encoder, "--train_file", BUILTIN_PYTHON_DOCS, "--max_train_samples", "16",
            "--per_device_train_batch_size", "8", "--max_steps", "1", "--queue_size", "16", "--queue_init_size", "4",
            "--use_cpu", "true", "--eval_strategy", "no", "--save_strategy", "no", "--disable_tqdm", "true"]
    with pytest.raises(ValueError, match="max_seq_length 4096 for the export is out of range.*128"):
        main([*argv, "--output_dir", str(tmp_path / "bad"), "--export_max_seq_length", "4096"])
    assert not (tmp_path / "bad" / "final").exists()  # refused before training, not after
    main([*argv, "--output_dir", str(tmp_path / "ok")])
    # tiny encoder: no sentence-transformers config, 128 position embeddings; training used 32 (the default)
    assert SentenceTransformer(str(tmp_path / "ok" / "sentence-transformers")).max_seq_length == 128


def test_interrupted_run_resumes_from_last_checkpoint(tiny_encoder, tmp_path, monkeypatch):
    """Ctrl-C mid-training leaves the last checkpoint; `--resume_from_checkpoint last` finishes the run exactly."""
    import torch

    from hf_mocose import MoCoSEModel
    from hf_mocose.trainer.mocose_trainer import MoCoSETrainer

    def argv(out):
        return ["--model_name_or_path", tiny_encoder, "--train_file", BUILTIN_PYTHON_DOCS, "--max_train_samples", "64",
                "--per_device_train_batch_size", "8", "--max_steps", "6", "--queue_size", "16", "--queue_init_size", "4",
                "--output_dir", str(out), "--use_cpu", "true", "--eval_strategy", "no", "--save_steps", "2",
                "--disable_tqdm", "true", "--fgsm_epsilon", "0.01"]

    reference = MoCoSEModel.from_pretrained(main(argv(tmp_path / "reference")))

    calls = {"n": 0}
    original = MoCoSETrainer.training_step

    def interrupted(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MoCoSETrainer, "training_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(argv(tmp_path / "run"))
    assert (tmp_path / "run" / "checkpoint-2").is_dir() and not (tmp_path / "run" / "final").exists()
    monkeypatch.setattr(MoCoSETrainer, "training_step", original)
    resumed = MoCoSEModel.from_pretrained(main(argv(tmp_path / "run") + ["--resume_from_checkpoint", "last"]))
    for name, tensor in reference.state_dict().items():
        assert torch.allclose(tensor, resumed.state_dict()[name], atol=1e-6), name


@pytest.mark.parametrize("env", [{"ACCELERATE_USE_FSDP": "true"}, {"ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}])
def test_sharded_launch_refused_before_building_the_model(tmp_path, monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="does not support (FSDP|DeepSpeed ZeRO stage 3)"):
        main(["--model_name_or_path", "/nonexistent", "--train_file", BUILTIN_PYTHON_DOCS, "--output_dir", str(tmp_path),
              "--use_cpu", "true", "--eval_strategy", "no"])


def test_unreachable_target_mtd_refused_before_building_the_model(tmp_path):
    """The queue window target_mtd needs at the launch's global batch is checked before anything is loaded (the
    model path does not even exist); MoCoSETrainer checks it again with the model's own queue_size."""
    with pytest.raises(ValueError, match="target_mtd=14.67 needs 683 queue entries at eta=0.75 with global batch 64, "
                                         "but queue_size is 512"):
        main(["--model_name_or_path", "/nonexistent", "--train_file", BUILTIN_PYTHON_DOCS, "--output_dir", str(tmp_path),
              "--use_cpu", "true", "--eval_strategy", "no", "--per_device_train_batch_size", "64", "--queue_size", "512",
              "--queue_init_size", "512", "--ema_decay_start", "0.75", "--ema_decay_end", "0.9", "--target_mtd", "14.67"])


def test_every_export_names_the_base_model(tiny_encoder, tmp_path, capsys):
    """The checkpoint config carries base_model_name_or_path, so a later `hf-mocose export` names it too."""
    import json

    from huggingface_hub import ModelCard

    from hf_mocose.commands import cli

    common = ["--model_name_or_path", tiny_encoder, "--train_file", BUILTIN_PYTHON_DOCS, "--max_train_samples", "16",
              "--per_device_train_batch_size", "4", "--max_steps", "2", "--queue_size", "8", "--queue_init_size", "4",
              "--use_cpu", "true", "--eval_strategy", "no", "--save_steps", "2", "--disable_tqdm", "true"]
    main([*common, "--output_dir", str(tmp_path / "named"), "--base_model", "alice/tiny-bert"])
    checkpoint = tmp_path / "named" / "checkpoint-2"
    assert json.loads((checkpoint / "config.json").read_text())["base_model_name_or_path"] == "alice/tiny-bert"
    assert ModelCard.load(tmp_path / "named" / "sentence-transformers" / "README.md").data.base_model == "alice/tiny-bert"
    assert cli.main(["export", str(checkpoint), str(tmp_path / "exported")]) == 0
    assert ModelCard.load(tmp_path / "exported" / "README.md").data.base_model == "alice/tiny-bert"
    # a local folder start with no Hub id: the folder is recorded, the card names no base model, --base_model sets it
    main([*common, "--output_dir", str(tmp_path / "local")])
    config = json.loads((tmp_path / "local" / "final" / "config.json").read_text())
    assert config["base_model_name_or_path"] == str(Path(tiny_encoder).resolve())
    assert ModelCard.load(tmp_path / "local" / "sentence-transformers" / "README.md").data.base_model is None
    assert cli.main(["export", str(tmp_path / "local" / "final"), str(tmp_path / "set"), "--base_model", "bob/enc"]) == 0
    assert ModelCard.load(tmp_path / "set" / "README.md").data.base_model == "bob/enc"


def test_base_model_id_from_a_hub_cache_path(tmp_path):
    from hf_mocose.models.configuration import base_model_id

    snapshot = tmp_path / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    assert base_model_id(snapshot) == "sentence-transformers/all-MiniLM-L6-v2"
    assert base_model_id("google-bert/bert-base-uncased") == "google-bert/bert-base-uncased"
    assert base_model_id(tmp_path / "hub") == str((tmp_path / "hub").resolve())


@pytest.mark.slow
def test_builtin_minilm_start_names_its_hub_id(tmp_path, capsys):
    import json

    from huggingface_hub import ModelCard

    main(["--model_name_or_path", "builtin:all-MiniLM-L6-v2", "--train_file", BUILTIN_PYTHON_DOCS,
          "--max_train_samples", "8", "--per_device_train_batch_size", "4", "--max_steps", "1", "--queue_size", "8",
          "--queue_init_size", "4", "--use_cpu", "true", "--eval_strategy", "no", "--save_strategy", "no",
          "--output_dir", str(tmp_path), "--disable_tqdm", "true"])
    config = json.loads((tmp_path / "final" / "config.json").read_text())
    assert config["base_model_name_or_path"] == "sentence-transformers/all-MiniLM-L6-v2"
    card = ModelCard.load(tmp_path / "sentence-transformers" / "README.md")
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"

"""What is refused before the first step, in one line that names the file, line, folder or flag and what to do,
with nothing lost: bytes that are not UTF-8, an output folder that cannot be written or holds another run, a
checkpoint of another model, precision flags against a recipe's `auto`, a push offline without a token; and data
short of one batch, named in one warning. Each under `scripts/train.py` (`cli_main`) and the Python front ends
where it applies."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, build_tiny_encoder, make_st_trainer, make_trainer, run_cli

from hf_mocose.commands import train
from hf_mocose.commands.train import cli_main, parse_args
from hf_mocose.launch.run_folder import LOCK_FILE, OWNER_FILE

DEBUG_HINT = " (HF_MOCOSE_DEBUG=1 shows the traceback)"
QUICKSTART = str(REPO_ROOT / "training_args" / "quickstart.yaml")


def write_corpus(path: Path, n: int = 32, extra: bytes = b"") -> Path:
    path.write_bytes("".join(f"Sentence number {i} is about a small thing.\n" for i in range(n)).encode() + extra)
    return path


def train_argv(encoder: str, corpus: Path, out: Path, *extra: str, steps: int = 2) -> list[str]:
    return ["--model_name_or_path", encoder, "--train_file", str(corpus), "--per_device_train_batch_size", "8",
            "--max_steps", str(steps), "--queue_size", "16", "--queue_init_size", "4", "--max_seq_length", "16",
            "--output_dir", str(out), "--use_cpu", "true", "--eval_strategy", "no", "--save_steps", "2",
            "--disable_tqdm", "true", "--report_to", "none", "--export_sentence_transformers", "false", *extra]


def refusal(capsys) -> str:
    """The one line a refused `cli_main` printed (stderr may also hold `datasets`' progress bars before it)."""
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train.py: error: ")]
    assert len(lines) == 1, lines
    assert lines[0].endswith(DEBUG_HINT)
    return lines[0][len("train.py: error: "):-len(DEBUG_HINT)]


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Size and time of each file of `folder`, but the run lock's (each run takes it, launch.run_folder)."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))
            if not p.name.startswith((LOCK_FILE, OWNER_FILE))}


@pytest.fixture
def no_model_load(monkeypatch):
    monkeypatch.setattr(train, "build_mocose_model", lambda *a, **k: pytest.fail("the model was loaded"))


# ----------------------------------------------------------------------------- a byte that is not UTF-8
@pytest.mark.parametrize("suffix, streaming", [(".txt", "false"), (".txt", "true"), (".jsonl", "false")])
def test_a_bad_byte_names_the_file_and_line_before_the_model_loads(suffix, streaming, tmp_path, capsys, no_model_load):
    corpus = tmp_path / f"corpus{suffix}"
    if suffix == ".jsonl":
        corpus.write_bytes(b'{"text": "A fine line."}\n' * 3 + b'{"text": "caf\xe9 au lait"}\n')
    else:
        write_corpus(corpus, n=6, extra="Ünïcode is fine.\n".encode() + b"caf\xe9 au lait\n")
    out = tmp_path / "run"
    assert cli_main(train_argv("unused", corpus, out, "--streaming", streaming)) == 2
    line = 4 if suffix == ".jsonl" else 8  # Latin-1 "é": a UTF-8 lead byte without its continuation bytes
    assert refusal(capsys) == (f"train_file '{corpus}' is not UTF-8 text: line {line} holds the byte(s) e9 (invalid "
                               "continuation byte). Save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8), or fix or "
                               "remove that line.")
    assert not out.exists()


def test_the_python_loader_names_a_bad_byte_too(tmp_path):
    from hf_mocose.data.corpus import load_sentences

    corpus = write_corpus(tmp_path / "corpus.txt", n=3, extra=b"caf\xe9 au lait\n")
    with pytest.raises(ValueError, match=f"^train_file '{corpus}' is not UTF-8 text: line 4 holds the byte\\(s\\) e9"):
        load_sentences(str(corpus))


# ----------------------------------------------------------------------------- an output folder that cannot be written
def unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process cannot create files in: a read-only one (not for root), else one on sysfs."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys/kernel")):
        try:
            tempfile.NamedTemporaryFile(dir=candidate).close()
        except OSError:
            return candidate
    pytest.skip("no folder this user cannot write to (root, and no /sys/kernel)")


def test_an_unwritable_output_dir_is_refused_before_the_model_loads(tmp_path, capsys, no_model_load):
    folder = unwritable_folder(tmp_path)
    out = folder / "run"
    assert cli_main(train_argv("unused", write_corpus(tmp_path / "c.txt"), out)) == 2
    line = refusal(capsys)
    assert line.startswith(f"output_dir '{out}' cannot be written (") and not out.exists()
    assert line.endswith(f": {folder}), so the training would be lost at its first save: give a writable --output_dir.")


def test_an_unwritable_output_dir_is_refused_by_both_python_front_ends(tiny_encoder, tmp_path):
    folder = unwritable_folder(tmp_path)  # exists: the trainers' own makedirs passes, the first save would not
    trainer = make_trainer(tiny_encoder, folder, save_strategy="steps", save_steps=2)
    with pytest.raises(ValueError, match=f"output_dir '{folder}' cannot be written .* give a writable --output_dir"):
        trainer.train()
    assert trainer.state.global_step == 0
    st_trainer = make_st_trainer(tiny_encoder, folder, save_strategy="steps", save_steps=2)
    with pytest.raises(ValueError, match=f"output_dir '{folder}' cannot be written"):
        st_trainer.train()
    assert st_trainer.state.global_step == 0


# ----------------------------------------------------------------------------- a folder that holds another run
def test_a_folder_of_another_run_is_refused_then_overwritten_on_request(tiny_encoder, tmp_path, capsys):
    corpus, out = write_corpus(tmp_path / "c.txt"), tmp_path / "run"
    assert cli_main(train_argv(tiny_encoder, corpus, out, "--save_total_limit", "5", steps=4)) == 0
    before = snapshot(out)
    capsys.readouterr()
    assert cli_main(train_argv(tiny_encoder, corpus, out, "--save_total_limit", "1")) == 2
    assert refusal(capsys) == (
        f"output_dir '{out}' holds another run's checkpoints (checkpoint-2, checkpoint-4): continue that run with "
        "--resume_from_checkpoint last, start afresh there with --overwrite_output_dir true (deletes them first), or "
        "give a fresh --output_dir.")
    assert snapshot(out) == before  # save_total_limit deleted nothing, nothing was written
    # the run continues its own folder; --overwrite_output_dir starts afresh there without the old checkpoints
    assert cli_main(train_argv(tiny_encoder, corpus, out, "--resume_from_checkpoint", str(out / "checkpoint-2"),
                               steps=4)) == 0
    assert cli_main(train_argv(tiny_encoder, corpus, out, "--overwrite_output_dir", "true", "--save_steps", "3",
                               steps=3)) == 0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"]


def test_a_folder_of_another_run_is_refused_by_both_python_front_ends(tiny_encoder, tmp_path):
    out = tmp_path / "run"
    make_trainer(tiny_encoder, out, save_strategy="steps", save_steps=2, max_steps=2).train()
    with pytest.raises(ValueError, match="holds another run's checkpoints \\(checkpoint-2\\): continue that run with "
                                         "--resume_from_checkpoint last, start afresh there with --overwrite_output_dir"):
        make_trainer(tiny_encoder, out, save_strategy="steps", save_steps=2, max_steps=2).train()
    again = make_trainer(tiny_encoder, out, save_strategy="steps", save_steps=3, max_steps=3, overwrite_output_dir=True)
    again.train()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"]
    st_out = tmp_path / "st"
    make_st_trainer(tiny_encoder, st_out, save_strategy="steps", save_steps=2, max_steps=2).train()
    st_trainer = make_st_trainer(tiny_encoder, st_out, save_strategy="steps", save_steps=2, max_steps=2)
    with pytest.raises(ValueError, match="\\(checkpoint-2\\): continue that run with --resume_from_checkpoint last, "
                                         "or give a fresh --output_dir"):
        st_trainer.train()
    assert st_trainer.state.global_step == 0


# ----------------------------------------------------------------------------- a checkpoint of another model
def test_a_checkpoint_of_another_encoder_type_of_the_same_shapes_is_refused_before_its_state_loads(
        tiny_encoder, tmp_path, capsys, monkeypatch):
    from transformers import Trainer

    roberta = build_tiny_encoder(tmp_path / "tiny-roberta", "roberta")
    corpus, out = write_corpus(tmp_path / "c.txt"), tmp_path / "run"
    assert cli_main(train_argv(roberta, corpus, out)) == 0
    before = snapshot(out)
    capsys.readouterr()
    monkeypatch.setattr(Trainer, "_load_from_checkpoint", lambda *a, **k: pytest.fail("the checkpoint was loaded"))
    assert cli_main(train_argv(tiny_encoder, corpus, out, "--resume_from_checkpoint", "last", steps=4)) == 2
    assert refusal(capsys) == (
        f"Cannot resume from {out / 'checkpoint-2'}: it was saved by another model than this run's "
        "(encoder_config.model_type='roberta' in the checkpoint, encoder_config.model_type='bert' in this run; "
        "tensor shapes, checkpoint vs this run: equal). Resume with the checkpoint's model and settings, or start a "
        "new run in another output_dir.")
    assert snapshot(out) == before


def test_mocose_loss_refuses_a_checkpoint_of_another_encoder_type_before_its_loss_state_loads(tiny_encoder, tmp_path):
    roberta = build_tiny_encoder(tmp_path / "tiny-roberta", "roberta")
    out = tmp_path / "st"
    make_st_trainer(roberta, out, save_strategy="steps", save_steps=2, max_steps=2).train()
    before = snapshot(out)
    trainer = make_st_trainer(tiny_encoder, out, save_strategy="steps", save_steps=2, max_steps=4)
    queue = trainer.loss.queue.state_dict()
    with pytest.raises(ValueError, match=f"^Cannot resume from {out / 'checkpoint-2'}: it was saved by another model "
                                         "than this run's \\(encoder_config.model_type='roberta' in the checkpoint, "
                                         "encoder_config.model_type='bert' in this run; tensor shapes, checkpoint vs "
                                         "this run: equal\\)"):
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert snapshot(out) == before and trainer.state.global_step == 2
    assert all(torch.equal(t, queue[k]) for k, t in trainer.loss.queue.state_dict().items())  # not loaded


def test_mocose_loss_refuses_a_loss_state_of_another_method(tiny_encoder, tmp_path):
    out = tmp_path / "st"
    make_st_trainer(tiny_encoder, out, save_strategy="steps", save_steps=2, max_steps=2).train()
    other = make_st_trainer(tiny_encoder, tmp_path / "other", loss_kwargs={"method": "esimcse"}).loss
    with pytest.raises(ValueError, match="it was saved by another model than this run's \\(method='mocose' in the "
                                         "checkpoint, method='esimcse' in this run; tensor shapes"):
        other.load_state(out / "checkpoint-2")


def test_a_checkpoint_of_another_method_is_refused_naming_it(tiny_encoder, tmp_path):
    from hf_mocose import MoCoSEModel
    from hf_mocose.launch.checkpoints import check_resume_compatible

    trainer = make_trainer(tiny_encoder, tmp_path / "run", save_strategy="steps", save_steps=2, max_steps=2)
    trainer.train()
    settings = {name: getattr(trainer.model.config, name) for name in ("queue_size", "queue_init_size", "max_seq_length")}
    other = MoCoSEModel.from_pretrained(tiny_encoder, method="esimcse", **settings)
    with pytest.raises(ValueError, match="it was saved by another model than this run's \\(method='mocose' in the "
                                         "checkpoint, method='esimcse' in this run; tensor shapes"):
        check_resume_compatible(tmp_path / "run" / "checkpoint-2", other)


# ----------------------------------------------------------------------------- data short of one batch
SHORT = ("{what} has 5 sentence(s), fewer than one batch of 8 (per_device_train_batch_size 8 x 1 process(es)): every "
         "step trains on those 5. Give at least 8 sentences for the batch asked for, or a smaller "
         "--per_device_train_batch_size.")


def warned(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "fewer than one batch" in r.getMessage()]


def test_a_corpus_smaller_than_one_batch_is_named_in_one_line(tiny_encoder, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="hf_mocose")
    assert cli_main(train_argv(tiny_encoder, write_corpus(tmp_path / "c.txt", n=5), tmp_path / "run")) == 0
    assert warned(caplog) == [SHORT.format(what="train_dataset")]


def test_data_smaller_than_one_batch_is_named_by_both_python_front_ends(tiny_encoder, tmp_path, caplog):
    from datasets import Dataset

    caplog.set_level(logging.WARNING, logger="hf_mocose")
    make_trainer(tiny_encoder, tmp_path / "run", n_sentences=5, per_device_train_batch_size=8, max_steps=1).train()
    assert warned(caplog) == [SHORT.format(what="train_dataset")]
    caplog.clear()
    make_st_trainer(tiny_encoder, tmp_path / "st", dataset=Dataset.from_dict({"text": [f"s {i}" for i in range(5)]}),
                    loss_kwargs={"queue_size": 4, "queue_init_size": 4}, per_device_train_batch_size=8,
                    max_steps=1).train()
    assert warned(caplog) == [SHORT.format(what="The training data")]


# ----------------------------------------------------------------------------- precision flags and a recipe's auto
def test_an_explicit_fp16_wins_over_the_recipes_auto_and_gets_the_cpu_refusal(tiny_encoder, tmp_path, capsys,
                                                                           monkeypatch):
    monkeypatch.setattr(train, "choose_auto_bf16", lambda *a, **k: (True, "as on a CPU with native bf16"))
    _, args = parse_args([QUICKSTART, "--fp16", "true", "--output_dir", str(tmp_path / "run")])
    assert args.fp16 and not args.bf16  # the recipe's bf16: auto stands aside (it was "both" before)
    flags = ["--model_name_or_path", tiny_encoder, "--max_train_samples", "64", "--max_seq_length", "16",
             "--queue_size", "32", "--output_dir", str(tmp_path / "run")]
    assert cli_main([QUICKSTART, *flags, "--fp16", "true", "--use_cpu", "true"]) == 2
    assert refusal(capsys).startswith("fp16=True does nothing when training on the CPU")
    assert not list((tmp_path / "run").glob("checkpoint-*"))


@pytest.mark.skipif(torch.accelerator.is_available(), reason="on a machine with an accelerator bf16 trains there")
def test_an_explicit_bf16_trains_on_the_cpu_as_auto_does(tiny_encoder, tmp_path):
    _, args = parse_args([QUICKSTART, "--bf16", "true", "--output_dir", str(tmp_path / "run")])
    assert args.bf16 and args.use_cpu and args.device.type == "cpu"  # was: "Your setup doesn't support bf16/gpu"
    trainer = make_trainer(tiny_encoder, tmp_path / "api", bf16=True, use_cpu=False, max_steps=1)
    assert trainer.args.use_cpu and trainer.accelerator.mixed_precision == "bf16"
    trainer.train()
    assert trainer.state.global_step == 1


# ----------------------------------------------------------------------------- a push offline without a token
def test_a_push_offline_without_a_token_says_both_in_one_line(tiny_encoder, tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants as constants

    from hf_mocose.publishing.hub import HubPushError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token-file"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    export = tmp_path / "export"
    export.mkdir()
    (export / "modules.json").write_text("[]")
    code, _, err = run_cli(["push", str(export), "--repo_id", "alice/tiny-mocose"], capsys)
    both = ("Offline mode is on (HF_HUB_OFFLINE=1) and no Hugging Face token is set (HF_TOKEN, or `hf auth login`): "
            "unset it, and set a token, to upload to the Hub.")
    assert code == 1 and err.splitlines() == [f"hf-mocose push: error: {both}"]
    with pytest.raises(HubPushError) as info:  # the trainer's push makes its repo when it is built
        make_trainer(tiny_encoder, tmp_path / "run", push_to_hub=True, hub_model_id="alice/tiny-mocose")
    assert str(info.value) == both
    capsys.readouterr()
    monkeypatch.setenv("HF_TOKEN", "hf_probe")
    code, _, err = run_cli(["push", str(export), "--repo_id", "alice/tiny-mocose"], capsys)
    assert err.splitlines() == ["hf-mocose push: error: Offline mode is on (HF_HUB_OFFLINE=1): unset it to upload to "
                                "the Hub."]

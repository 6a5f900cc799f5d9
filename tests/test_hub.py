"""`hf-mocose push` end to end through the real huggingface_hub client, against a local fake Hub.

The fake Hub (a `ThreadingHTTPServer` on 127.0.0.1, free port) answers the endpoints the client
calls for create-repo, create-branch, README validation, preupload and commit. It answers
"regular" to every preupload question, so files travel base64-encoded inside the commit's NDJSON
payload (the server decides upload modes; the client follows), and it keeps what arrives.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli
from fake_hub import TOKEN, fake_hub  # noqa: F401 (the fixture)

from hf_mocose.publishing.hub import HubPushError, list_upload_files, push_export, validate_repo_id


@pytest.fixture(scope="module")
def export_dir(tiny_encoder, tmp_path_factory):
    from transformers import AutoTokenizer

    from hf_mocose import MoCoSEModel
    from hf_mocose.publishing.export import export_to_sentence_transformers

    root = tmp_path_factory.mktemp("hub")
    model = MoCoSEModel.from_encoder(tiny_encoder, sentence_pooling="cls_dense", queue_size=8, queue_init_size=4)
    model.save_pretrained(root / "ckpt")
    AutoTokenizer.from_pretrained(tiny_encoder).save_pretrained(root / "ckpt")
    return export_to_sentence_transformers(root / "ckpt", root / "export", verify=False, repo_id="alice/tiny-mocose")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("xet", [True, False], ids=["xet-installed-path", "legacy-path"])
def test_push_uploads_export_byte_for_byte(fake_hub, export_dir, capsys, monkeypatch, xet):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", not xet)  # both upload_folder code paths
    before = snapshot(export_dir)
    code, out, err = run_cli(["push", str(export_dir), "--repo_id", "alice/tiny-mocose"], capsys)
    assert code == 0, err
    assert fake_hub.files[("alice/tiny-mocose", "main")] == before
    assert f"{fake_hub.url}/alice/tiny-mocose/commit/" in out
    assert TOKEN not in out + err
    assert snapshot(export_dir) == before
    assert ("POST", "/api/repos/create") in fake_hub.requests


def test_push_to_branch_creates_it(fake_hub, export_dir):
    url = push_export(export_dir, "alice/tiny-mocose", revision="v1", commit_message="first")
    assert url.startswith(f"{fake_hub.url}/alice/tiny-mocose/commit/")
    assert ("alice/tiny-mocose", "v1") in fake_hub.branches
    assert fake_hub.files[("alice/tiny-mocose", "v1")] == snapshot(export_dir)


def test_dry_run_sends_nothing(fake_hub, export_dir, capsys):
    code, out, _ = run_cli(["push", str(export_dir), "--repo_id", "alice/tiny-mocose", "--dry_run"], capsys)
    assert code == 0
    assert fake_hub.requests == []
    listed = list_upload_files(export_dir)
    assert [path for path, _ in listed] == sorted(snapshot(export_dir))
    for path, size in listed:
        assert f"  {path}\t{size}" in out
    assert "nothing was sent" in out


def test_missing_token_is_a_clear_error(fake_hub, export_dir, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    before = snapshot(export_dir)
    code, _, err = run_cli(["push", str(export_dir), "--repo_id", "alice/tiny-mocose"], capsys)
    assert code == 1
    assert "No Hugging Face token found" in err and "HF_TOKEN" in err
    assert fake_hub.requests == []
    assert snapshot(export_dir) == before


def test_server_error_is_a_clear_error(fake_hub, export_dir):
    fake_hub.fail_create_repo = 500
    before = snapshot(export_dir)
    with pytest.raises(HubPushError) as info:
        push_export(export_dir, "alice/tiny-mocose")
    message = str(info.value)
    assert "500" in message and "alice/tiny-mocose" in message and "local folder was not changed" in message
    assert TOKEN not in message
    assert snapshot(export_dir) == before
    assert not fake_hub.files


def test_rejected_token_is_a_clear_error(fake_hub, export_dir, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(HubPushError, match="token rejected") as info:
        push_export(export_dir, "alice/tiny-mocose")
    assert "hf_wrong" not in str(info.value)


@pytest.mark.parametrize("repo_id", ["tiny-mocose", "alice/tiny/mocose", "alice/bad--name", "alice/", "/x", "a b/c"])
def test_invalid_repo_id_names_it(fake_hub, export_dir, capsys, repo_id):
    with pytest.raises(ValueError, match="Invalid repo id") as info:
        validate_repo_id(repo_id)
    assert repr(repo_id) in str(info.value)
    code, _, err = run_cli(["push", str(export_dir), "--repo_id", repo_id], capsys)
    assert code == 2 and repr(repo_id) in err
    assert fake_hub.requests == []


def test_push_refuses_a_folder_that_is_not_an_export(fake_hub, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="not a sentence-transformers export"):
        push_export(tmp_path, "alice/tiny-mocose")
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        push_export(tmp_path / "does-not-exist", "alice/tiny-mocose")
    assert fake_hub.requests == []


# ----------------------------------------------------------------------------- trainer integration
def fake_trainer(output_dir: Path, strategy: str = "end", **args):
    """The attributes of a MoCoSETrainer that the publishing hooks read."""
    from types import SimpleNamespace

    arguments = SimpleNamespace(output_dir=str(output_dir), push_to_hub=True, hub_model_id="alice/run",
                                hub_strategy=strategy, hub_revision=None, hub_private_repo=None, hub_token=None,
                                world_size=2, **args)
    state = SimpleNamespace(global_step=10, log_history=[{"loss": 1.0}, {"train_runtime": 65.0}])
    return SimpleNamespace(args=arguments, state=state, hub_model_id="alice/run", global_batch_size=16,
                           is_world_process_zero=lambda: True)


def test_publish_final_model_puts_export_at_root_and_mocose_model_in_subfolder(fake_hub, export_dir):
    from hf_mocose.publishing.hub_publishing import publish_final_model

    run_dir = export_dir.parent
    trainer = fake_trainer(run_dir, ema_decay_end=0.95, per_device_train_batch_size=8)
    exported = publish_final_model(trainer, run_dir / "ckpt", corpus="wiki1m", base_model="google-bert/bert-base-uncased",
                                   max_seq_length=40)
    assert exported == run_dir / "sentence-transformers"
    repo = fake_hub.files[("alice/run", "main")]
    root = {k: v for k, v in repo.items() if "/" not in k or k.split("/")[0] in ("1_Pooling", "2_Dense")}
    assert root == snapshot(exported)
    assert json.loads(repo["config.json"])["model_type"] == "bert"
    assert json.loads(repo["mocose/config.json"])["model_type"] == "mocose"
    card = repo["README.md"].decode()
    assert "(B = 16 sentences per optimizer step)" in card and "**Hardware:** 2 x CPU processes" in card
    assert "**Wall time:** 1m 05s" in card and 'SentenceTransformer("alice/run")' in card
    assert TOKEN not in card and "base_model: google-bert/bert-base-uncased" in card
    # The uploaded export truncates at the inference length asked for, not the training length (32), and says so.
    assert json.loads(repo["tokenizer_config.json"])["model_max_length"] == 40
    assert "40 tokens at inference (longer inputs are truncated); training used 32 tokens" in card


@pytest.mark.parametrize("strategy, folder", [("checkpoint", "last-checkpoint"), ("all_checkpoints", "checkpoint-10"),
                                              ("every_save", "mocose"), ("end", None)])
def test_push_training_checkpoint_never_touches_the_root(fake_hub, tmp_path, strategy, folder):
    from hf_mocose.publishing.hub_publishing import push_training_checkpoint

    checkpoint = tmp_path / "checkpoint-10"
    checkpoint.mkdir()
    for name in ("config.json", "model.safetensors", "optimizer.pt", "trainer_state.json"):
        (checkpoint / name).write_bytes(name.encode())
    job = push_training_checkpoint(fake_trainer(tmp_path, strategy), checkpoint)
    if folder is None:
        assert job is None and fake_hub.requests == []
        return
    job.result()
    uploaded = set(fake_hub.files[("alice/run", "main")])
    expected = {"config.json", "model.safetensors"} | ({"optimizer.pt", "trainer_state.json"} if folder != "mocose" else set())
    assert uploaded == {f"{folder}/{name}" for name in expected}


def test_unreachable_hub_is_a_clear_error(fake_hub, export_dir, monkeypatch):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(HubPushError, match="failed: .*Connect"):
        push_export(export_dir, "alice/tiny-mocose")

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


# An earlier push's files: an older export (sharded weights, a RoBERTa tokenizer, an extra file in 1_Pooling/),
# next to what the user and the repo keep (their own files, .gitattributes, a backend export, the MoCoSE model).
OLDER_EXPORT = {
    "model-00001-of-00002.safetensors": b"old shard 1", "model-00002-of-00002.safetensors": b"old shard 2",
    "model.safetensors.index.json": b"{}", "pytorch_model.bin": b"old bin", "vocab.json": b"{}",
    "merges.txt": b"old merges", "1_Pooling/old_extra.json": b"{}", "README.md": b"old card",
}
NOT_OURS = {
    ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n", "notes.md": b"mine",
    "results/README.md": b"my results", "results/scores.csv": b"1,2", "onnx/model.onnx": b"onnx",
    "3_Normalize/config.json": b"{}", "2024_runs/log.txt": b"mine", "mocose/config.json": b"{}",
    "last-checkpoint/optimizer.pt": b"opt",
}


def test_push_over_an_existing_export_deletes_exactly_the_files_it_no_longer_contains(fake_hub, export_dir):
    """One commit: the export's files added, the root export files an older push left deleted (sharded
    weights beside a new model.safetensors would load instead of it), everything else untouched."""
    fake_hub.seed("alice/tiny-mocose", {**OLDER_EXPORT, **NOT_OURS})
    head = fake_hub.heads[("alice/tiny-mocose", "main")]
    push_export(export_dir, "alice/tiny-mocose")
    new = snapshot(export_dir)
    assert fake_hub.files[("alice/tiny-mocose", "main")] == {**NOT_OURS, **new}
    assert sorted(path for _, _, path in fake_hub.deleted) == sorted(set(OLDER_EXPORT) - set(new))
    assert "README.md" in new and "1_Pooling/config.json" in new and "model.safetensors" in new
    assert len(fake_hub.commits) == 1  # additions and deletions: one commit, built on the head it read
    commit = next(raw for raw in fake_hub.raw if raw.startswith(b"POST /api/models/alice/tiny-mocose/commit/main"))
    assert f'"parentCommit": "{head}"'.encode() in commit or f'"parentCommit":"{head}"'.encode() in commit
    # A second push of the same export deletes nothing.
    push_export(export_dir, "alice/tiny-mocose")
    assert len(fake_hub.deleted) == len(set(OLDER_EXPORT) - set(new))


def test_push_fails_instead_of_deleting_what_a_concurrent_commit_added(fake_hub, export_dir, monkeypatch):
    """The commit names the head its deletions were read from: a commit landing in between makes it fail (412)."""
    from huggingface_hub import HfApi

    fake_hub.seed("alice/tiny-mocose", OLDER_EXPORT)
    listed = HfApi.list_repo_files

    def list_then_someone_pushes(self, *args, **kwargs):
        files = listed(self, *args, **kwargs)
        fake_hub.seed("alice/tiny-mocose", {**OLDER_EXPORT, "theirs.txt": b"new"})
        return files

    monkeypatch.setattr(HfApi, "list_repo_files", list_then_someone_pushes)
    with pytest.raises(HubPushError, match="412"):
        push_export(export_dir, "alice/tiny-mocose")
    assert fake_hub.files[("alice/tiny-mocose", "main")] == {**OLDER_EXPORT, "theirs.txt": b"new"}
    assert fake_hub.deleted == []


def test_push_scope_owns_export_files_and_its_folders_only():
    from hf_mocose.publishing.hub import stale_files

    def owns(path, **scope):  # a file the push owns is deleted when its upload does not have it
        return stale_files([path], [], **scope) == [path]

    root = dict(export_root=True)
    owned = ["config.json", "model.safetensors", "model-00003-of-00010.safetensors", "pytorch_model-00001-of-00002.bin",
             "tokenizer.json", "spiece.model", "1_Pooling/config.json", "2_Dense/model.safetensors"]
    kept = [".gitattributes", "README.md", "2_Dense/README.md", "mocose/config.json", "onnx/model.onnx", "data.csv",
            "2024_runs/a.txt", "3_Normalize/x", "model.onnx", "sub/config.json"]
    assert [p for p in owned + kept if owns(p, **root)] == owned
    final = dict(export_root=True, folders=("mocose",))
    assert owns("mocose/model.safetensors", **final) and not owns("mocose/README.md", **final)
    assert not owns("mocose-old/x", **final) and not owns("last-checkpoint/x", **final)
    # A folder the new export has is the export's (a module folder of another pooling, say).
    assert stale_files(["9_Extra/a", "9_Extra/b", "x/y"], ["9_Extra/a", "README.md"], **root) == ["9_Extra/b"]
    assert stale_files(["mocose/a", "mocose/b", "c"], ["mocose/a"], folders=("mocose",)) == ["mocose/b"]


def test_push_scope_in_runtime_folders_and_eval_results():
    """In `onnx/` and `openvino/` the export owns the names its runtime export writes, when it has that folder;
    in `.eval_results/` its own `hf-mocose-*.yaml`. Files made some other way stay."""
    from hf_mocose.publishing.hub import stale_files

    old = ["onnx/model.onnx", "onnx/model_quint8_avx2.onnx", "onnx/model_qint8_arm64.onnx", "onnx/model_O4.onnx",
           "openvino/openvino_model.xml", "openvino/openvino_model.bin", "openvino/openvino_model_qint8_quantized.xml",
           ".eval_results/hf-mocose-sts13.yaml", ".eval_results/gpqa.yaml", ".eval_results/hf-mocose-stsb.yaml"]
    with_onnx = ["onnx/model.onnx", "onnx/model_qint8_avx512_vnni.onnx", ".eval_results/hf-mocose-stsb.yaml"]
    assert stale_files(old, with_onnx, export_root=True) == [
        ".eval_results/hf-mocose-sts13.yaml", "onnx/model_qint8_arm64.onnx", "onnx/model_quint8_avx2.onnx"]
    with_openvino = ["openvino/openvino_model.xml", "openvino/openvino_model.bin"]
    eval_files = [".eval_results/hf-mocose-sts13.yaml", ".eval_results/hf-mocose-stsb.yaml"]
    # NNCF's int8 file is the export's own name now: stale when this export's OpenVINO folder lacks it
    assert stale_files(old, with_openvino, export_root=True) == [
        *eval_files, "openvino/openvino_model_qint8_quantized.xml"]
    assert stale_files(old, [], export_root=True) == eval_files  # no runtime folder: no runtime file is its


def test_push_uploads_runtime_files_and_eval_results_and_keeps_what_others_made(fake_hub, export_dir, tmp_path):
    import shutil

    export = shutil.copytree(export_dir, tmp_path / "export")
    new_files = {"onnx/model.onnx": b"fp32", "onnx/model_qint8_avx512_vnni.onnx": b"int8",
                 "openvino/openvino_model.xml": b"<xml/>", "openvino/openvino_model.bin": b"bin",
                 ".eval_results/hf-mocose-stsb.yaml": b"- dataset: {id: mteb/stsbenchmark-sts, task_id: default}"}
    for path, data in new_files.items():
        (export / path).parent.mkdir(exist_ok=True)
        (export / path).write_bytes(data)
    earlier = {"onnx/model.onnx": b"old fp32", "onnx/model_quint8_avx2.onnx": b"old int8 (another CPU)",
               "openvino/openvino_model.bin": b"old bin", ".eval_results/hf-mocose-sts12.yaml": b"old score"}
    others = {"onnx/model_O4.onnx": b"optimum's", "openvino/openvino_model_fp16.xml": b"theirs",
              ".eval_results/gpqa.yaml": b"a community result"}
    fake_hub.seed("alice/tiny-mocose", {**earlier, **others, **NOT_OURS})
    push_export(export, "alice/tiny-mocose")
    stored = fake_hub.files[("alice/tiny-mocose", "main")]
    assert {path: stored[path] for path in new_files} == new_files
    assert sorted(path for _, _, path in fake_hub.deleted) == [".eval_results/hf-mocose-sts12.yaml",
                                                                "onnx/model_quint8_avx2.onnx"]
    assert {path: stored[path] for path in others} == others and len(fake_hub.commits) == 1


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
    from hf_mocose.publishing.hub import publish_final_model

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
    from hf_mocose.publishing.hub import push_training_checkpoint

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
    # The next push to the same folder replaces it whole: a file the checkpoint no longer has (an older run's
    # second process's state) goes, the root export and the user's files stay.
    others = {"config.json": b"{}", "modules.json": b"[]", "notes.md": b"mine"}
    stale = {f"{folder}/fgsm_state_rank1.pt": b"x"}
    fake_hub.seed("alice/run", {**fake_hub.files[("alice/run", "main")], **stale, **others})
    push_training_checkpoint(fake_trainer(tmp_path, strategy), checkpoint).result()
    assert set(fake_hub.files[("alice/run", "main")]) == {f"{folder}/{name}" for name in expected} | set(others)
    assert [path for _, _, path in fake_hub.deleted] == [f"{folder}/fgsm_state_rank1.pt"]


def test_unreachable_hub_is_a_clear_error(fake_hub, export_dir, monkeypatch):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(HubPushError, match="failed: .*Connect"):
        push_export(export_dir, "alice/tiny-mocose")

"""`MoCoSETrainer.push_to_hub` and checkpoint pushes, through the real huggingface_hub client, against the fake Hub.

The layout (export at the root, MoCoSE model in `mocose/`, one commit per push), `Trainer.push_to_hub`'s
keywords reaching the card, failures before anything is written, `blocking=False` order and errors,
and `on_push_begin` for checkpoint pushes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_trainer
from fake_hub import TOKEN, fake_hub  # noqa: F401 (the fixture)
from huggingface_hub import ModelCard
from transformers import TrainerCallback

from hf_mocose.publishing.hub import HubPushError

SENTENCES = 24


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def root_files(repo: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in repo.items() if not k.startswith("mocose/")}


class CountPushes(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_push_begin(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def test_issue_snippet_trains_and_pushes_with_a_local_folder(fake_hub, tiny_encoder, tmp_path):
    """The shortest use, as TRL's trainers take it: a model folder (str), raw sentences, no processing_class."""
    from datasets import Dataset

    from hf_mocose import MoCoSETrainer, MoCoSETrainingArguments
    from hf_mocose.data.corpus import python_docs_sentences

    sentences = python_docs_sentences()[:SENTENCES]
    trainer = MoCoSETrainer(model=tiny_encoder,  # a local folder, as the issue says; the paper's default arguments
                            args=MoCoSETrainingArguments(output_dir=str(tmp_path / "out"), hub_model_id="me/m"),
                            train_dataset=Dataset.from_dict({"text": sentences}))
    trainer.train()
    assert trainer.state.global_step == 1  # 24 sentences, one batch of the paper's 64
    trainer.push_to_hub(model_name="My model", finetuned_from="sentence-transformers/all-MiniLM-L6-v2")
    repo = fake_hub.files[("me/m", "main")]
    assert root_files(repo) == snapshot(tmp_path / "out" / "sentence-transformers")
    assert json.loads(repo["mocose/config.json"])["model_type"] == "mocose" and "modules.json" in repo
    assert [c for c in fake_hub.commits if c[0] == "me/m"] == [("me/m", "main", "End of training")]  # one commit
    card = ModelCard(repo["README.md"].decode())
    assert "\n# My model\n" in card.text
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    trainer.push_to_hub(tags="my-tag")
    tags = ModelCard(fake_hub.files[("me/m", "main")]["README.md"].decode()).data.tags
    assert "my-tag" in tags and not {"m", "y", "-", "t", "a", "g"} & set(tags)


def test_trainer_push_to_hub_publishes_what_hf_mocose_push_publishes(fake_hub, tiny_encoder, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")  # the token comes from the training arguments
    trainer = make_trainer(tiny_encoder, tmp_path / "run", n_sentences=SENTENCES, max_steps=1,
                           hub_model_id="alice/run", hub_token=TOKEN)
    trainer.train()
    commit = trainer.push_to_hub(commit_message="First model", revision="v1")
    assert commit.commit_url.startswith(f"{fake_hub.url}/alice/run/commit/")
    repo = fake_hub.files[("alice/run", "v1")]
    assert root_files(repo) == snapshot(tmp_path / "run" / "sentence-transformers")
    assert json.loads(repo["config.json"])["model_type"] == "bert" and "README.md" in repo
    assert json.loads(repo["mocose/config.json"])["model_type"] == "mocose"
    assert "mocose/optimizer.pt" not in repo and not any(k.startswith("checkpoint-") for k in repo)
    assert snapshot(tmp_path / "run" / "final")["config.json"] == repo["mocose/config.json"]
    assert "mocose/card_facts.json" in repo  # what the card reads, never the pickle
    assert fake_hub.commits == [("alice/run", "v1", "First model")]  # export and MoCoSE model: one commit
    assert 'SentenceTransformer("alice/run")' in repo["README.md"].decode() and TOKEN not in repo["README.md"].decode()
    # blocking=False: the upload runs in the background and push_to_hub returns its Future
    future = trainer.push_to_hub(blocking=False)
    assert future.result().commit_url.startswith(f"{fake_hub.url}/alice/run/commit/")
    assert ("alice/run", "main", "End of training") in fake_hub.commits


def test_push_to_hub_over_an_earlier_push_deletes_only_the_files_it_no_longer_contains(fake_hub, tiny_encoder, tmp_path):
    """The final push owns the root export and `mocose/`: an older sharded save there goes, in the same commit;
    checkpoints, the user's files and .gitattributes stay."""
    trainer = make_trainer(tiny_encoder, tmp_path / "run", n_sentences=SENTENCES, max_steps=1, hub_model_id="alice/run")
    trainer.train()
    older = {"model.safetensors.index.json": b"{}", "model-00001-of-00002.safetensors": b"old",
             "mocose/model.safetensors.index.json": b"{}", "mocose/model-00002-of-00002.safetensors": b"old",
             "mocose/fgsm_state_rank1.pt": b"old", "2_Dense/model.safetensors": b"old cls_dense head"}
    kept = {".gitattributes": b"*.bin filter=lfs", "last-checkpoint/optimizer.pt": b"opt", "my_eval.json": b"{}",
            "examples/README.md": b"mine"}
    fake_hub.seed("alice/run", {**older, **kept})
    trainer.push_to_hub()
    from hf_mocose.publishing.hub import CHECKPOINT_IGNORE, list_upload_files

    repo = fake_hub.files[("alice/run", "main")]
    export = snapshot(tmp_path / "run" / "sentence-transformers")
    assert "2_Dense/model.safetensors" not in export  # cls pooling: no Dense module in the new export
    mocose = {f"mocose/{path}" for path, _ in list_upload_files(tmp_path / "run" / "final", CHECKPOINT_IGNORE)}
    assert set(repo) == set(kept) | set(export) | mocose and "mocose/model.safetensors" in mocose
    assert all(repo[path] == data for path, data in {**kept, **export}.items())
    assert sorted(path for _, _, path in fake_hub.deleted) == sorted(older)
    assert [c for c in fake_hub.commits if c[0] == "alice/run"] == [("alice/run", "main", "End of training")]


@pytest.mark.parametrize("call, error, message", [
    (dict(model_nme="typo"), TypeError, "unexpected keyword argument\\(s\\) 'model_nme'"),
    (dict(finetuned_from="a/b", base_model="c/d"), ValueError, "finetuned_from='a/b' and base_model='c/d'"),
])
def test_bad_keywords_fail_before_anything_is_written(fake_hub, tiny_encoder, tmp_path, call, error, message):
    trainer = make_trainer(tiny_encoder, tmp_path / "run", n_sentences=SENTENCES, hub_model_id="alice/run")
    pushes = CountPushes()
    trainer.add_callback(pushes)
    with pytest.raises(error, match=message):
        trainer.push_to_hub(**call)
    assert fake_hub.requests == [] and pushes.steps == []
    assert not (tmp_path / "run" / "final").exists() and not (tmp_path / "run" / "sentence-transformers").exists()


def test_invalid_repo_id_fails_before_anything_is_written(fake_hub, tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path / "run", n_sentences=SENTENCES, hub_model_id="alice/bad--name")
    pushes = CountPushes()
    trainer.add_callback(pushes)
    with pytest.raises(ValueError, match="Invalid repo id 'alice/bad--name'"):
        trainer.push_to_hub()
    assert fake_hub.requests == [] and pushes.steps == [] and not (tmp_path / "run" / "final").exists()


def test_without_hub_model_id_the_repo_is_named_after_output_dir_as_trainer_does(fake_hub, tiny_encoder, tmp_path):
    """transformers' `Trainer.init_hf_repo`: `<output_dir's name>` in the token's own namespace."""
    trainer = make_trainer(tiny_encoder, tmp_path / "my-run", n_sentences=SENTENCES)
    commit = trainer.push_to_hub()
    assert trainer.hub_model_id == f"{fake_hub.user}/my-run"
    assert commit.commit_url.startswith(f"{fake_hub.url}/{fake_hub.user}/my-run/commit/")
    card = fake_hub.files[(f"{fake_hub.user}/my-run", "main")]["README.md"].decode()
    assert f'SentenceTransformer("{fake_hub.user}/my-run")' in card


def test_an_output_dir_name_that_cannot_be_a_repo_name_says_to_set_hub_model_id(fake_hub, tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path / "my run", n_sentences=SENTENCES)
    with pytest.raises(ValueError, match="'my run' is not a valid model repo name .* set hub_model_id"):
        trainer.push_to_hub()
    assert fake_hub.requests == [] and not (tmp_path / "my run" / "final").exists()


def test_blocking_false_surfaces_the_upload_error(fake_hub, tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path / "run", n_sentences=SENTENCES, hub_model_id="alice/run")
    fake_hub.fail_commit = 500
    future = trainer.push_to_hub(blocking=False)
    with pytest.raises(HubPushError, match="'alice/run' failed: .*500") as info:
        future.result()
    assert TOKEN not in str(info.value) and not fake_hub.files


def test_checkpoint_pushes_fire_on_push_begin_and_land_before_the_final_push(fake_hub, tiny_encoder, tmp_path):
    """`hub_strategy="checkpoint"`: each checkpoint push is announced (`on_push_begin`, as transformers' own
    `_push_from_checkpoint`), and with `blocking=False` everything lands in the order it was asked for."""
    trainer = make_trainer(tiny_encoder, tmp_path / "run", n_sentences=SENTENCES, push_to_hub=True,
                           hub_model_id="alice/run", hub_strategy="checkpoint", hub_always_push=True,
                           save_strategy="steps", save_steps=2, max_steps=4)
    pushes = CountPushes()
    trainer.add_callback(pushes)
    trainer.train()
    assert pushes.steps == [2, 4]
    trainer.push_to_hub(blocking=False).result()
    assert pushes.steps == [2, 4, 4]
    assert [message for _, _, message in fake_hub.commits] == [
        "Training in progress, step 2", "Training in progress, step 4", "End of training"]
    repo = fake_hub.files[("alice/run", "main")]
    assert {"last-checkpoint/card_facts.json", "last-checkpoint/optimizer.pt", "mocose/config.json",
            "modules.json"} <= set(repo)
    assert json.loads(repo["config.json"])["model_type"] == "bert"  # checkpoint pushes never wrote the root

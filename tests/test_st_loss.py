"""MoCoSELoss: the MoCoSE objective for any SentenceTransformer, trained by SentenceTransformerTrainer."""

import shutil
import subprocess
import sys

import pytest
import torch
from datasets import Dataset
from torch.nn import functional as F

from conftest import make_st_trainer, tiny_sentence_transformer
from hf_mocose.callbacks import ema_decay_at
from hf_mocose.data import python_docs_sentences

# No dropout anywhere: runs that should match do so exactly.
QUIET = dict(loss_kwargs=dict(head_dropout=0.0, target_dropout=False), model_kwargs=dict(dropout=0.0))


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _loss_state(trainer):
    """Everything a run holds: the model, the online heads, the target and the queue."""
    loss = trainer.loss
    state = {}
    for name in ("model", "online_head", "target_encoder", "target_head", "queue"):
        module = trainer.model if name == "model" else getattr(loss, name)
        state.update({f"{name}.{k}": v.detach().clone() for k, v in module.state_dict().items()})
    return state


def _assert_states_equal(a, b, atol):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name].float(), b[name].float(), atol=atol), name


def test_top_level_exports_import_lazily():
    code = (
        "import sys, hf_mocose\n"
        "assert not {'hf_mocose.st_loss', 'hf_mocose.trainer', 'sentence_transformers'} & set(sys.modules)\n"
        "from hf_mocose import MoCoSELoss, MoCoSETrainer, MoCoSETrainingArguments\n"
        "from hf_mocose.st_loss import MoCoSELoss as loss\n"
        "from hf_mocose.trainer import MoCoSETrainer as trainer\n"
        "from hf_mocose.training_args import MoCoSETrainingArguments as args\n"
        "assert (MoCoSELoss, MoCoSETrainer, MoCoSETrainingArguments) == (loss, trainer, args)\n"
        "assert {'MoCoSELoss', 'MoCoSETrainer', 'MoCoSETrainingArguments'} <= set(dir(hf_mocose))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_trains_and_feeds_the_queue_with_the_plain_trainer_call(tiny_encoder, tmp_path):
    """The issue's snippet: no callbacks passed; the loss attaches its own on the first step."""
    trainer = make_st_trainer(tiny_encoder, tmp_path, loss_kwargs=dict(queue_size=40, queue_init_size=3))
    loss = trainer.loss
    target_before = [p.clone() for p in loss.target_encoder.parameters()]
    trainer.train()
    assert loss.callback in trainer.callback_handler.callbacks
    assert int(loss.queue.queue_fill) == 3 + 4 * 4  # K_s + steps x batch
    assert all(torch.isfinite(torch.tensor(_losses(trainer))))
    assert loss.callback.last_decay == pytest.approx(ema_decay_at(3, 4, 0.75, 0.95))
    assert any(not torch.equal(a, b) for a, b in zip(target_before, loss.target_encoder.parameters()))


def test_heads_are_optimised_target_and_queue_are_not(tiny_encoder, tmp_path):
    trainer = make_st_trainer(tiny_encoder, tmp_path, max_steps=2)
    loss = trainer.loss
    heads_before = [p.clone() for p in loss.online_head.parameters()]
    trainer.train()
    optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert {id(p) for p in loss.online_head.parameters()} <= optimised  # pooler, projection, predictor
    assert {id(p) for p in trainer.model.parameters()} <= optimised
    target = [*loss.target_encoder.parameters(), *loss.target_head.parameters()]
    assert not optimised & {id(p) for p in target}
    assert all(p.grad is None and not p.requires_grad for p in target)
    assert not list(loss.queue.parameters())
    assert all(not torch.equal(a, b) for a, b in zip(heads_before, loss.online_head.parameters()))


def test_ema_pairs_and_update_rule(tiny_encoder):
    """The loss names its pairs for the shared EMATargetCallback: model + pooler + projection, not the predictor."""
    from hf_mocose import MoCoSELoss

    model = tiny_sentence_transformer(tiny_encoder)
    loss = MoCoSELoss(model, queue_size=8)
    online, target, _, _ = loss.ema_parameter_pairs()
    expected = [*model.parameters(), *loss.online_head.pooler.parameters(), *loss.online_head.projection.parameters()]
    assert [id(p) for p in online] == [id(p) for p in expected]
    assert {id(p) for p in target} == {id(p) for p in (*loss.target_encoder.parameters(), *loss.target_head.parameters())}
    assert all(torch.equal(o, t) for o, t in zip(online, target))  # the target starts as a copy
    with torch.no_grad():
        for p in online:
            p.add_(torch.randn_like(p))
    before = [t.clone() for t in target]
    loss.callback.update(0.9)
    for o, t, old in zip(online, target, before):
        assert torch.allclose(t, 0.9 * old + 0.1 * o, atol=1e-6)
    horizon = MoCoSELoss(model, queue_size=8, ema_decay_horizon=100).callback  # the reference code's fixed ramp
    assert horizon.decay_at(50, 4) == pytest.approx(ema_decay_at(50, 4, 0.75, 0.95, 100)) == pytest.approx(0.85)


def test_identity_head_init_and_a_head_learning_rate(tiny_encoder, tmp_path):
    """head_init (identity by default, as MoCoSETrainer's) reaches the heads through the shared builders;
    sentence-transformers' learning_rate_mapping gives the heads their own learning rate."""
    trainer = make_st_trainer(tiny_encoder, tmp_path, learning_rate_mapping={r"online_head\.": 1e-2})
    loss = trainer.loss
    linears = [m for m in loss.online_head.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 1 + 1 + 2  # pooler, projection, predictor
    assert all(torch.equal(m.weight, torch.eye(32)) and not m.bias.any() for m in linears)
    assert torch.equal(loss.target_head.pooler.weight, torch.eye(32))
    optimizer = trainer.create_optimizer()
    lr = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    assert {lr[id(p)] for p in loss.online_head.parameters()} == {1e-2}
    assert {lr[id(p)] for p in trainer.model.parameters()} == {1e-3}
    paper = make_st_trainer(tiny_encoder, tmp_path / "paper", loss_kwargs=dict(head_init="random")).loss
    assert not torch.equal(paper.online_head.predictor[0].weight, torch.eye(32))


def test_one_ema_update_per_optimizer_step_under_accumulation(tiny_encoder, tmp_path, monkeypatch):
    trainer = make_st_trainer(tiny_encoder, tmp_path, gradient_accumulation_steps=3, max_steps=4,
                              loss_kwargs=dict(queue_size=60, queue_init_size=3))
    callback = trainer.loss.callback
    decays = []
    original = callback.update
    monkeypatch.setattr(callback, "update", lambda d: (decays.append(d), original(d)))
    trainer.train()
    assert decays == pytest.approx([ema_decay_at(t, 4, 0.75, 0.95) for t in range(4)])
    assert int(trainer.loss.queue.queue_fill) == 3 + 4 * 3 * 4  # every micro-batch is enqueued


def test_pairs_queue_the_targets_keys_of_the_positives(tiny_encoder, tmp_path):
    sentences = python_docs_sentences()
    dataset = Dataset.from_dict({"anchor": sentences[:8], "positive": sentences[8:16]})
    trainer = make_st_trainer(tiny_encoder, tmp_path, dataset=dataset, per_device_train_batch_size=8, max_steps=1,
                              learning_rate=0.0, loss_kwargs=dict(queue_size=8, queue_init_size=0, **QUIET["loss_kwargs"]),
                              model_kwargs=QUIET["model_kwargs"])
    trainer.train()
    loss = trainer.loss
    loss.target_encoder.eval()

    def target_keys(texts):
        with torch.no_grad():
            features = loss.target_encoder.preprocess(texts)
            return F.normalize(loss.target_head(loss.target_encoder(features)["sentence_embedding"]), dim=1)

    queued = loss.queue.newest_first()
    assert queued.shape[0] == 8
    best_match = (target_keys(sentences[8:16]) @ queued.T).max(dim=1).values
    assert torch.allclose(best_match, torch.ones(8), atol=1e-5)  # every positive's target key is queued
    assert (target_keys(sentences[:8]) @ queued.T).max() < 0.999  # and no anchor's


def test_fgsm_modes_perturb_the_word_embeddings(tiny_encoder, tmp_path):
    def run(mode):
        kwargs = dict(QUIET["loss_kwargs"], fgsm_mode=mode, fgsm_epsilon=0.05)
        trainer = make_st_trainer(tiny_encoder, tmp_path / mode, max_steps=2, loss_kwargs=kwargs,
                                  model_kwargs=dict(dropout=0.0, max_seq_length=8),
                                  dataset=Dataset.from_dict({"text": _long_sentences(64)}))
        trainer.train()
        return _losses(trainer), trainer.loss.fgsm.last_gradient_sign

    off, _ = run("off")
    exact, exact_sign = run("exact")
    previous, previous_sign = run("previous")
    assert exact[0] != pytest.approx(off[0], abs=1e-4)  # its own gradient from the first step on
    assert previous[0] == pytest.approx(off[0], abs=1e-6)  # no previous gradient yet
    assert previous[1] != pytest.approx(off[1], abs=1e-4)
    assert exact_sign is None and previous_sign is not None and previous_sign.shape == (4, 8, 32)


def _long_sentences(n):
    """Sentences longer than 8 tokens: truncated to 8, every batch has the same shape (FGSM "previous")."""
    return [s for s in python_docs_sentences() if len(s.split()) >= 10][:n]


@pytest.fixture(scope="module")
def full_run(tiny_encoder, tmp_path_factory):
    """6 steps, checkpoints every 3, FGSM "previous" on: state that a resume must restore exactly."""
    out = tmp_path_factory.mktemp("full")
    trainer = make_st_trainer(tiny_encoder, out, **_resume_setup())
    trainer.train()
    return {"dir": out, "losses": _losses(trainer), "state": _loss_state(trainer)}


def _resume_setup():
    return dict(max_steps=6, save_strategy="steps", save_steps=3, dataset=Dataset.from_dict({"text": _long_sentences(64)}),
                loss_kwargs=dict(queue_size=20, queue_init_size=3, fgsm_mode="previous", fgsm_epsilon=0.05),
                model_kwargs=dict(max_seq_length=8))


def test_checkpoint_holds_the_loss_state(full_run):
    folder = full_run["dir"] / "checkpoint-3" / "mocose_loss"
    state = torch.load(folder / "state.pt", weights_only=True)
    assert {"online_head", "target_encoder", "target_head", "queue", "ema_last_decay"} <= state.keys()
    assert {"queue_ptr", "queue_fill"} <= state["queue"].keys()
    assert state["ema_last_decay"] == pytest.approx(ema_decay_at(2, 6, 0.75, 0.95))
    assert torch.load(folder / "fgsm_rank0.pt", weights_only=True)["last_gradient_sign"].shape == (4, 8, 32)


def test_resume_gives_the_same_next_losses(full_run, tiny_encoder):
    """Resumed from checkpoint-3 in output_dir, the loss finds its state itself; steps 4-6 equal the full run's."""
    resumed = make_st_trainer(tiny_encoder, full_run["dir"], **_resume_setup())
    resumed.train(resume_from_checkpoint=str(full_run["dir"] / "checkpoint-3"))
    assert _losses(resumed)[-3:] == pytest.approx(full_run["losses"][-3:], abs=1e-5)
    _assert_states_equal(_loss_state(resumed), full_run["state"], atol=1e-5)


def test_resume_from_a_checkpoint_elsewhere(full_run, tiny_encoder, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(full_run["dir"] / "checkpoint-3", moved)
    trainer = make_st_trainer(tiny_encoder, tmp_path / "out", **_resume_setup())
    with pytest.raises(FileNotFoundError, match=r"loss.load_state\(CHECKPOINT\)"):
        trainer.train(resume_from_checkpoint=str(moved))
    trainer = make_st_trainer(tiny_encoder, tmp_path / "out", **_resume_setup())
    trainer.loss.load_state(moved)
    trainer.train(resume_from_checkpoint=str(moved))
    assert _losses(trainer)[-3:] == pytest.approx(full_run["losses"][-3:], abs=1e-5)


def test_resume_refuses_another_checkpoints_loss_state(full_run, tiny_encoder, tmp_path):
    mixed = tmp_path / "mixed"
    shutil.copytree(full_run["dir"] / "checkpoint-3", mixed)
    shutil.rmtree(mixed / "mocose_loss")
    shutil.copytree(full_run["dir"] / "checkpoint-6" / "mocose_loss", mixed / "mocose_loss")
    trainer = make_st_trainer(tiny_encoder, tmp_path / "out", **_resume_setup())
    trainer.loss.load_state(mixed)
    with pytest.raises(ValueError, match="other model weights"):
        trainer.train(resume_from_checkpoint=str(mixed))


def test_model_card_names_the_loss_and_its_settings(tiny_encoder, tmp_path):
    trainer = make_st_trainer(tiny_encoder, tmp_path / "run", max_steps=1,
                              loss_kwargs=dict(queue_size=10, queue_init_size=3, ema_decay=0.8, temperature=0.07))
    trainer.train()
    trainer.model.save_pretrained(str(tmp_path / "model"))
    card = (tmp_path / "model" / "README.md").read_text()
    assert "loss:MoCoSELoss" in card and "hf_mocose.st_loss.MoCoSELoss" in card
    for setting in ('"queue_size": 10', '"ema_decay": 0.8', '"ema_decay_end": 0.95', '"temperature": 0.07',
                    '"fgsm_mode": "off"'):
        assert setting in card, setting
    assert "cao-etal-2022-exploring" in card  # the MoCoSE citation


def test_evaluation_loss_leaves_the_queue_alone(tiny_encoder, tmp_path):
    trainer = make_st_trainer(tiny_encoder, tmp_path, max_steps=1)
    trainer.train()
    queue = {k: v.clone() for k, v in trainer.loss.queue.state_dict().items()}
    metrics = trainer.evaluate(eval_dataset=Dataset.from_dict({"text": python_docs_sentences()[100:108]}))
    assert torch.isfinite(torch.tensor(metrics["eval_loss"]))
    assert all(torch.equal(queue[k], v) for k, v in trainer.loss.queue.state_dict().items())


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=0.0), "temperature"),
    (dict(queue_size=0), "queue_size"),
    (dict(queue_size=8, queue_init_size=9), "queue_init_size"),
    (dict(ema_decay=1.5), "ema_decay must be"),
    (dict(ema_decay_end=-0.1), "ema_decay_end"),
    (dict(ema_decay_horizon=0), "ema_decay_horizon"),
    (dict(fgsm_mode="sometimes"), "fgsm_mode"),
    (dict(fgsm_epsilon=-1.0), "fgsm_epsilon"),
    (dict(predictor_layers=-1), "predictor_layers"),
    (dict(head_dropout=1.0), "head_dropout"),
    (dict(head_init="zeros"), "head_init"),
    (dict(fgsm_mode="exact", fgsm_epsilon_unit="percent"), "fgsm_epsilon_unit"),
])
def test_impossible_settings(tiny_encoder, kwargs, match):
    from hf_mocose import MoCoSELoss

    with pytest.raises(ValueError, match=match):
        MoCoSELoss(tiny_sentence_transformer(tiny_encoder), **kwargs)


def test_models_it_cannot_train():
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense

    from hf_mocose import MoCoSELoss

    with pytest.raises(TypeError, match="SentenceTransformer"):
        MoCoSELoss(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match=r"no tokenizer \(first module: Dense\)"):
        MoCoSELoss(SentenceTransformer(modules=[Dense(in_features=8, out_features=8)]))


_SENTENCES = python_docs_sentences()[:16]


@pytest.mark.parametrize("attach", ["first_step", "callbacks"])
@pytest.mark.parametrize("columns, match", [
    ({"a": _SENTENCES, "b": _SENTENCES, "c": _SENTENCES}, r"two \(\(anchor, positive\) pairs\), but the training data has 3"),
    ({"text": _SENTENCES, "score": [0.5] * 16}, "label column 'score'"),
    ({"text": _SENTENCES[:8]}, r"queue_size=10 is larger than the training data \(8 rows\)"),
])
def test_data_it_cannot_use_fails_before_any_step(tiny_encoder, tmp_path, attach, columns, match):
    trainer = make_st_trainer(tiny_encoder, tmp_path, dataset=Dataset.from_dict(columns))
    if attach == "callbacks":
        trainer.add_callback(trainer.loss.callback)
    weights = [p.clone() for p in trainer.model.parameters()]
    with pytest.raises(ValueError, match=match):
        trainer.train()
    assert trainer.state.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(weights, trainer.model.parameters()))


def test_non_text_column_named_before_the_first_batch(tiny_encoder, tmp_path):
    """With the callback passed in, the data is checked at on_train_begin, before any batch is collated."""
    dataset = Dataset.from_dict({"text": _SENTENCES, "n_tokens": list(range(16))})
    trainer = make_st_trainer(tiny_encoder, tmp_path, dataset=dataset)
    trainer.add_callback(trainer.loss.callback)
    with pytest.raises(ValueError, match="column 'n_tokens' holds Value"):
        trainer.train()


def test_uneven_batches_across_processes_are_refused(tiny_encoder, tmp_path, monkeypatch):
    from hf_mocose import st_loss

    trainer = make_st_trainer(tiny_encoder, tmp_path, dataset=Dataset.from_dict({"text": python_docs_sentences()[:30]}))
    monkeypatch.setattr(st_loss, "_rank_and_world", lambda: (0, 2))
    with pytest.raises(ValueError, match="dataloader_drop_last=True"):
        trainer.loss.check_dataset(trainer.train_dataset, trainer.args)


def test_sharded_launches_are_refused(tiny_encoder, tmp_path, monkeypatch):
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    trainer = make_st_trainer(tiny_encoder, tmp_path)
    for state in (PartialState, AcceleratorState):  # AcceleratorState() re-reads PartialState's
        monkeypatch.setitem(state._shared_state, "distributed_type", DistributedType.FSDP)
    with pytest.raises(ValueError, match="does not support FSDP"):
        trainer.loss.begin_training(trainer.args, trainer.state)


def test_training_outside_a_trainer_is_refused(tiny_encoder):
    from hf_mocose import MoCoSELoss

    model = tiny_sentence_transformer(tiny_encoder)
    loss = MoCoSELoss(model, queue_size=8)
    with pytest.raises(RuntimeError, match="transformers Trainer"):
        loss([model.preprocess(_SENTENCES[:4])])


def test_example_script_end_to_end(tiny_encoder, tmp_path, monkeypatch):
    """examples/train_st_mocose.py on a saved tiny SentenceTransformer: trains, scores nothing (no STS file), saves."""
    import importlib.util

    from conftest import REPO_ROOT

    tiny_sentence_transformer(tiny_encoder).save_pretrained(str(tmp_path / "tiny-st"))
    spec = importlib.util.spec_from_file_location("train_st_mocose", REPO_ROOT / "examples" / "train_st_mocose.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)  # dataclasses look their module up while it loads
    spec.loader.exec_module(script)
    scores = script.main([
        "--model_name_or_path", str(tmp_path / "tiny-st"), "--train_file", "builtin:python_docs",
        "--max_train_samples", "64", "--queue_size", "16", "--max_steps", "2", "--per_device_train_batch_size", "8",
        "--stsb_dev_file", str(tmp_path / "absent.csv"), "--output_dir", str(tmp_path / "out"), "--use_cpu", "true",
        "--disable_tqdm", "true", "--head_init", "identity", "--learning_rate_mapping", '{"online_head\\\\.": 0.01}',
    ])
    assert scores == {}
    assert (tmp_path / "out" / "final" / "modules.json").is_file()
    assert "MoCoSELoss" in (tmp_path / "out" / "final" / "README.md").read_text()

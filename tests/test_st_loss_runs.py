"""MoCoSELoss runs: its state in every checkpoint before the Trainer saves (and pushes) it, exact resume
(also from a checkpoint pushed to the Hub), `model_init` and hyperparameter search, Trainer switches."""

import shutil
from pathlib import Path

import pytest
import torch
from conftest import make_st_trainer, tiny_sentence_transformer
from datasets import Dataset
from fake_hub import TOKEN
from test_hub import fake_hub  # noqa: F401  (the fixture: a recording stand-in for the Hub)
from test_st_loss import _long_sentences, _losses
from transformers import TrainerCallback

from hf_mocose.data.corpus import python_docs_sentences
from hf_mocose.models.ema import ema_decay_at


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


def _probe_saves(trainer):
    """Records, as each `_save_checkpoint` starts, (step, whether its folder already holds the loss state)."""
    seen, save = [], trainer._save_checkpoint

    def probe(model, trial):
        folder = Path(trainer._get_output_dir(trial)) / f"checkpoint-{trainer.state.global_step}" / "mocose_loss"
        seen.append((trainer.state.global_step, (folder / "state.pt").is_file()))
        return save(model, trial)

    trainer._save_checkpoint = probe
    return seen


def _resume_setup():
    """6 steps, checkpoints every 3, FGSM "previous" on: state that a resume must restore exactly."""
    return dict(max_steps=6, save_strategy="steps", save_steps=3, dataset=Dataset.from_dict({"text": _long_sentences(64)}),
                loss_kwargs=dict(queue_size=20, queue_init_size=3, fgsm_epsilon=0.05), model_kwargs=dict(max_seq_length=8))


@pytest.fixture(scope="module")
def full_run(tiny_encoder, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    trainer = make_st_trainer(tiny_encoder, out, **_resume_setup())
    saves = _probe_saves(trainer)
    trainer.train()
    return {"dir": out, "losses": _losses(trainer), "state": _loss_state(trainer), "saves": saves}


def test_every_checkpoint_holds_the_loss_state_before_the_trainer_saves_it(full_run):
    assert full_run["saves"] == [(3, True), (6, True)]
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


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step


def test_a_checkpoint_pushed_to_the_hub_carries_the_loss_state_and_resumes_exactly(fake_hub, full_run, tiny_encoder,
                                                                                   tmp_path, monkeypatch):
    """hub_strategy="checkpoint": the Trainer starts uploading checkpoint-3 inside `_save_checkpoint`; the
    upload holds mocose_loss/, and a run resumed from the downloaded copy repeats steps 4-6 of the full run.
    The model at the repo root carries no loss state."""
    import huggingface_hub.constants as constants
    import transformers.utils.hub as transformers_hub

    monkeypatch.setattr(constants, "ENDPOINT", fake_hub.url)
    monkeypatch.setattr(transformers_hub, "_hf_api", None)  # the Trainer's shared client, made anew for the fake Hub
    pushing = make_st_trainer(tiny_encoder, tmp_path / "pushing", callbacks=[StopAt(3)], push_to_hub=True,
                              hub_model_id="alice/st-run", hub_strategy="checkpoint", hub_token=TOKEN, **_resume_setup())
    pushing.train()  # stops after checkpoint-3, whose push train() waits for
    repo = fake_hub.files[("alice/st-run", "main")]
    assert {"last-checkpoint/mocose_loss/state.pt", "last-checkpoint/mocose_loss/fgsm_rank0.pt"} <= set(repo)
    assert "modules.json" in repo and not any(name.startswith("mocose_loss/") for name in repo)
    pulled = tmp_path / "pulled"
    for name, content in repo.items():
        if name.startswith("last-checkpoint/"):
            (pulled / name).parent.mkdir(parents=True, exist_ok=True)
            (pulled / name).write_bytes(content)
    resumed = make_st_trainer(tiny_encoder, tmp_path / "resumed", **_resume_setup())
    resumed.loss.load_state(pulled / "last-checkpoint")
    resumed.train(resume_from_checkpoint=str(pulled / "last-checkpoint"))
    assert _losses(resumed)[-3:] == pytest.approx(full_run["losses"][-3:], abs=1e-5)
    _assert_states_equal(_loss_state(resumed), full_run["state"], atol=1e-5)


def test_save_strategy_best_writes_the_state_of_each_new_best_before_its_save(tiny_encoder, tmp_path):
    evaluation = Dataset.from_dict({"text": python_docs_sentences()[100:108]})
    trainer = make_st_trainer(tiny_encoder, tmp_path, max_steps=4, eval_dataset=evaluation, eval_strategy="steps",
                              eval_steps=1, save_strategy="best", metric_for_best_model="loss")
    saves = _probe_saves(trainer)
    trainer.train()
    assert saves and all(written for _, written in saves)
    folders = {int(p.name.split("-")[1]) for p in tmp_path.glob("checkpoint-*")}
    assert folders == {step for step, _ in saves}  # no folder for a step that was not a new best
    assert all((tmp_path / f"checkpoint-{step}" / "model.safetensors").is_file() for step in folders)


# ----------------------------------------------------------------- a new model per run
def _model_init_trainer(tiny_encoder, output_dir, **overrides):
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    from hf_mocose import MoCoSELoss

    built = []

    def model_init():
        built.append(tiny_sentence_transformer(tiny_encoder))
        return built[-1]

    loss = MoCoSELoss(model_init(), queue_size=20, queue_init_size=3)
    args = SentenceTransformerTrainingArguments(**{
        **dict(output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=2, learning_rate=1e-2,
               save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True), **overrides})
    trainer = SentenceTransformerTrainer(model_init=model_init, args=args, loss=loss, callbacks=[loss.callback],
                                         train_dataset=Dataset.from_dict({"text": python_docs_sentences()[:32]}),
                                         eval_dataset=Dataset.from_dict({"text": python_docs_sentences()[100:108]}))
    return trainer, built


def test_model_init_rebinds_heads_target_queue_and_ema_pairs(tiny_encoder, tmp_path):
    trainer, built = _model_init_trainer(tiny_encoder, tmp_path)
    loss = trainer.loss
    for run in range(2):
        trainer.train()
        model = trainer.model
        assert model is built[-1] and loss.online_model is model
        fresh = tiny_sentence_transformer(tiny_encoder)  # the weights model_init gave this run
        moved = [not torch.equal(t, f) for t, f in zip(loss.target_encoder.parameters(), fresh.parameters())]
        assert any(moved)  # the EMA follows this run's model (a target bound to an old one would not move)
        online = {id(p) for p in loss.callback.pairs.online_params}
        assert {id(p) for p in model.parameters()} <= online
        optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
        assert {id(p) for p in loss.online_head.parameters()} <= optimised
        assert int(loss.queue.queue_fill) == 3 + 2 * 4  # a new queue for each run
        assert {group["initial_lr"] for group in trainer.optimizer.param_groups
                if any(p is q for p in group["params"] for q in loss.online_head.parameters())} == {1e-3}


@pytest.mark.parametrize("named", [True, False], ids=["hp_name", "run-id"])
def test_hyperparameter_search_puts_the_loss_state_in_each_trials_folder(tiny_encoder, tmp_path, named):
    """Each trial's checkpoint holds that trial's own loss state (its fingerprint is that trial's model)."""
    pytest.importorskip("optuna")
    from sentence_transformers import SentenceTransformer

    from hf_mocose.st_loss.checkpoints import fingerprint

    trainer, _ = _model_init_trainer(tiny_encoder, tmp_path, save_strategy="steps", save_steps=2)
    trainer.hyperparameter_search(
        direction="minimize", backend="optuna", n_trials=2,
        hp_space=lambda trial: {"learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True)},
        hp_name=(lambda trial: f"trial-{trial.number}") if named else None)
    assert not (tmp_path / "checkpoint-2").exists()
    for number in (0, 1):
        checkpoint = tmp_path / (f"trial-{number}" if named else f"run-{number}") / "checkpoint-2"
        state = torch.load(checkpoint / "mocose_loss" / "state.pt", weights_only=True)
        assert torch.equal(state["fingerprint"], fingerprint(SentenceTransformer(str(checkpoint))))


# ----------------------------------------------------------------- Trainer switches
@pytest.mark.parametrize("switch", [dict(bf16=True), dict(activation_checkpointing=True),
                                    dict(gradient_accumulation_steps=2, max_grad_norm=0.5)],
                         ids=["bf16", "gradient_checkpointing", "accumulation_and_clip"])
def test_trainer_switches_train(tiny_encoder, tmp_path, switch):
    trainer = make_st_trainer(tiny_encoder, tmp_path, max_steps=2, loss_kwargs=dict(queue_size=40, queue_init_size=3), **switch)
    loss = trainer.loss
    target_before = [p.clone() for p in loss.target_encoder.parameters()]
    trainer.train()
    steps = 2 * switch.get("gradient_accumulation_steps", 1)
    assert int(loss.queue.queue_fill) == 3 + steps * 4
    assert all(torch.isfinite(torch.tensor(_losses(trainer))))
    assert any(not torch.equal(a, b) for a, b in zip(target_before, loss.target_encoder.parameters()))
    if "activation_checkpointing" in switch:
        assert trainer.model.transformers_model.is_activation_checkpointing


def test_a_search_without_hp_name_that_pushes_checkpoints_is_refused(tiny_encoder, tmp_path):
    """Without hp_name the trial's folder is known only once the Trainer has written (and started pushing) it."""
    from sentence_transformers import SentenceTransformerTrainingArguments
    from transformers import TrainerState

    trainer = make_st_trainer(tiny_encoder, tmp_path)
    pushing = SentenceTransformerTrainingArguments(output_dir=str(tmp_path), push_to_hub=True, hub_model_id="alice/x",
                                                   hub_strategy="checkpoint", use_cpu=True, report_to="none",
                                                   learning_rate_mapping=trainer.args.learning_rate_mapping)
    with pytest.raises(ValueError, match=r"pass hp_name, e.g. trainer.hyperparameter_search\(\.\.\., hp_name="):
        trainer.loss.callback.begin_training(pushing, TrainerState(is_hyper_param_search=True))


# ----------------------------------------------------------------- several datasets, each with its loss
def _several_datasets_trainer(tiny_encoder, output_dir, **overrides):
    """MoCoSELoss on one dataset and MultipleNegativesRankingLoss on another, taken in turn (round robin)."""
    from datasets import DatasetDict
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments, losses
    from transformers import set_seed

    from hf_mocose import MoCoSELoss

    set_seed(0)
    model = tiny_sentence_transformer(tiny_encoder, dropout=0.0)
    mocose = MoCoSELoss(model, queue_size=40, queue_init_size=3, head_dropout=0.0, target_dropout=False)
    sentences = python_docs_sentences()[:64]
    train = DatasetDict({"sentences": Dataset.from_dict({"text": sentences}),
                         "pairs": Dataset.from_dict({"anchor": sentences, "positive": sentences[::-1]})})
    args = SentenceTransformerTrainingArguments(**{
        "output_dir": str(output_dir), "max_steps": 8, "per_device_train_batch_size": 4, "use_cpu": True,
        "report_to": "none", "save_strategy": "steps", "save_steps": 3, "logging_steps": 1, "disable_tqdm": True,
        "seed": 0, "learning_rate": 1e-3, "multi_dataset_batch_sampler": "round_robin", **overrides})
    return SentenceTransformerTrainer(model=model, args=args, train_dataset=train, callbacks=[mocose.callback],
                                      loss={"sentences": mocose, "pairs": losses.MultipleNegativesRankingLoss(model)})


def test_several_datasets_each_with_its_loss_train_and_resume_exactly(tiny_encoder, tmp_path):
    """On the other loss's steps the heads have no gradient and the Trainer's clip of the model stands (the joint
    clip refused them: "found no gradient norm"); the queue grows on MoCoSELoss's steps only; a resume from a
    checkpoint after one of them reproduces the rest of the run."""
    trainer = _several_datasets_trainer(tiny_encoder, tmp_path)
    trainer.train()
    logged = [(h["step"], "pos_cos" in h) for h in trainer.state.log_history if "loss" in h]
    assert logged == [(step, step % 2 == 1) for step in range(1, 9)]  # MoCoSELoss's metrics on its steps only
    assert int(trainer.loss["sentences"].queue.queue_fill) == 3 + 4 * 4
    resumed = _several_datasets_trainer(tiny_encoder, tmp_path)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert _losses(resumed)[3:] == _losses(trainer)[3:]
    assert torch.equal(resumed.loss["sentences"].queue.keys, trainer.loss["sentences"].queue.keys)


def test_a_step_that_ends_on_another_losss_batch_is_refused(tiny_encoder, tmp_path):
    """With accumulation, a MoCoSELoss micro-batch followed by another loss's in the same step would leave the heads
    unaveraged and unclipped: stopped at that step, naming the fix."""
    trainer = _several_datasets_trainer(tiny_encoder, tmp_path, gradient_accumulation_steps=2, max_steps=2)
    with pytest.raises(RuntimeError, match="another loss's batch.*gradient_accumulation_steps 1"):
        trainer.train()


def test_several_datasets_under_several_processes_are_refused_before_any_step(tiny_encoder, tmp_path, monkeypatch):
    """accelerate deals batches of different datasets to the processes in one step: MoCoSELoss's gathers hung."""
    from hf_mocose.st_loss import inputs as st_loss_inputs

    trainer = _several_datasets_trainer(tiny_encoder, tmp_path)
    monkeypatch.setattr(st_loss_inputs, "get_world_size", lambda: 2)
    with pytest.raises(ValueError, match="MoCoSELoss with 2 training datasets under 2 processes.*one process"):
        trainer.train()
    assert trainer.state.global_step == 0 and int(trainer.loss["sentences"].queue.queue_fill) == 3

"""MoCoSELoss: the MoCoSE objective for any SentenceTransformer, trained by SentenceTransformerTrainer.

Checkpoints, resume, Hub pushes, `model_init` and Trainer switches: tests/test_st_loss_runs.py.
"""

import dataclasses
import inspect
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO_ROOT, gradient_recorder, make_st_trainer, tiny_sentence_transformer
from datasets import Dataset
from torch.nn import functional as F
from transformers import TrainerCallback

from hf_mocose.data.corpus import python_docs_sentences
from hf_mocose.models.ema import ema_decay_at

# No dropout anywhere: runs that should match do so exactly.
QUIET = dict(loss_kwargs=dict(head_dropout=0.0, target_dropout=False), model_kwargs=dict(dropout=0.0))
_SENTENCES = python_docs_sentences()[:16]


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _norm(grads, prefix=""):
    return torch.linalg.vector_norm(torch.stack([g.norm() for k, g in grads.items() if k.startswith(prefix)])).item()


# ----------------------------------------------------------------- the package and the vocabulary
def test_top_level_exports_import_lazily():
    code = (
        "import sys, hf_mocose\n"
        "assert not {'hf_mocose.st_loss.loss', 'hf_mocose.trainer.mocose_trainer', 'sentence_transformers'} & set(sys.modules)\n"
        "from hf_mocose import MoCoSELoss, MoCoSETrainer, MoCoSETrainingArguments\n"
        "from hf_mocose.st_loss.loss import MoCoSELoss as loss\n"
        "from hf_mocose.trainer.mocose_trainer import MoCoSETrainer as trainer\n"
        "from hf_mocose.trainer.training_args import MoCoSETrainingArguments as args\n"
        "assert (MoCoSELoss, MoCoSETrainer, MoCoSETrainingArguments) == (loss, trainer, args)\n"
        "assert {'MoCoSELoss', 'MoCoSETrainer', 'MoCoSETrainingArguments'} <= set(dir(hf_mocose))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_call_stack_search_in_the_package():
    for path in (REPO_ROOT / "hf_mocose").rglob("*.py"):
        source = path.read_text()
        assert not any(word in source for word in ("_getframe", "inspect.stack", "f_back")), path


def test_signatures_show_the_settings_with_their_defaults():
    """`help()` / `inspect.signature` of the loss and the config list their keywords with the defaults the training
    arguments have (all three come from `hf_mocose.models.settings`; tests/test_structure.py checks it is the one
    declaration)."""
    from hf_mocose import MoCoSEConfig, MoCoSELoss, MoCoSETrainingArguments

    field_defaults = {f.name: f.default for f in dataclasses.fields(MoCoSETrainingArguments)}
    loss_params = inspect.signature(MoCoSELoss).parameters
    loss_defaults = {name: p.default for name, p in loss_params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert {"ema_decay_start", "queue_size", "fgsm_epsilon", "head_learning_rate"} <= set(loss_defaults)
    assert loss_defaults == {name: field_defaults[name] for name in loss_defaults}
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in loss_params.values())  # others are refused
    config_defaults = {name: p.default for name, p in inspect.signature(MoCoSEConfig).parameters.items()}
    shared = set(config_defaults) & set(field_defaults)
    assert {"contrastive_temperature", "queue_size", "queue_init_size", "head_init", "target_dropout"} <= shared
    assert {name: config_defaults[name] for name in shared} == {name: field_defaults[name] for name in shared}


@pytest.mark.parametrize("old, new", [("ema_decay", "ema_decay_start"), ("temperature", "contrastive_temperature")])
def test_old_argument_names_are_refused_naming_the_new_one(tiny_encoder, old, new):
    from hf_mocose import MoCoSELoss

    with pytest.raises(TypeError, match=rf"^MoCoSELoss: {old}= is now {new}= \(the MoCoSETrainingArguments name\)\.$"):
        MoCoSELoss(tiny_sentence_transformer(tiny_encoder), **{old: 0.5})
    with pytest.raises(TypeError, match="unexpected keyword argument 'queue'"):
        MoCoSELoss(tiny_sentence_transformer(tiny_encoder), queue=8)


# ----------------------------------------------------------------- training
def test_trains_and_feeds_the_queue(tiny_encoder, tmp_path):
    trainer = make_st_trainer(tiny_encoder, tmp_path, loss_kwargs=dict(queue_size=40, queue_init_size=3))
    loss = trainer.loss
    target_before = [p.clone() for p in loss.target_encoder.parameters()]
    trainer.train()
    assert int(loss.queue.queue_fill) == 3 + 4 * 4  # K_s + steps x batch
    assert all(torch.isfinite(torch.tensor(_losses(trainer))))
    assert loss.callback.last_decay == pytest.approx(ema_decay_at(3, 4, 0.75, 0.95))
    assert any(not torch.equal(a, b) for a, b in zip(target_before, loss.target_encoder.parameters()))
    # MoCoSETrainer's step metrics, under its names, in the log history of every logging step.
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["queue_fill"] for h in logged] == [3 + 4 * step for step in range(1, 5)]
    assert logged[-1]["ema_decay"] == pytest.approx(ema_decay_at(3, 4, 0.75, 0.95), abs=1e-6)
    assert logged[-1]["d_trace"] == pytest.approx(1 / (1 - logged[-1]["ema_decay"]) + 40 / 4, abs=1e-3)
    assert all(-1 <= h[name] <= 1 for h in logged for name in ("pos_cos", "neg_cos", "key_cos"))


def test_a_forgotten_callback_stops_the_first_step_naming_the_fix(tiny_encoder, tmp_path):
    trainer = make_st_trainer(tiny_encoder, tmp_path, with_loss_callback=False, loss_kwargs=dict(head_learning_rate=None))
    weights = [p.clone() for p in trainer.model.parameters()]
    with pytest.raises(RuntimeError, match=r"pass callbacks=\[loss.callback\] to SentenceTransformerTrainer"):
        trainer.train()
    assert trainer.state.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(weights, trainer.model.parameters()))


def test_a_callback_added_after_construction_cannot_set_the_head_learning_rate(tiny_encoder, tmp_path):
    """The optimiser reads learning_rate_mapping before on_train_begin: only a callback given to the
    constructor (on_init_end) sets it. Added later, training refuses; with head_learning_rate=None it runs."""
    late = make_st_trainer(tiny_encoder, tmp_path / "late", with_loss_callback=False)
    late.add_callback(late.loss.callback)
    with pytest.raises(ValueError, match=r"pass callbacks=\[loss.callback\] to SentenceTransformerTrainer"):
        late.train()
    plain = make_st_trainer(tiny_encoder, tmp_path / "plain", with_loss_callback=False, max_steps=1,
                            loss_kwargs=dict(head_learning_rate=None))
    plain.add_callback(plain.loss.callback)
    plain.train()
    assert plain.loss.callback.last_decay is not None


def test_training_outside_a_trainer_is_refused(tiny_encoder):
    from hf_mocose import MoCoSELoss

    model = tiny_sentence_transformer(tiny_encoder)
    loss = MoCoSELoss(model, queue_size=8, queue_init_size=3)
    with pytest.raises(RuntimeError, match=r"callbacks=\[loss.callback\]"):
        loss([model.preprocess(_SENTENCES[:4])])


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


def test_ema_pairs(tiny_encoder):
    """The loss names its pairs for the shared EMATargetCallback: model + pooler + projection, not the predictor
    (the update rule itself: tests/test_ema.py, for both front ends)."""
    from hf_mocose import MoCoSELoss

    model = tiny_sentence_transformer(tiny_encoder)
    loss = MoCoSELoss(model, queue_size=8, queue_init_size=3)
    online, target, _, _ = loss.ema_parameter_pairs()
    expected = [*model.parameters(), *loss.online_head.pooler.parameters(), *loss.online_head.projection.parameters()]
    assert [id(p) for p in online] == [id(p) for p in expected]
    assert {id(p) for p in target} == {id(p) for p in (*loss.target_encoder.parameters(), *loss.target_head.parameters())}
    horizon = MoCoSELoss(model, queue_size=8, queue_init_size=3, ema_decay_horizon=100).callback
    assert horizon.decay_at(50, 4) == pytest.approx(ema_decay_at(50, 4, 0.75, 0.95, 100)) == pytest.approx(0.85)


def test_identity_heads_by_default_random_on_request(tiny_encoder):
    from hf_mocose import MoCoSELoss

    loss = MoCoSELoss(tiny_sentence_transformer(tiny_encoder), queue_size=8, queue_init_size=3)
    linears = [m for m in loss.online_head.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 1 + 1 + 2  # pooler, projection, predictor
    assert all(torch.equal(m.weight, torch.eye(32)) and not m.bias.any() for m in linears)
    assert torch.equal(loss.target_head.pooler.weight, torch.eye(32))
    paper = MoCoSELoss(tiny_sentence_transformer(tiny_encoder), queue_size=8, queue_init_size=3, head_init="random")
    assert not torch.equal(paper.online_head.predictor[0].weight, torch.eye(32))


@pytest.mark.parametrize("mapping, head_rate, expected", [
    (None, 1e-3, 1e-3),  # the default head_learning_rate, through learning_rate_mapping
    (None, None, 1e-2),  # the paper's single rate
    ({r"online_head\.": 5e-3}, 1e-3, 5e-3),  # a pattern of the user's for the heads wins
])
def test_the_heads_train_at_head_learning_rate(tiny_encoder, tmp_path, mapping, head_rate, expected):
    """Plain SGD at a constant rate: each head step is -rate x its (clipped) gradient, the model's -learning_rate x its."""
    trainer = make_st_trainer(tiny_encoder, tmp_path, max_steps=1, optim="sgd", learning_rate=1e-2, weight_decay=0.0,
                              lr_scheduler_type="constant", learning_rate_mapping=mapping or {},
                              loss_kwargs=dict(head_learning_rate=head_rate))
    loss = trainer.loss
    gradients = gradient_recorder(trainer.model, loss.online_head)
    trainer.add_callback(gradients)
    heads_before = {k: p.detach().clone() for k, p in loss.online_head.named_parameters()}
    model_before = {k: p.detach().clone() for k, p in trainer.model.named_parameters()}
    trainer.train()
    grads = gradients.steps[0]
    for name, param in loss.online_head.named_parameters():
        assert torch.allclose(param, heads_before[name] - expected * grads[f"head.{name}"], atol=1e-7), name
    name, param = next((k, p) for k, p in trainer.model.named_parameters() if f"model.{k}" in grads)
    assert torch.allclose(param, model_before[name] - 1e-2 * grads[f"model.{name}"], atol=1e-7)


def test_heads_are_clipped_jointly_with_the_model(tiny_encoder, tmp_path):
    """max_grad_norm clips model and heads together (MoCoSETrainer's rule): step-1 gradients equal the
    unclipped ones x max_norm / (joint norm + 1e-6). The logged grad_norm stays the Trainer's: the model's."""
    def first_step(max_grad_norm):
        trainer = make_st_trainer(tiny_encoder, tmp_path / str(max_grad_norm), max_steps=1, max_grad_norm=max_grad_norm,
                                  **QUIET)
        gradients = gradient_recorder(trainer.model, trainer.loss.online_head)
        trainer.add_callback(gradients)
        trainer.train()
        return trainer, gradients.steps[0]

    _, raw = first_step(0.0)
    trainer, clipped = first_step(0.05)
    joint = _norm(raw)
    assert joint > 0.05 and _norm(raw, "head.") > 0.0
    assert _norm(clipped) == pytest.approx(0.05, rel=1e-4)
    for name in raw:
        assert torch.allclose(clipped[name], raw[name] * 0.05 / (joint + 1e-6), atol=1e-7, rtol=1e-4), name
    assert trainer.loss.callback.head_gradients.last_grad_norm.item() == pytest.approx(joint, rel=1e-5)
    assert trainer.state.log_history[0]["grad_norm"] == pytest.approx(_norm(raw, "model."), rel=1e-5)


def test_each_step_starts_with_no_head_gradient(tiny_encoder, tmp_path):
    """transformers' loop zeroes the model's gradients; sentence-transformers 6 also the optimizer's, 5.x did not, so
    the heads' gradients added up over the steps (resumed runs then differed from uninterrupted ones). The callback
    zeroes them itself: checked here with sentence-transformers' zeroing taken out, as on 5.x."""
    trainer = make_st_trainer(tiny_encoder, tmp_path, max_steps=3, **QUIET)
    for callback in list(trainer.callback_handler.callbacks):
        if type(callback).__name__ == "_OptimizerZeroGradCallback":  # sentence-transformers >= 6
            trainer.remove_callback(callback)
    left = []

    class HeadGradientsAtStepBegin(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            left.append(sum(float(p.grad.abs().sum()) for p in trainer.loss.online_head.parameters() if p.grad is not None))

    trainer.add_callback(HeadGradientsAtStepBegin())
    trainer.train()
    assert left == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("hard_negative", [False, True])
def test_pairs_queue_the_targets_keys_of_the_positives(tiny_encoder, tmp_path, hard_negative):
    sentences = python_docs_sentences()
    columns = {"anchor": sentences[:8], "positive": sentences[8:16]}
    dataset = Dataset.from_dict({**columns, **({"negative": sentences[16:24]} if hard_negative else {})})
    trainer = make_st_trainer(tiny_encoder, tmp_path, dataset=dataset, per_device_train_batch_size=8, max_steps=1,
                              learning_rate=0.0, model_kwargs=QUIET["model_kwargs"],
                              loss_kwargs=dict(queue_size=8, queue_init_size=0, head_learning_rate=None,
                                               **QUIET["loss_kwargs"]))
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
    if hard_negative:  # a triplet's hard negative is encoded like a key but never queued
        assert (target_keys(sentences[16:24]) @ queued.T).max() < 0.999


def _long_sentences(n):
    """Sentences longer than 8 tokens: truncated to 8, every batch has the same shape."""
    return [s for s in python_docs_sentences() if len(s.split()) >= 10][:n]


@pytest.mark.parametrize("padding", ["fixed", "dynamic"])
def test_fgsm_modes_perturb_the_word_embeddings(tiny_encoder, tmp_path, padding):
    """"previous" (the default) perturbs from step 2 on, also under sentence-transformers' dynamic padding,
    where each batch is as long as its longest sentence and the previous sign is fitted to it."""
    sentences = _long_sentences(64) if padding == "fixed" else python_docs_sentences()[:64]

    def run(mode):
        kwargs = dict(QUIET["loss_kwargs"], fgsm_mode=mode, fgsm_epsilon=0.05)
        trainer = make_st_trainer(tiny_encoder, tmp_path / mode, max_steps=3, loss_kwargs=kwargs,
                                  model_kwargs=dict(dropout=0.0, max_seq_length=8 if padding == "fixed" else 64),
                                  dataset=Dataset.from_dict({"text": sentences}))
        lengths = []
        words = trainer.loss.online_model.transformers_model.get_input_embeddings()
        words.register_forward_hook(lambda module, inputs, output: lengths.append(output.shape[1]))
        trainer.train()
        return _losses(trainer), trainer.loss.fgsm.last_gradient_sign, lengths

    off, _, lengths = run("off")
    exact, exact_sign, _ = run("exact")
    previous, previous_sign, _ = run("previous")
    assert exact[0] != pytest.approx(off[0], abs=1e-4)  # its own gradient from the first step on
    assert previous[0] == pytest.approx(off[0], abs=1e-6)  # no previous gradient yet
    assert previous[1] != pytest.approx(off[1], abs=1e-4) and previous[2] != pytest.approx(off[2], abs=1e-4)
    assert exact_sign is None and previous_sign is not None and previous_sign.shape[::2] == (4, 32)
    assert (len(set(lengths)) > 1) == (padding == "dynamic")


@pytest.mark.parametrize("fgsm_mode, compiled_by", [("previous", "torch_compile"), ("exact", "torch_compile"),
                                                     ("previous", "accelerate config"), ("off", "fullgraph"),
                                                     ("previous", "regional")])
def test_a_compiled_model_trains_with_fgsm_as_the_eager_one(tiny_encoder, tmp_path, monkeypatch, fgsm_mode, compiled_by):
    """Compiled (`torch_compile`, or the accelerate config's `dynamo_backend`), the model takes FGSM's word
    embeddings as its `inputs_embeds`: a compiled graph gives gradients to its inputs only, and FGSM's hook
    inside it got none (the first backward failed). The losses are the eager run's, which FGSM changes.
    "fullgraph" (the accelerate config's `dynamo_use_fullgraph`): the autocast recording, run inside the graph,
    must be traceable (an attribute write stopped dynamo there, which fullgraph does not allow). "regional"
    (`dynamo_use_regional_compilation`): the word embeddings sit in a compiled region, not a compiled model."""
    from accelerate.utils import has_compiled_regions
    from conftest import compile_switches

    torch._dynamo.reset()

    def run(mode, compiled=None):
        kwargs = dict(QUIET["loss_kwargs"], fgsm_mode=mode, fgsm_epsilon=0.05)
        trainer = make_st_trainer(tiny_encoder, tmp_path / f"{mode}-{compiled}", max_steps=3, loss_kwargs=kwargs,
                                  model_kwargs=dict(dropout=0.0), **compile_switches(monkeypatch, compiled))
        trainer.train()
        assert has_compiled_regions(trainer.model_wrapped) == (compiled is not None)
        compile_switches(monkeypatch, None)
        return _losses(trainer)

    compiled = run(fgsm_mode, compiled_by)
    assert compiled == pytest.approx(run(fgsm_mode), abs=1e-5)
    if fgsm_mode != "off":
        assert compiled[1] != pytest.approx(run("off")[1], abs=1e-4)


def test_model_card_names_the_loss_and_its_settings(tiny_encoder, tmp_path):
    trainer = make_st_trainer(tiny_encoder, tmp_path / "run", max_steps=1,
                              loss_kwargs=dict(queue_size=10, queue_init_size=3, ema_decay_start=0.8,
                                               contrastive_temperature=0.07))
    trainer.train()
    trainer.model.save_pretrained(str(tmp_path / "model"))
    card = (tmp_path / "model" / "README.md").read_text()
    assert "loss:MoCoSELoss" in card and "hf_mocose.st_loss.loss.MoCoSELoss" in card
    for setting in ('"queue_size": 10', '"ema_decay_start": 0.8', '"ema_decay_end": 0.95',
                    '"contrastive_temperature": 0.07', '"fgsm_mode": "previous"', '"head_learning_rate": 0.001'):
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
    (dict(contrastive_temperature=0.0), "contrastive_temperature"),
    (dict(queue_size=0), "queue_size"),
    (dict(queue_size=8, queue_init_size=9), r"queue_init_size \(K_s\) must be between 0 and queue_size=8, got 9"),
    (dict(ema_decay_start=1.5), "ema_decay_start must be"),
    (dict(ema_decay_end=-0.1), "ema_decay_end"),
    (dict(ema_decay_horizon=0), "ema_decay_horizon"),
    (dict(fgsm_mode="sometimes"), "fgsm_mode"),
    (dict(fgsm_epsilon=-1.0), "fgsm_epsilon"),
    (dict(predictor_layers=-1), "predictor_layers"),
    (dict(head_dropout=1.0), "head_dropout"),
    (dict(head_init="zeros"), "head_init"),
    (dict(head_learning_rate=0.0), "head_learning_rate"),
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
        MoCoSELoss(SentenceTransformer(modules=[Dense(in_features=8, out_features=8)]), fgsm_mode="off")


@pytest.mark.parametrize("columns, match", [
    ({"a": _SENTENCES, "b": _SENTENCES, "c": ["", "", *_SENTENCES[2:]]},
     r"hard-negative column 'c' is empty in 2 of 16 rows; every anchor needs the same number of hard negatives \(1\)"),
    ({"text": _SENTENCES, "score": [0.5] * 16}, "label column 'score'"),
    ({"text": _SENTENCES[:8]}, r"queue_size=10 is larger than the training data \(8 rows\)"),
    ({"text": _SENTENCES, "n_tokens": list(range(16))}, "column 'n_tokens' holds Value"),
])
def test_data_it_cannot_use_fails_before_any_step(tiny_encoder, tmp_path, columns, match):
    trainer = make_st_trainer(tiny_encoder, tmp_path, dataset=Dataset.from_dict(columns))
    weights = [p.clone() for p in trainer.model.parameters()]
    with pytest.raises(ValueError, match=match):
        trainer.train()
    assert trainer.state.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(weights, trainer.model.parameters()))


def test_uneven_batches_across_processes_are_refused(tiny_encoder, tmp_path, monkeypatch):
    from hf_mocose.st_loss import inputs as st_loss_inputs

    trainer = make_st_trainer(tiny_encoder, tmp_path, dataset=Dataset.from_dict({"text": python_docs_sentences()[:30]}))
    monkeypatch.setattr(st_loss_inputs, "get_world_size", lambda: 2)
    with pytest.raises(ValueError, match="dataloader_drop_last=True"):
        trainer.loss.check_dataset(trainer.train_dataset, trainer.args)


@pytest.mark.parametrize("launch, match", [("FSDP", "does not support FSDP"), ("DEEPSPEED", "does not support DeepSpeed")])
def test_sharded_and_deepspeed_launches_are_refused(tiny_encoder, tmp_path, monkeypatch, launch, match):
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    trainer = make_st_trainer(tiny_encoder, tmp_path)
    for state in (PartialState, AcceleratorState):  # AcceleratorState() re-reads PartialState's
        monkeypatch.setitem(state._shared_state, "distributed_type", getattr(DistributedType, launch))
    with pytest.raises(ValueError, match=match):
        trainer.loss.callback.begin_training(trainer.args, trainer.state)


def test_fp16_under_a_gradient_clip_is_refused():
    """fp16 needs a GPU, so the refusal is checked on the arguments alone."""
    from hf_mocose.st_loss.distributed import refuse_unsupported_launch

    with pytest.raises(ValueError, match=r"fp16 with max_grad_norm=1.0 .* use bf16=True, or max_grad_norm=0"):
        refuse_unsupported_launch(SimpleNamespace(fp16=True, max_grad_norm=1.0))
    refuse_unsupported_launch(SimpleNamespace(fp16=True, max_grad_norm=0.0))


def test_example_script_end_to_end(tiny_encoder, tmp_path, monkeypatch):
    """examples/train_st_mocose.py on a saved tiny SentenceTransformer: trains, scores nothing (no STS file), saves."""
    import importlib.util

    tiny_sentence_transformer(tiny_encoder).save_pretrained(str(tmp_path / "tiny-st"))
    spec = importlib.util.spec_from_file_location("train_st_mocose", REPO_ROOT / "examples" / "train_st_mocose.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)  # dataclasses look their module up while it loads
    spec.loader.exec_module(script)
    scores = script.main([
        "--model_name_or_path", str(tmp_path / "tiny-st"), "--train_file", "builtin:python_docs",
        "--max_train_samples", "64", "--queue_size", "16", "--queue_init_size", "8", "--max_steps", "2",
        "--per_device_train_batch_size", "8", "--stsb_dev_file", str(tmp_path / "absent.csv"),
        "--output_dir", str(tmp_path / "out"), "--use_cpu", "true", "--disable_tqdm", "true",
        "--ema_decay_start", "0.8", "--contrastive_temperature", "0.07", "--head_learning_rate", "0.01",
    ])
    assert scores == {}
    final = Path(tmp_path / "out" / "final")
    assert (final / "modules.json").is_file()
    card = (final / "README.md").read_text()
    assert "MoCoSELoss" in card and '"ema_decay_start": 0.8' in card and '"head_learning_rate": 0.01' in card


# ----------------------------------------------------------------- the other methods under the loss
@pytest.mark.parametrize("method", ["simcse", "ifcl"])
def test_simcse_and_ifcl_train_under_the_loss_without_a_target(tiny_encoder, tmp_path, method):
    """SimCSE and IFCL: the key is a second dropout view of the online model (no target, no predictor, no FGSM);
    IFCL keeps a queue of past online anchors, SimCSE none."""
    trainer = make_st_trainer(tiny_encoder, tmp_path, max_steps=3, loss_kwargs=dict(method=method, queue_size=32))
    loss = trainer.loss
    assert loss.target_encoder is None and loss.target_head is None and "predictor" not in loss.online_head._modules
    assert loss.fgsm.mode == "off" and loss.ema_parameter_pairs().online_params == []
    model_before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    losses = _losses(trainer)
    assert len(losses) == 3 and all(math.isfinite(value) for value in losses)
    assert any(not torch.equal(a, b) for a, b in zip(model_before, trainer.model.parameters()))
    if method == "simcse":
        assert loss.queue is None
    else:
        assert int(loss.queue.queue_fill) == 3 + 3 * 4  # every step's 4 anchors enqueued


def test_ifcl_queue_holds_the_online_anchors_under_the_loss(tiny_encoder, tmp_path):
    trainer = make_st_trainer(tiny_encoder, tmp_path, max_steps=1, model_kwargs=dict(dropout=0.0),
                              loss_kwargs=dict(method="ifcl", queue_size=16, queue_init_size=0, head_dropout=0.0))
    loss = trainer.loss
    features, _ = trainer.collect_features(next(iter(trainer.get_train_dataloader())))
    with torch.no_grad():
        anchors = torch.nn.functional.normalize(loss.online_head(trainer.model(features[0])["sentence_embedding"]), dim=1)
    trainer.train()
    assert torch.allclose(loss.queue.newest_first()[:4], anchors.flip(0), atol=1e-5)


def test_ifcl_forgetting_reaches_the_queue_weights_under_the_loss(tiny_encoder):
    from hf_mocose import MoCoSELoss

    loss = MoCoSELoss(tiny_sentence_transformer(tiny_encoder), method="ifcl", queue_size=8, queue_init_size=8,
                      ifcl_forgetting=0.2)
    assert loss.objective.forgetting == 0.2
    with pytest.raises(ValueError, match=r"ifcl_forgetting \(lambda\) must be in \[0, 1\), got 1.5"):
        MoCoSELoss(tiny_sentence_transformer(tiny_encoder), method="ifcl", ifcl_forgetting=1.5)


@pytest.mark.parametrize("name, value", [("hard_negatives", "una"), ("token_shuffle", True), ("sentence_pooling", "mean"),
                                         ("fraternal_model_name_or_path", "x")])
def test_what_only_the_trainer_has_is_refused_in_one_line_naming_it(tiny_encoder, name, value):
    from hf_mocose import MoCoSELoss

    with pytest.raises(TypeError, match=rf"^MoCoSELoss does not take {name}=: it is a setting of MoCoSETrainer") as info:
        MoCoSELoss(tiny_sentence_transformer(tiny_encoder), **{name: value})
    assert "\n" not in str(info.value)


def test_simcse_without_in_batch_negatives_is_refused_by_both_front_ends(tiny_encoder, tmp_path):
    """SimCSE has no queue: without in-batch negatives a query would have no negative at all."""
    from hf_mocose import MoCoSELoss, MoCoSETrainingArguments

    with pytest.raises(ValueError, match=r"^method='simcse' has no queue: it needs in_batch_negatives=True\.$"):
        MoCoSELoss(tiny_sentence_transformer(tiny_encoder), method="simcse", in_batch_negatives=False)
    with pytest.raises(ValueError, match=r"^method='simcse' has no queue: it needs in_batch_negatives=True\.$"):
        MoCoSETrainingArguments(output_dir=str(tmp_path), method="simcse", in_batch_negatives=False, use_cpu=True)

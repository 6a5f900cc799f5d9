"""Every Trainer switch a GPU user flips: a tiny run each, or its one-line refusal before training.

One case per row of docs/trainer_switches.md. A run is a few optimizer steps of the tiny random
encoder with FGSM visible (epsilon 0.05), checked for what the switch is meant to do; a refusal is
checked to come from the trainer's construction, in one line naming the switch. What needs a GPU
(fp16, bf16 and fused AdamW on CUDA, inductor's kernels) is not run here; the docs say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
from conftest import make_trainer
from datasets import Dataset

STEPS = 3
SETTINGS = dict(max_steps=STEPS, fgsm_epsilon=0.05, encoder_dropout=0.0, head_dropout=0.0)
STS_PAIRS = [("A man plays a guitar.", "A man is playing a guitar.", 4.8), ("A woman slices an onion.",
             "A dog runs in a field.", 0.4), ("Kids play in the park.", "Children play outside.", 3.9),
             ("Stocks fell.", "A cat sleeps.", 0.2)]
INITIAL_QUEUE = 3  # conftest: queue_init_size=3


def losses(trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def build(tiny_encoder, output_dir, **switch):
    return make_trainer(tiny_encoder, output_dir, **{**SETTINGS, **switch})


def sts_dev_file(folder: Path) -> str:
    """STS pairs in SentEval's sts-dev.csv layout, for `stsb_dev_file`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sts-dev.csv"
    path.write_text("".join(f"g\tf\t2012\t{i}\t{score}\t{a}\t{b}\n" for i, (a, b, score) in enumerate(STS_PAIRS)))
    return str(path)


@pytest.fixture(scope="module")
def baseline(tiny_encoder, tmp_path_factory) -> list[float]:
    """The losses of the same run without any switch."""
    trainer = build(tiny_encoder, tmp_path_factory.mktemp("baseline"))
    trainer.train()
    return losses(trainer)


@dataclass
class Run:
    trainer: object
    baseline: list[float]
    output_dir: Path
    tiny_encoder: str


# ----------------------------------------------------------------- what each working switch must do
def record_head_dtype(trainer):
    trainer.head_dtypes = []
    trainer.model.online_projection.register_forward_hook(lambda m, i, out: trainer.head_dtypes.append(out.dtype))


def check_bf16(run):
    assert run.trainer.accelerator.native_amp and run.trainer.accelerator.mixed_precision == "bf16"  # CPU autocast
    assert set(run.trainer.head_dtypes) == {torch.bfloat16}
    assert run.trainer.model.queue.keys.dtype == torch.float32


def check_gradient_checkpointing(run):
    assert all(layer.gradient_checkpointing for layer in run.trainer.model.online_encoder.encoder.layer)
    assert losses(run.trainer) == pytest.approx(run.baseline, abs=1e-5)  # it saves memory, it changes no number


def count_ema_updates(trainer):
    trainer.ema_updates = 0
    update = trainer.ema_callback.update

    def counted(decay):
        trainer.ema_updates += 1
        update(decay)

    trainer.ema_callback.update = counted


def check_gradient_accumulation(run):
    assert run.trainer.ema_updates == run.trainer.state.global_step == STEPS  # once per optimizer step
    assert int(run.trainer.model.queue.queue_fill) == INITIAL_QUEUE + 2 * STEPS * 4  # every micro-batch enqueued


def check_fused_adamw(run):
    groups = run.trainer.optimizer.param_groups
    assert isinstance(run.trainer.optimizer.optimizer, torch.optim.AdamW)
    assert len(groups) == 4 and all(group["fused"] for group in groups)  # the heads' groups too


def check_adafactor(run):
    from transformers.optimization import Adafactor

    assert isinstance(run.trainer.optimizer.optimizer, Adafactor)
    assert losses(run.trainer)[1:] != pytest.approx(run.baseline[1:], abs=1e-4)


def check_cosine_schedule(run):
    cosine = [0.5 * (1 + math.cos(math.pi * step / STEPS)) for step in range(STEPS)]
    logged = [h["learning_rate"] for h in run.trainer.state.log_history if "learning_rate" in h]
    assert logged == pytest.approx([1e-3 * factor for factor in cosine])
    # every group follows it, the heads' (at head_learning_rate) included
    assert len(run.trainer.lr_scheduler.lr_lambdas) == 4
    assert all(factor(1) == pytest.approx(cosine[1]) for factor in run.trainer.lr_scheduler.lr_lambdas)


def simulate_out_of_memory_at_4(trainer):
    """Batches of 4 fail as a CPU allocation failure would; the Trainer retries with fewer sentences."""
    trainer.batch_sizes_tried = []
    compute_loss = trainer.compute_loss

    def failing(model, inputs, *args, **kwargs):
        size = inputs["input_ids"].shape[0]
        if not trainer.batch_sizes_tried or trainer.batch_sizes_tried[-1] != size:
            trainer.batch_sizes_tried.append(size)
        if size == 4:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate (simulated)")
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = failing


def check_auto_find_batch_size(run):
    first, used = run.trainer.batch_sizes_tried
    assert first == 4 and 1 <= used < 4
    assert run.trainer.keys_per_enqueue == used  # the queue's bookkeeping follows the batch really used
    assert int(run.trainer.model.queue.queue_fill) == INITIAL_QUEUE + used * STEPS


def check_group_by_length(run):
    from transformers.trainer_pt_utils import LengthGroupedSampler

    assert isinstance(run.trainer._get_train_sampler(), LengthGroupedSampler)


def check_dataloader_workers(run):
    assert losses(run.trainer) == pytest.approx(run.baseline, abs=1e-6)  # the collator has no hidden state


def check_save_total_limit_and_resume(run):
    kept = sorted(path.name for path in run.output_dir.glob("checkpoint-*"))
    assert kept == ["checkpoint-2", "checkpoint-3"]
    assert all((run.output_dir / name / "fgsm_rank0.pt").is_file() for name in kept)
    resumed = build(run.tiny_encoder, run.output_dir / "resumed", save_strategy="no")
    resumed.train(resume_from_checkpoint=str(run.output_dir / "checkpoint-2"))
    assert losses(resumed)[-1] == pytest.approx(losses(run.trainer)[-1], abs=1e-6)


def check_load_best_model_at_end(run):
    from safetensors.torch import load_file

    scores = [h["eval_stsb_spearman"] for h in run.trainer.state.log_history if "eval_stsb_spearman" in h]
    assert len(scores) == STEPS and run.trainer.state.best_metric == pytest.approx(max(scores))
    best = load_file(str(Path(run.trainer.state.best_model_checkpoint) / "model.safetensors"))
    for name in ("online_pooler.weight", "target_pooler.weight", "queue.keys"):
        assert torch.equal(run.trainer.model.state_dict()[name], best[name]), name


def check_tensorboard(run):
    events = list(run.output_dir.glob("**/events.out.tfevents.*"))
    assert events and b"train/pos_cos" in events[0].read_bytes()  # MoCoSE's own metrics reach TensorBoard


def _tensorboard_installed() -> bool:
    from transformers.integrations import is_tensorboard_available

    return is_tensorboard_available()


@dataclass
class Switch:
    id: str
    settings: dict
    check: Callable[[Run], None]
    prepare: Callable | None = None
    marks: tuple = ()


EVALUATING = dict(eval_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=1)
WORKING = [
    Switch("bf16", dict(bf16=True), check_bf16, record_head_dtype),
    Switch("gradient_checkpointing", dict(gradient_checkpointing=True), check_gradient_checkpointing),
    Switch("gradient_accumulation_steps", dict(gradient_accumulation_steps=2, queue_size=40), check_gradient_accumulation,
           count_ema_updates),
    Switch("optim_adamw_torch_fused", dict(optim="adamw_torch_fused"), check_fused_adamw),
    Switch("optim_adafactor", dict(optim="adafactor"), check_adafactor),
    Switch("lr_scheduler_type_cosine", dict(lr_scheduler_type="cosine"), check_cosine_schedule),
    Switch("auto_find_batch_size", dict(auto_find_batch_size=True, queue_size=40), check_auto_find_batch_size,
           simulate_out_of_memory_at_4),
    # transformers 5 spells group_by_length=True as train_sampling_strategy="group_by_length"
    Switch("group_by_length", dict(train_sampling_strategy="group_by_length"), check_group_by_length),
    Switch("dataloader_num_workers", dict(dataloader_num_workers=2), check_dataloader_workers),
    Switch("save_total_limit_and_resume", dict(save_strategy="steps", save_steps=1, save_total_limit=2),
           check_save_total_limit_and_resume),
    Switch("load_best_model_at_end", dict(EVALUATING, load_best_model_at_end=True, save_total_limit=None),
           check_load_best_model_at_end),
    Switch("report_to_tensorboard", dict(report_to="tensorboard"), check_tensorboard,
           marks=(pytest.mark.skipif(not _tensorboard_installed(), reason="tensorboard / tensorboardX not installed"),)),
]


@pytest.mark.parametrize("switch", [pytest.param(s, id=s.id, marks=s.marks) for s in WORKING])
def test_switch_trains_and_does_its_job(switch, tiny_encoder, tmp_path, baseline):
    evaluation = {"stsb_dev_file": sts_dev_file(tmp_path / "sts")} if "eval_strategy" in switch.settings else {}
    trainer = build(tiny_encoder, tmp_path, **switch.settings, **evaluation)
    if switch.prepare is not None:
        switch.prepare(trainer)
    trainer.train()
    assert len(losses(trainer)) == STEPS and all(math.isfinite(loss) for loss in losses(trainer))
    switch.check(Run(trainer, baseline, tmp_path, tiny_encoder))


# ----------------------------------------------------------------- torch_compile with every FGSM mode
@pytest.mark.parametrize("fgsm_mode, compiled_by", [("previous", "torch_compile"), ("exact", "torch_compile"),
                                                     ("off", "torch_compile"), ("previous", "accelerate config"),
                                                     ("exact", "accelerate config"), ("previous", "fullgraph"),
                                                     ("previous", "regional")])
def test_a_compiled_model_trains_with_every_fgsm_mode(fgsm_mode, compiled_by, tiny_encoder, tmp_path, monkeypatch):
    """The compiled run equals the eager one, FGSM included (its perturbation changes the losses), whether
    `torch_compile` or the accelerate config's `dynamo_backend` (`ACCELERATE_DYNAMO_BACKEND`, what `accelerate
    launch` sets from it) compiles the model: accelerate compiles it then with `torch_compile` false, and FGSM,
    which read that flag, read its gradient inside the graph and failed at the first backward. "fullgraph" and
    "regional": the config's `dynamo_use_fullgraph` (no graph break allowed) and
    `dynamo_use_regional_compilation` (a copy of the module tree, rebuilt from its children, had lost the
    encoder's emptied pooler slot: `'BertModel' object has no attribute 'pooler'`).

    `aot_eager` compiles through dynamo and AOTAutograd, the part that dropped the word embeddings'
    gradient, without inductor's code generation (minutes on 2 CPU cores).
    """
    from accelerate.utils import has_compiled_regions
    from conftest import compile_switches
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # fresh caches: no earlier test's graphs, no recompilation limit reached
    graphs = counters["stats"]["unique_graphs"]
    settings = dict(max_steps=2, fgsm_mode=fgsm_mode)
    compiled = build(tiny_encoder, tmp_path / "compiled", **compile_switches(monkeypatch, compiled_by), **settings)
    compiled.train()
    assert has_compiled_regions(compiled.model_wrapped)  # compiled whole, or in regions
    assert counters["stats"]["unique_graphs"] > graphs  # dynamo really captured the forward
    eager = build(tiny_encoder, tmp_path / "eager", **compile_switches(monkeypatch, None), **settings)
    eager.train()
    assert not has_compiled_regions(eager.model_wrapped)
    assert losses(compiled) == pytest.approx(losses(eager), abs=1e-5)
    if fgsm_mode == "off":
        return
    assert compiled.fgsm.mode == fgsm_mode  # never switched off behind the user's back
    unperturbed = build(tiny_encoder, tmp_path / "off", fgsm_mode="off", max_steps=2)
    unperturbed.train()
    first_perturbed = 1 if fgsm_mode == "previous" else 0  # "previous" has no gradient to reuse at step 1
    assert losses(compiled)[first_perturbed] != pytest.approx(losses(unperturbed)[first_perturbed], abs=1e-3)


# ----------------------------------------------------------------- refused in one line, before training
REFUSED = [
    ("neftune_noise_alpha", dict(neftune_noise_alpha=5.0), r"neftune_noise_alpha=5.0 \(NEFTune\).*fgsm_mode"),
    ("label_smoothing_factor", dict(label_smoothing_factor=0.1), r"label_smoothing_factor=0.1 .*InfoNCE"),
    ("fp16_on_cpu", dict(fp16=True), r"fp16=True does nothing when training on the CPU.*bf16=True"),
    ("max_seq_length", dict(max_seq_length=1024),
     r"max_seq_length 1024 for training is out of range: it must be between 2 and 128.*\(bert\)"),
    ("eval_max_seq_length", dict(eval_max_seq_length=999),
     r"eval_max_seq_length 999 for evaluation is out of range: it must be between 2 and 128"),
    ("metric_for_best_model", dict(metric_for_best_model="spearman", eval_strategy="steps", eval_steps=1,
                                   stsb_dev_file=True),
     r"metric_for_best_model='spearman' is never computed.*returns eval_stsb_spearman, eval_stsb_pearson"),
]


@pytest.mark.parametrize("settings,message", [pytest.param(s, m, id=i) for i, s, m in REFUSED])
def test_switch_is_refused_in_one_line_before_training(settings, message, tiny_encoder, tmp_path):
    from hf_mocose.commands.cli import is_user_error

    if settings.get("stsb_dev_file"):
        settings = {**settings, "stsb_dev_file": sts_dev_file(tmp_path / "sts")}
    with pytest.raises(ValueError, match=message) as refusal:
        build(tiny_encoder, tmp_path, **settings)  # the trainer's construction refuses: no step can run
    assert "\n" not in str(refusal.value)
    assert is_user_error(refusal.value)  # the command line prints it as one line, without a traceback


def test_metric_names_follow_a_dict_of_eval_datasets(tiny_encoder, tmp_path):
    from conftest import tiny_training_args

    from hf_mocose.trainer.mocose_trainer import MoCoSETrainer

    base = build(tiny_encoder, tmp_path)
    pairs = Dataset.from_dict({"sentence1": [a for a, _, _ in STS_PAIRS], "sentence2": [b for _, b, _ in STS_PAIRS],
                               "score": [score for _, _, score in STS_PAIRS]})

    def trainer(metric):
        args = tiny_training_args(tmp_path, **SETTINGS, eval_strategy="steps", eval_steps=1, metric_for_best_model=metric)
        return MoCoSETrainer(model=base.model, args=args, train_dataset=base.train_dataset,
                             processing_class=base.processing_class, eval_dataset={"dev": pairs})

    with pytest.raises(ValueError, match="returns eval_dev_stsb_spearman, eval_dev_stsb_pearson"):
        trainer("stsb_spearman")
    assert trainer("dev_stsb_pearson").args.metric_for_best_model == "dev_stsb_pearson"  # Trainer.evaluate's name

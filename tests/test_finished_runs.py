"""How a run ends: a resume of a run that already finished trains nothing and changes nothing, and the last
evaluation, already done at the last (or best) step, is not run again at the end."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from conftest import make_trainer

from hf_mocose.commands.train import cli_main
from hf_mocose.trainer.sts_evaluation import STSEvaluationMixin


def train_argv(encoder: str, corpus: Path, out: Path, *extra: str, steps: int = 4) -> list[str]:
    return ["--model_name_or_path", encoder, "--train_file", str(corpus), "--per_device_train_batch_size", "8",
            "--max_steps", str(steps), "--queue_size", "16", "--queue_init_size", "4", "--max_seq_length", "16",
            "--output_dir", str(out), "--use_cpu", "true", "--save_steps", "2", "--disable_tqdm", "true",
            "--report_to", "none", *extra]


def write_stsb(path: Path) -> str:
    """A SentEval-layout STS-B dev file of four pairs."""
    pairs = [("5.0", "A man is playing a guitar.", "A man plays the guitar."),
             ("0.5", "A woman is slicing an onion.", "A dog runs in a field."),
             ("3.2", "Kids play in the park.", "Children are playing outside."),
             ("1.0", "The stock market fell.", "A cat sleeps on the sofa.")]
    path.write_text("".join(f"g\tf\t2012\t{i}\t{s}\t{a}\t{b}\n" for i, (s, a, b) in enumerate(pairs)))
    return str(path)


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"Sentence number {i} is about a small thing.\n" for i in range(64)))
    return path


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


@pytest.fixture
def evaluations(monkeypatch) -> list[int]:
    """The global step of each STS evaluation that really scores (the evaluator run over the pairs)."""
    steps, real = [], STSEvaluationMixin.evaluation_loop

    def counted(self, *args, **kwargs):
        steps.append(self.state.global_step)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(STSEvaluationMixin, "evaluation_loop", counted)
    return steps


# ----------------------------------------------------------------------------- a resume of a finished run
def test_resuming_a_finished_run_trains_nothing_and_leaves_final_as_it_was(tiny_encoder, corpus, tmp_path, caplog):
    out = tmp_path / "run"
    assert cli_main(train_argv(tiny_encoder, corpus, out, "--eval_strategy", "no")) == 0
    before = snapshot(out)
    caplog.set_level(logging.WARNING, logger="hf_mocose")
    assert cli_main(train_argv(tiny_encoder, corpus, out, "--eval_strategy", "no", "--resume_from_checkpoint",
                               "last")) == 0
    assert snapshot(out) == before  # no checkpoint-5, final/ and the export untouched
    said = [r.getMessage() for r in caplog.records if "finished" in r.getMessage()]
    assert said == [f"This run finished at step 4 ({out / 'checkpoint-4'}, max_steps 4): nothing trained, the model "
                    "loaded as it ended. To train further, start a new run from its model: --model_name_or_path "
                    f"{out / 'checkpoint-4'} and a fresh --output_dir."]


@pytest.mark.parametrize("limit", ["max_steps", "epochs"])
def test_python_door_loads_a_finished_run_instead_of_training_it(tiny_encoder, tmp_path, limit):
    from safetensors.torch import load_file

    steps = {"max_steps": 4} if limit == "max_steps" else {"max_steps": -1, "num_train_epochs": 1}  # 16 / 4: 4 steps
    settings = dict(n_sentences=16, save_strategy="steps", save_steps=2, save_total_limit=None, **steps)
    make_trainer(tiny_encoder, tmp_path / "run", **settings).train()
    checkpoint = tmp_path / "run" / "checkpoint-4"
    trainer = make_trainer(tiny_encoder, tmp_path / "run", **settings)
    output = trainer.train(resume_from_checkpoint=str(checkpoint))
    assert output.global_step == trainer.finished_at_step == trainer.state.global_step == 4
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    saved = load_file(checkpoint / "model.safetensors")
    for name, tensor in trainer.model.state_dict().items():
        if name in saved:
            assert torch.equal(tensor, saved[name]), name  # the model as that run ended, not a fresh one


def test_mocose_loss_stops_a_resume_of_a_finished_run_before_any_step(tiny_encoder, tmp_path):
    from conftest import make_st_trainer

    out = tmp_path / "st"
    make_st_trainer(tiny_encoder, out, save_strategy="steps", save_steps=2, max_steps=4).train()
    before = snapshot(out)
    trainer = make_st_trainer(tiny_encoder, out, save_strategy="steps", save_steps=2, max_steps=4)
    with pytest.raises(ValueError) as refused:
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    assert str(refused.value) == ("This run finished at step 4 (max_steps 4): nothing trained or saved, the model and "
                                  "loss hold it as it ended. To train further, start a new run from its model: "
                                  f"SentenceTransformer({str(out / 'checkpoint-4')!r}), a new MoCoSELoss and a fresh "
                                  "output_dir.")
    assert snapshot(out) == before and trainer.state.global_step == 4  # no step 5, no checkpoint-5


# ----------------------------------------------------------------------------- a resume at another length
def planned_length_refusal(checkpoint: Path, step: int, asked: int, onward: str) -> str:
    finish = "It finished there" if step == 4 else "Resume with max_steps 4 to finish it"
    return (f"Cannot resume {checkpoint} (step {step}) with max_steps {asked}: its run planned 4, and its learning-rate "
            f"schedule and EMA decay ramp are laid out over 4 steps (resumed, both would jump onto schedules rebuilt "
            f"for {asked}). {finish}; to train further, start a new run from its model: {onward}.")


def test_a_resume_with_another_max_steps_is_refused_in_one_line(tiny_encoder, corpus, tmp_path, capsys):
    from test_preflight_refusals import refusal

    out = tmp_path / "run"
    assert cli_main(train_argv(tiny_encoder, corpus, out, "--eval_strategy", "no")) == 0
    before = snapshot(out)
    capsys.readouterr()
    for checkpoint, asked in ((out / "checkpoint-4", 6), (out / "checkpoint-2", 8), (out / "checkpoint-2", 3)):
        assert cli_main(train_argv(tiny_encoder, corpus, out, "--eval_strategy", "no", "--resume_from_checkpoint",
                                   str(checkpoint), steps=asked)) == 2
        step = int(checkpoint.name.split("-")[1])
        assert refusal(capsys) == planned_length_refusal(
            checkpoint, step, asked, f"--model_name_or_path {checkpoint} and a fresh --output_dir")
    assert snapshot(out) == before  # nothing trained, nothing saved


def test_mocose_loss_refuses_a_resume_with_another_max_steps_before_any_step(tiny_encoder, tmp_path):
    from conftest import make_st_trainer

    out = tmp_path / "st"
    make_st_trainer(tiny_encoder, out, save_strategy="steps", save_steps=2, max_steps=4).train()
    before = snapshot(out)
    for checkpoint, asked in ((out / "checkpoint-4", 6), (out / "checkpoint-2", 8)):
        trainer = make_st_trainer(tiny_encoder, out, save_strategy="steps", save_steps=2, max_steps=asked)
        with pytest.raises(ValueError) as refused:
            trainer.train(resume_from_checkpoint=str(checkpoint))
        step = int(checkpoint.name.split("-")[1])
        assert str(refused.value) == planned_length_refusal(
            checkpoint, step, asked, f"SentenceTransformer({str(checkpoint)!r}), a new MoCoSELoss and a fresh output_dir")
        assert trainer.state.global_step == step
    assert snapshot(out) == before


# ----------------------------------------------------------------------------- the last evaluation, once
def test_the_script_evaluates_the_last_step_once(tiny_encoder, corpus, tmp_path, capsys, evaluations):
    out, dev = tmp_path / "run", write_stsb(tmp_path / "sts-dev.csv")
    assert cli_main(train_argv(tiny_encoder, corpus, out, "--stsb_dev_file", dev, "--eval_strategy", "steps",
                               "--eval_steps", "2", "--load_best_model_at_end", "true",
                               "--export_sentence_transformers", "false")) == 0
    assert evaluations == [2, 4]  # steps 2 and 4; none more for the final score of the best model
    logged = {h["step"]: h["eval_stsb_spearman"] for h in json.loads((out / "trainer_state.json").read_text())[
        "log_history"] if "eval_stsb_spearman" in h}
    best = json.loads((out / "trainer_state.json").read_text())["best_global_step"]
    assert json.loads((out / "eval_results.json").read_text())["eval_stsb_spearman"] == logged[best]
    assert f"STS-B dev Spearman: {logged[best]:.2f}" in capsys.readouterr().out


def test_python_evaluate_after_training_reuses_the_last_steps_scores(tiny_encoder, tmp_path, evaluations):
    trainer = make_trainer(tiny_encoder, tmp_path / "run", stsb_dev_file=write_stsb(tmp_path / "sts-dev.csv"),
                           eval_strategy="steps", eval_steps=2, max_steps=4)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "eval_stsb_spearman" in h]
    assert evaluations == [2, 4] and len(logged) == 2
    metrics = trainer.evaluate()
    assert evaluations == [2, 4] and metrics["eval_stsb_spearman"] == logged[-1]["eval_stsb_spearman"]
    assert len([h for h in trainer.state.log_history if "eval_stsb_spearman" in h]) == 2  # not logged twice
    assert "test_stsb_spearman" in trainer.evaluate(metric_key_prefix="test") and evaluations == [2, 4, 4]
    with torch.no_grad():  # other weights: scored anew
        next(trainer.model.parameters()).add_(0.01)
    trainer.evaluate()
    assert evaluations == [2, 4, 4, 4]

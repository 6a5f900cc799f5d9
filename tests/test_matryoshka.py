"""Matryoshka MoCoSE (`matryoshka_dims`): the objective at every width with queries, keys and queue cut alike, in
both front ends, through sentence-transformers' own `MatryoshkaLoss` wrapper, refusals, and an exact resume."""

import math
from pathlib import Path

import pytest
import torch
from conftest import make_st_trainer, make_trainer, tiny_sentence_transformer
from datasets import Dataset
from test_st_loss import _long_sentences, _losses
from test_st_loss_runs import _assert_states_equal, _loss_state

from hf_mocose.data.corpus import python_docs_sentences
from hf_mocose.models import objective as objective_module

DIMS = [32, 16, 8]  # the tiny encoder is 32 wide


def _record_widths(monkeypatch):
    """Records, for every InfoNCE the objective takes, the widths of its queries, candidates and extra negatives."""
    seen, info_nce = [], objective_module.info_nce_loss

    def recording(queries, keys, temperature, **kwargs):
        extra = kwargs.get("extra_negatives")
        seen.append((queries.shape[-1], keys.shape[-1], None if extra is None else extra.shape[-1]))
        return info_nce(queries, keys, temperature, **kwargs)

    monkeypatch.setattr(objective_module, "info_nce_loss", recording)
    return seen


@pytest.mark.parametrize("front_end", ["trainer", "st_loss"])
def test_every_width_cuts_queries_keys_and_queue_alike(tiny_encoder, tmp_path, monkeypatch, front_end):
    seen = _record_widths(monkeypatch)
    if front_end == "trainer":
        trainer = make_trainer(tiny_encoder, tmp_path, max_steps=2, matryoshka_dims=DIMS)
    else:
        trainer = make_st_trainer(tiny_encoder, tmp_path, max_steps=2, loss_kwargs=dict(matryoshka_dims=DIMS))
    trainer.train()
    # each step: the full loss, then one per smaller width; the queue (extra negatives) is there and cut the same way
    assert seen == [(d, d, d) for d in DIMS] * 2
    assert all(torch.isfinite(torch.tensor(_losses(trainer))))


def test_simcse_mode_in_batch_negatives_at_every_width(tiny_encoder, tmp_path, monkeypatch):
    seen = _record_widths(monkeypatch)
    make_trainer(tiny_encoder, tmp_path, max_steps=1, method="simcse", matryoshka_dims=DIMS).train()
    assert [(q, k) for q, k, _ in seen] == [(d, d) for d in DIMS]


def test_the_loss_is_the_weighted_sum_over_widths(tiny_encoder, tmp_path):
    """Weights (1, 0, 0) give the plain loss exactly; other weights give another loss from the same first batch."""
    plain = make_trainer(tiny_encoder, tmp_path / "a", max_steps=2)
    plain.train()
    zero = make_trainer(tiny_encoder, tmp_path / "b", max_steps=2, matryoshka_dims=DIMS, matryoshka_weights=[1, 1e-30, 1e-30])
    zero.train()
    weighted = make_trainer(tiny_encoder, tmp_path / "c", max_steps=2, matryoshka_dims=DIMS)
    weighted.train()
    assert _losses(zero) == pytest.approx(_losses(plain), rel=1e-6)
    assert _losses(weighted)[0] > _losses(plain)[0] * 1.5  # three InfoNCE terms of similar size


def _wrapped_trainer(tiny_encoder, output_dir, dims, **matryoshka_kwargs):
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss
    from transformers import set_seed

    from hf_mocose import MoCoSELoss

    set_seed(0)
    model = tiny_sentence_transformer(tiny_encoder)
    inner = MoCoSELoss(model, queue_size=10, queue_init_size=3)
    loss = MatryoshkaLoss(model, inner, matryoshka_dims=dims, **matryoshka_kwargs)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=3, learning_rate=1e-3, logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0)
    dataset = Dataset.from_dict({"text": python_docs_sentences()[:64]})
    return SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=loss, callbacks=[inner.callback])


def _matryoshka_loss_honours_gradient_caching() -> bool:
    from sentence_transformers.sentence_transformer.losses import matryoshka

    return hasattr(matryoshka, "uses_gradient_cache")


@pytest.mark.skipif(not _matryoshka_loss_honours_gradient_caching(),
                    reason="this sentence-transformers' MatryoshkaLoss truncates model.forward for every inner loss; "
                           "use MoCoSELoss(model, matryoshka_dims=...)")
def test_sentence_transformers_wrapper_trains_as_the_keyword(tiny_encoder, tmp_path):
    wrapped = _wrapped_trainer(tiny_encoder, tmp_path / "wrapped", DIMS)
    wrapped.train()
    keyword = make_st_trainer(tiny_encoder, tmp_path / "keyword", max_steps=3, loss_kwargs=dict(matryoshka_dims=DIMS))
    keyword.train()
    assert _losses(wrapped) == pytest.approx(_losses(keyword), abs=1e-6)
    assert wrapped.loss.loss.settings["matryoshka_dims"] == DIMS


@pytest.mark.skipif(not _matryoshka_loss_honours_gradient_caching(), reason="see above")
def test_the_wrapper_sampling_dimensions_is_refused_naming_the_keyword(tiny_encoder, tmp_path):
    trainer = _wrapped_trainer(tiny_encoder, tmp_path, DIMS, n_dims_per_step=1)
    with pytest.raises(ValueError, match=r"n_dims_per_step=1.*matryoshka_dims=\[32, 16, 8\]"):
        trainer.train()


def test_a_wrapper_that_cuts_the_model_output_is_refused_naming_the_keyword(tiny_encoder, tmp_path, monkeypatch):
    """sentence-transformers < 6 (setup.cfg's floor is 5.4): `MatryoshkaLoss` cuts `model.forward` for every inner
    loss not of its own cached kind (the heads would then fail on a shape); simulated on 6.x by the same wrapper
    not seeing MoCoSELoss's `uses_gradient_cache`, and run on 5.4 by .ci/run's floors subset. Refused in one line
    before any weight moves."""
    from sentence_transformers.sentence_transformer.losses import matryoshka

    monkeypatch.setattr(matryoshka, "uses_gradient_cache", lambda loss: False, raising=False)
    trainer = _wrapped_trainer(tiny_encoder, tmp_path, DIMS)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(ValueError, match=r"cuts the model's output.*MoCoSELoss\(model, matryoshka_dims=\[\.\.\.\]\)"):
        trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


@pytest.mark.parametrize("kwargs, match", [
    (dict(matryoshka_dims=[32, 8, 16]), "descending"),
    (dict(matryoshka_dims=[16, 8]), "full width"),
    (dict(matryoshka_dims=[32, 0]), "whole numbers >= 1"),
    (dict(matryoshka_dims=[32, 16], matryoshka_weights=[1.0]), "2 numbers > 0"),
    (dict(matryoshka_weights=[1.0, 1.0]), "needs matryoshka_dims"),
])
def test_impossible_settings_are_refused_in_both_front_ends(tiny_encoder, tmp_path, kwargs, match):
    from hf_mocose import MoCoSELoss

    with pytest.raises(ValueError, match=match):
        MoCoSELoss(tiny_sentence_transformer(tiny_encoder), **kwargs)
    with pytest.raises(ValueError, match=match):
        make_trainer(tiny_encoder, tmp_path, **kwargs)


def test_the_command_line_flag_trains_and_the_export_truncates(tiny_encoder, tmp_path, capsys):
    """`--matryoshka_dims` (scripts/train.py, hf-mocose train): trains, records the dims in the checkpoint's
    arguments, the exported model loads with `truncate_dim`, and its card names the widths with the STS-B dev
    Spearman of each, one row per width."""
    _command_line_run_truncates(tiny_encoder, DIMS, tmp_path, capsys)


def _command_line_run_truncates(encoder, dims, tmp_path, capsys):
    import json

    from sentence_transformers import SentenceTransformer
    from test_trainer_evaluate import PAIRS, write_stsb

    from hf_mocose.commands.train import main, parse_args
    from hf_mocose.data.corpus import BUILTIN_PYTHON_DOCS

    tmp_path.mkdir(parents=True, exist_ok=True)
    argv = ["--model_name_or_path", encoder, "--train_file", BUILTIN_PYTHON_DOCS, "--max_train_samples", "32",
            "--per_device_train_batch_size", "8", "--max_steps", "2", "--queue_size", "16", "--queue_init_size", "4",
            "--output_dir", str(tmp_path), "--use_cpu", "true", "--eval_strategy", "no", "--save_strategy", "no",
            "--disable_tqdm", "true", "--max_seq_length", "16", "--matryoshka_dims", *map(str, dims),
            "--stsb_dev_file", write_stsb(tmp_path / "sts-dev.csv", PAIRS * 2)]
    assert parse_args(argv)[1].matryoshka_dims == dims
    final = main(argv)
    assert "Saved the final MoCoSE checkpoint" in capsys.readouterr().out
    assert torch.load(Path(final) / "training_args.bin", weights_only=False).matryoshka_dims == dims
    model = SentenceTransformer(str(tmp_path / "sentence-transformers"), truncate_dim=dims[-1])
    assert model.encode(["one sentence", "and another"]).shape == (2, dims[-1])
    metrics = json.loads((tmp_path / "eval_results.json").read_text())
    card = (tmp_path / "sentence-transformers" / "README.md").read_text()
    assert f"trained with Matryoshka dimensions {', '.join(map(str, dims))}" in card
    assert f"truncate_dim={dims[-1]})" in card
    assert "| Dimensions | STS-B dev |" in card
    for dim in dims:
        spearman = metrics["eval_stsb_spearman" + ("" if dim == dims[0] else f"_dim{dim}")]
        assert f"\n| {dim} | {spearman:.2f} |\n" in card


@pytest.mark.slow
def test_the_three_snippets_train_all_minilm_l6_v2_and_its_export_gives_64_dimensions(tmp_path, capsys):
    """The issue's three ways in, on the real encoder (384 wide, widths 384/128/64): sentence-transformers'
    `MatryoshkaLoss` around `MoCoSELoss` (the same losses as the keyword), the `MoCoSETrainer` field, and the
    command-line flag, whose export loads with `truncate_dim=64`."""
    from conftest import minilm_path

    encoder, dims = minilm_path(), [384, 128, 64]
    if _matryoshka_loss_honours_gradient_caching():
        wrapped = _wrapped_trainer(encoder, tmp_path / "wrapped", dims)
        wrapped.train()
        keyword = make_st_trainer(encoder, tmp_path / "keyword", max_steps=3, loss_kwargs=dict(matryoshka_dims=dims))
        keyword.train()
        assert _losses(wrapped) == pytest.approx(_losses(keyword), abs=1e-5)
    trainer = make_trainer(encoder, tmp_path / "trainer", matryoshka_dims=dims, max_steps=2)
    trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert trainer.args.matryoshka_dims == dims and losses and all(map(math.isfinite, losses))
    _command_line_run_truncates(encoder, dims, tmp_path / "cli", capsys)


def test_resume_is_exact(tiny_encoder, tmp_path):
    setup = dict(max_steps=6, save_strategy="steps", save_steps=3, dataset=Dataset.from_dict({"text": _long_sentences(64)}),
                 loss_kwargs=dict(queue_size=20, queue_init_size=3, matryoshka_dims=DIMS, matryoshka_weights=[1, .5, .25]),
                 model_kwargs=dict(max_seq_length=8))
    full = make_st_trainer(tiny_encoder, tmp_path / "full", **setup)
    full.train()
    resumed = make_st_trainer(tiny_encoder, tmp_path / "full", **setup)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    assert _losses(resumed)[-3:] == pytest.approx(_losses(full)[-3:], abs=1e-5)
    _assert_states_equal(_loss_state(resumed), _loss_state(full), atol=1e-5)


def test_the_trainer_scores_sts_b_dev_at_every_width(tiny_encoder, tmp_path):
    """`eval_stsb_spearman_dim{d}`: Spearman x100 of the first d entries of the same embeddings; a width may pick
    the best model, a width never scored is refused."""
    from scipy.stats import spearmanr
    from test_trainer_evaluate import PAIRS, write_stsb

    from hf_mocose.models.encoding import encode_with_model

    stsb = write_stsb(tmp_path / "sts-dev.csv", PAIRS * 2)
    trainer = make_trainer(tiny_encoder, tmp_path / "out", max_steps=1, matryoshka_dims=DIMS, stsb_dev_file=stsb,
                           eval_strategy="steps", eval_steps=1, metric_for_best_model="stsb_spearman_dim8")
    trainer.train()
    metrics = trainer.evaluate()
    assert {f"eval_stsb_{m}_dim{d}" for m in ("spearman", "pearson") for d in DIMS[1:]} <= set(metrics)
    assert not any(key.endswith(f"_dim{DIMS[0]}") for key in metrics)  # the full width keeps its own name
    first, second = (encode_with_model(trainer.model, trainer.processing_class, [p[i] for p in PAIRS * 2])
                     for i in (0, 1))
    for dim in DIMS:
        cosines = torch.nn.functional.cosine_similarity(first[:, :dim], second[:, :dim])
        expected = 100 * spearmanr([p[2] for p in PAIRS * 2], cosines.numpy())[0]
        name = "eval_stsb_spearman" + ("" if dim == DIMS[0] else f"_dim{dim}")
        assert metrics[name] == pytest.approx(expected, abs=1e-4)
    assert trainer.state.best_metric == pytest.approx(metrics["eval_stsb_spearman_dim8"], abs=1e-4)
    with pytest.raises(ValueError, match=r"metric_for_best_model='stsb_spearman_dim4' is never computed.*"
                                         r"eval_stsb_spearman_dim8"):
        make_trainer(tiny_encoder, tmp_path / "bad", matryoshka_dims=DIMS, stsb_dev_file=stsb, eval_strategy="steps",
                     metric_for_best_model="stsb_spearman_dim4").train()


def test_the_card_table_reads_one_evaluation_per_width():
    """`hf-mocose export --eval_results full.json dim16.json dim8.json`: each `--truncate_dim` evaluation is a row
    of its own; a width trained but not scored shows dashes; two full-width evaluations are refused."""
    from hf_mocose.publishing.model_card import matryoshka_section, read_eval_results

    full = {"stsb": {"spearman": 80.0, "pearson": 79.0}, "sickr": {"spearman": 70.0}, "avg": 75.0,
            "eval_stsb_spearman_dim16": 60.0}
    cut = {"stsb": {"spearman": 75.5}, "avg": 75.5, "meta": {"truncate_dim": 8}}
    results = read_eval_results([full, cut])
    assert results["sts"]["stsb"]["spearman"] == 80.0 and results["widths"] == {16: {"stsb_dev": 60.0},
                                                                               8: {"stsb": 75.5, "avg": 75.5}}
    section = matryoshka_section(results, [32, 16, 8, 4], 32)
    assert section["dims"] == [32, 16, 8, 4]
    assert section["table"].splitlines() == [
        "| Dimensions | STS-B | SICK-R | STS average | STS-B dev |", "|---|---|---|---|---|",
        "| 32 | 80.00 | 70.00 | 75.00 | – |", "| 16 | – | – | – | 60.00 |", "| 8 | 75.50 | – | 75.50 | – |",
        "| 4 | – | – | – | – |"]
    assert matryoshka_section(read_eval_results(full), None, 32)["table"] is not None  # widths scored, not recorded
    assert matryoshka_section(read_eval_results(None), None, 32) is None
    with pytest.raises(ValueError, match="2 evaluations of the full width"):
        read_eval_results([full, full])

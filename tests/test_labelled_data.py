"""Labelled data: (anchor, positive) pairs and (anchor, positive, negative_1..n) triplets in both front ends and the
command line, their refusals, and the labelled set built from the SentEval files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, labelled_dataset, make_st_trainer, make_trainer, tiny_training_args

from hf_mocose.data.corpus import load_sentences
from hf_mocose.trainer.inputs import check_train_dataset

SENTEVAL = REPO_ROOT.parent / "shared" / "data" / "senteval"
QUIET = dict(model_kwargs=dict(dropout=0.0), loss_kwargs=dict(queue_size=40, head_dropout=0.0, target_dropout=False))


def _losses(trainer) -> list[float]:
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


def _st_run(encoder, folder, n_negatives, **overrides):
    trainer = make_st_trainer(encoder, folder, dataset=labelled_dataset(n_negatives), **{**QUIET, **overrides})
    trainer.train()
    return trainer


@pytest.mark.parametrize("front_end", ["st", "trainer"])
def test_hard_negatives_join_every_anchors_denominator_and_never_the_queue(tiny_encoder, tmp_path, front_end):
    """The same seeds and rows: each hard-negative column adds B negatives to the first step's InfoNCE (a higher
    loss), and the queue still grows by the batch's positive keys only (3 random + 4 steps x 4)."""
    runs = {}
    for n in (0, 1, 2):
        if front_end == "st":
            runs[n] = _st_run(tiny_encoder, tmp_path / f"{n}", n)
            fill = int(runs[n].loss.queue.queue_fill)
        else:
            runs[n] = make_trainer(tiny_encoder, tmp_path / f"{n}", n_negatives=n, queue_size=40, encoder_dropout=0.0,
                                   head_dropout=0.0)
            runs[n].train()
            fill = int(runs[n].model.queue.queue_fill)
        assert fill == 3 + 4 * 4
    first = [_losses(runs[n])[0] for n in (0, 1, 2)]
    assert first[0] < first[1] < first[2], first
    assert all(math.isfinite(loss) for n in runs for loss in _losses(runs[n]))


def test_the_trainer_batches_n_negatives_per_row_and_encodes_them_as_keys(tiny_encoder, tmp_path):
    """MoCoSETrainer on a raw (anchor, positive, negative_1, negative_2) table, no flag: the collator's
    `negative_*` tensors hold the batch's 2 x 4 negatives row by row, and the model encodes them with the target."""
    trainer = make_trainer(tiny_encoder, tmp_path, n_negatives=2, encoder_dropout=0.0, head_dropout=0.0)
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["negative_input_ids"].shape[0] == 8 and batch["positive_input_ids"].shape[0] == 4
    tokenizer, rows = trainer.processing_class, labelled_dataset(2)
    decoded = tokenizer.batch_decode(batch["negative_input_ids"][:2], skip_special_tokens=True)
    anchor = tokenizer.decode(batch["input_ids"][0], skip_special_tokens=True)
    row = next(r for r in rows if tokenizer.decode(tokenizer(r["anchor"], truncation=True, max_length=16)["input_ids"],
                                                   skip_special_tokens=True) == anchor)
    expected = [tokenizer.decode(tokenizer(row[c], truncation=True, max_length=16)["input_ids"], skip_special_tokens=True)
                for c in ("negative_1", "negative_2")]
    assert decoded == expected  # the first row's two negatives first
    model = trainer.model.eval()
    with torch.no_grad():
        out = model(**{k: v for k, v in batch.items()})
        alone = model(input_ids=batch["negative_input_ids"], attention_mask=batch["negative_attention_mask"]).key
    assert out.negative_keys.shape == (8, model.config.key_dim)
    assert torch.allclose(out.negative_keys, alone, atol=1e-5)


def test_st_triplets_with_matryoshka_and_gradient_accumulation(tiny_encoder, tmp_path):
    """Matryoshka's widths and accumulated micro-batches take the hard negatives as they take the queue: 2 micro-batches
    of 2 with accumulation train as 1 batch of 4 does not (in-batch keys differ), but both run every width."""
    trainer = _st_run(tiny_encoder, tmp_path, 1, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                      loss_kwargs=dict(QUIET["loss_kwargs"], matryoshka_dims=[32, 16, 8]))
    plain = _st_run(tiny_encoder, tmp_path / "plain", 1, per_device_train_batch_size=2, gradient_accumulation_steps=2)
    assert trainer.state.global_step == 4 and int(trainer.loss.queue.queue_fill) == 3 + 4 * 2 * 2
    assert _losses(trainer)[0] > 2 * _losses(plain)[0]  # three widths' InfoNCE, each with the hard negatives


@pytest.mark.parametrize("front_end", ["st", "trainer"])
def test_resume_on_triplets_is_exact(tiny_encoder, tmp_path, front_end):
    def build():
        if front_end == "st":
            return make_st_trainer(tiny_encoder, tmp_path / "full", dataset=labelled_dataset(2), max_steps=6,
                                   save_strategy="steps", save_steps=3, **QUIET)
        return make_trainer(tiny_encoder, tmp_path / "full", n_negatives=2, max_steps=6, save_strategy="steps",
                            save_steps=3, queue_size=40, fgsm_mode="previous", fgsm_epsilon=0.01)

    full = build()
    full.train()
    resumed = build()
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    assert _losses(resumed)[-3:] == pytest.approx(_losses(full)[-3:], abs=1e-6)
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), atol=1e-6), name


def _cli(encoder, train_file, out, *more):
    from hf_mocose.commands.train import main

    return main(["--model_name_or_path", encoder, "--train_file", str(train_file), "--per_device_train_batch_size", "8",
                 "--max_steps", "2", "--queue_size", "16", "--queue_init_size", "0", "--output_dir", str(out),
                 "--use_cpu", "true", "--eval_strategy", "no", "--save_strategy", "no", "--disable_tqdm", "true",
                 "--export_sentence_transformers", "false", *more])


@pytest.mark.parametrize("suffix", ["jsonl", "csv", "parquet"])
def test_the_command_line_trains_on_a_file_of_triplets(tiny_encoder, tmp_path, suffix):
    """A file in sentence-transformers' columns needs no flag; the card facts record the format."""
    path = tmp_path / f"triplets.{suffix}"
    getattr(labelled_dataset(2, 24), {"jsonl": "to_json", "csv": "to_csv", "parquet": "to_parquet"}[suffix])(str(path))
    final = _cli(tiny_encoder, path, tmp_path / "out")
    facts = json.loads((Path(final) / "card_facts.json").read_text())["training_data"]
    assert facts["format"] == {"kind": "triplets", "negatives": 2} and facts["sentences"] == 24


def test_a_streamed_file_of_triplets_is_tokenised_with_its_negatives(tiny_encoder, tmp_path):
    from datasets import List, Value
    from transformers import AutoTokenizer

    from hf_mocose.data.corpus import tokenize_sentences

    path = tmp_path / "triplets.jsonl"
    labelled_dataset(2, 8).to_json(str(path))
    stream = tokenize_sentences(load_sentences(str(path), streaming=True), AutoTokenizer.from_pretrained(tiny_encoder), 16)
    row = next(iter(stream))
    assert len(row["negative_input_ids"]) == 2 and len(row["positive_input_ids"]) <= 16
    assert stream.features["negative_input_ids"] == List(List(Value("int32")))


def test_the_command_line_names_columns_that_differ(tiny_encoder, tmp_path):
    path = tmp_path / "nli.jsonl"
    path.write_text("".join(json.dumps({"premise": f"sentence {i} here", "entailed": f"a paraphrase of {i}",
                                        "contradicted": f"nothing like {i}"}) + "\n" for i in range(24)))
    final = _cli(tiny_encoder, path, tmp_path / "out", "--text_column", "premise", "--positive_column", "entailed",
                 "--negative_column", "contradicted")
    facts = json.loads((Path(final) / "card_facts.json").read_text())["training_data"]
    assert facts["format"] == {"kind": "triplets", "negatives": 1}
    with pytest.raises(ValueError, match="negative_column 'other' is not in the training data"):
        load_sentences(str(path), text_column="premise", positive_column="entailed", negative_columns=["other"])
    with pytest.raises(ValueError, match=r"Hard negatives \(contradicted\) need a positive"):
        load_sentences(str(path), text_column="premise", negative_columns=["contradicted"])


def test_bad_columns_are_refused_in_one_line_naming_them(tiny_encoder, tmp_path):
    rows = [{"anchor": f"a {i}", "positive": f"p {i}", "negative_1": f"n {i}", **({"negative_2": f"m {i}"} if i % 5 else {})}
            for i in range(20)]
    uneven = tmp_path / "uneven.jsonl"
    uneven.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError, match=r"negative_column 'negative_2' is empty in 4 of 20 rows \(first: row 0\); every "
                                         "row needs the same number of hard negatives"):
        load_sentences(str(uneven))
    table = labelled_dataset(1, 16)
    missing = table.remove_columns("negative_1").add_column("negative_1", [None, *table["negative_1"][1:]])
    cases = [(table.add_column("label", [1.0] * 16), "train_dataset has the label column 'label'"),
             (table.remove_columns("negative_1").add_column("negative_1", list(range(16))), "column 'negative_1' holds Value"),
             (missing, r"negative_column 'negative_1' is empty in 1 of 16 rows \(first: row 0\)")]
    for dataset, match in cases:
        with pytest.raises(ValueError, match=match):
            check_train_dataset(dataset, tiny_training_args(tmp_path))


def test_una_and_given_negatives_are_refused_together(tiny_encoder, tmp_path):
    with pytest.raises(ValueError, match="hard_negatives='una' draws each anchor's hard negative, but train_dataset "
                                         "gives its own"):
        make_trainer(tiny_encoder, tmp_path, n_negatives=1, hard_negatives="una")


@pytest.mark.skipif(not SENTEVAL.is_dir(), reason=f"the SentEval files are not at {SENTEVAL} (../shared/data/senteval)")
def test_the_labelled_set_from_senteval_is_deterministic_and_leaves_the_scored_sets_out(tmp_path):
    from hf_mocose.data.labelled import main, scored_sentences, senteval_pairs

    pairs, triplets = senteval_pairs(SENTEVAL), senteval_pairs(SENTEVAL, negatives=True)
    assert pairs.column_names == ["anchor", "positive"] and triplets.column_names == ["anchor", "positive", "negative"]
    assert (len(pairs), len(triplets)) == (4730, 154)
    assert pairs[0] == senteval_pairs(SENTEVAL)[0] and pairs["anchor"][-1] == senteval_pairs(SENTEVAL)["anchor"][-1]
    scored = scored_sentences(SENTEVAL)
    assert len(scored) > 8000
    assert not scored & {s for column in ("anchor", "positive") for s in pairs[column]}
    assert not scored & set(triplets["negative"])
    assert len(set(zip(pairs["anchor"], pairs["positive"]))) == len(pairs)
    out = tmp_path / "triplets.jsonl"
    main([str(SENTEVAL), str(out), "--negatives"])
    assert load_sentences(str(out))["negative_text"][0] == [triplets[0]["negative"]]

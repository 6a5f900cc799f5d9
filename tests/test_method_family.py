"""The method family on one model/queue/loss/trainer: slices, MTD, augmentations, IFCL, UNA, collapse."""

import math

import pytest
import torch
from conftest import CORPUS_FILE, make_trainer, needs_corpus, tiny_training_args

from hf_mocose.commands.cli import main as cli_main
from hf_mocose.augmentation.views import EmbeddingAugmentation
from hf_mocose.models.mtd import active_queue_window, check_target_reachable, max_traceable_distance, plan
from hf_mocose.models.queue import KeyQueue


def _filled_queue(capacity=10, n=10):
    queue = KeyQueue(capacity=capacity, dim=4, init_size=0)
    queue.enqueue(torch.randn(n, 4))
    return queue


# ----------------------------------------------------------------------------- queue slices
def test_age_slices_select_the_right_ages():
    queue = _filled_queue(capacity=10, n=13)  # wrapped: ptr = 3
    ages = queue.ages()
    weights = queue.negative_weights(age_slices=[(0, 3), (7, 10)])
    assert ((weights == 1) == (((ages >= 0) & (ages < 3)) | ((ages >= 7) & (ages < 10)))).all()
    assert int(weights.sum()) == 6


def test_slices_ignore_empty_slots_and_window_keeps_newest():
    queue = KeyQueue(capacity=10, dim=4, init_size=0)
    queue.enqueue(torch.randn(4, 4))
    assert int(queue.negative_weights(age_slices=[(2, 8)]).sum()) == 2  # ages 2, 3 exist
    weights = queue.negative_weights(newest=3)
    assert weights.tolist() == [0, 1, 1, 1, 0, 0, 0, 0, 0, 0]  # slots 1..3 hold ages 2..0


@pytest.mark.parametrize(
    "value,expected",
    [("0:256", [(0, 256)]), ("0:256,768:1024", [(0, 256), (768, 1024)]), ([256, 768], [(256, 768)]),
     ([[0, 256], [768, 1024]], [(0, 256), (768, 1024)])],
)
def test_queue_slice_formats(tmp_path, value, expected):
    args = tiny_training_args(tmp_path, queue_size=1024, queue_init_size=0, queue_slice=value)
    assert args.queue_age_slices == expected


@pytest.mark.parametrize("value", ["0:2000", "5:5", "-1:4", "a:b"])
def test_slices_outside_the_queue_are_rejected(tmp_path, value):
    with pytest.raises(ValueError, match="queue_slice"):
        tiny_training_args(tmp_path, queue_size=1024, queue_slice=value)


def test_trainer_uses_only_sliced_negatives(tiny_encoder, tmp_path, monkeypatch):
    trainer = make_trainer(tiny_encoder, tmp_path, queue_size=10, queue_init_size=10, queue_slice="0:4", fgsm_mode="off")
    seen = {}
    import hf_mocose.models.objective as objective_module

    original = objective_module.info_nce_loss

    def spy(*args, **kwargs):
        seen["weights"] = kwargs["extra_negative_weights"]
        return original(*args, **kwargs)

    monkeypatch.setattr(objective_module, "info_nce_loss", spy)
    trainer.compute_loss(trainer.model.train(), next(iter(trainer.get_train_dataloader())))
    assert int(seen["weights"].sum()) == 4
    assert (seen["weights"] == (trainer.model.queue.ages() < 4).float()).all()


# ----------------------------------------------------------------------------- IFCL forgetting
def test_forgetting_coefficients_match_formula():
    queue = _filled_queue(capacity=12, n=12)
    lam, n = 0.2, 4
    weights = queue.negative_weights(forgetting=lam, entries_per_batch=n)
    for age, weight in zip(queue.ages().tolist(), weights.tolist()):
        m = age + 1
        assert weight == pytest.approx(1 - lam * math.ceil(m / n))


def test_ifcl_queue_holds_online_anchors(tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path, method="ifcl", queue_size=16, queue_init_size=0,
                           ifcl_forgetting=0.2, encoder_dropout=0.0, head_dropout=0.0, max_steps=1)
    model = trainer.model
    assert not hasattr(model, "target_encoder") and hasattr(model, "queue")
    inputs = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        anchors = torch.nn.functional.normalize(model(**inputs).query, dim=1)
    trainer.train()
    assert torch.allclose(model.queue.newest_first()[:4], anchors.flip(0), atol=1e-5)


def test_ifcl_rejects_lambda_times_k_at_least_one(tiny_encoder, tmp_path):
    with pytest.raises(ValueError, match="ifcl_forgetting .* must be < 1"):
        make_trainer(tiny_encoder, tmp_path, method="ifcl", queue_size=16, queue_init_size=0, ifcl_forgetting=0.25)
    with pytest.raises(ValueError, match="ifcl_forgetting"):
        tiny_training_args(tmp_path, method="ifcl", ifcl_forgetting=1.5)


# ----------------------------------------------------------------------------- MTD
def test_mtd_math_and_plan():
    assert max_traceable_distance(0.85, 512, 64) == pytest.approx(14.667, abs=1e-3)
    rows = plan(14.67, 64)
    assert all(abs(d - 14.67) < 0.02 for _, _, d in rows)
    assert (0.85, 512) in [(eta, k) for eta, k, _ in rows]
    assert active_queue_window(14.67, 0.85, 64, 1024) == 512
    assert active_queue_window(14.67, 0.99, 64, 1024) == 0  # clamped


def test_mtd_unreachable_targets():
    with pytest.raises(ValueError, match="EMA alone gives"):
        check_target_reachable(10.0, 64, 512, 0.75, 0.95)  # 1/(1-0.95) = 20 > 10
    with pytest.raises(ValueError, match="needs .* queue entries"):
        check_target_reachable(14.67, 64, 256, 0.75, 0.85)


def test_mtd_command(capsys):
    assert cli_main(["mtd", "--batch_size", "64", "--decay", "0.85", "--queue_size", "512"]) == 0
    assert "= 14.67" in capsys.readouterr().out
    assert cli_main(["mtd", "--batch_size", "64", "--target", "14.67"]) == 0
    assert "| 0.85 | 512 | 14.67 |" in capsys.readouterr().out
    assert cli_main(["mtd", "--batch_size", "64"]) == 2


def test_target_mtd_holds_distance(tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path, queue_size=40, queue_init_size=40, target_mtd=6.0,
                           ema_decay_start=0.5, ema_decay_end=0.75, max_steps=4)
    trainer.train()
    for entry in (h for h in trainer.state.log_history if "d_trace" in h):
        # K_active is a whole number of keys: d_trace within 1/(2B) of the target
        assert entry["d_trace"] == pytest.approx(6.0, abs=1 / 8 + 1e-3)
    with pytest.raises(ValueError, match="needs .* queue entries"):
        make_trainer(tiny_encoder, tmp_path, queue_size=8, queue_init_size=8, target_mtd=6.0,
                     ema_decay_start=0.5, ema_decay_end=0.75)


# ----------------------------------------------------------------------------- embedding augmentations
def _embeddings():
    torch.manual_seed(0)
    x = torch.randn(3, 6, 8)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]])
    return x, mask


def test_token_shuffle_permutes_real_tokens_only():
    x, mask = _embeddings()
    out = EmbeddingAugmentation(shuffle=True)(x, mask)
    assert torch.equal(out[:, 0], x[:, 0])  # [CLS] stays
    assert torch.equal(out[1, 4:], x[1, 4:]) and torch.equal(out[2, 1:], x[2, 1:])  # padding (and a lone token) stays
    for row, length in ((0, 6), (1, 4)):
        assert sorted(out[row, 1:length, 0].tolist()) == sorted(x[row, 1:length, 0].tolist())
    assert not torch.equal(out[0], x[0])


def test_token_and_feature_cutoff():
    x, mask = _embeddings()
    many, many_mask = x[:1].expand(64, -1, -1).clone(), mask[:1].expand(64, -1)  # 64 copies of the full row
    zeroed = (EmbeddingAugmentation(token_cutoff=0.5)(many, many_mask) == 0).all(-1)
    assert not zeroed[:, 0].any()  # never [CLS]
    assert 0.35 < zeroed[:, 1:].float().mean() < 0.65  # about half of the real tokens
    padded = (EmbeddingAugmentation(token_cutoff=0.9)(x, mask) == 0).all(-1)
    assert not padded[mask == 0].any()  # padding is left as it was (not "cut")
    out = EmbeddingAugmentation(feature_cutoff=0.5)(x, mask)
    dims = (out == 0).all(1)  # (B, H): a zeroed dimension is zero for every token of the sentence
    assert dims.any() and ((out == 0) == dims[:, None, :]).all()


@pytest.mark.parametrize("kwargs", [{"token_cutoff": 1.0}, {"feature_cutoff": -0.1}])
def test_bad_cutoff_rates(tmp_path, kwargs):
    with pytest.raises(ValueError, match="cutoff"):
        tiny_training_args(tmp_path, **kwargs)


@pytest.mark.parametrize("method", ["mocose", "simcse"])
@pytest.mark.parametrize("views", ["online", "both"])
def test_augmentation_views(tiny_encoder, tmp_path, method, views):
    """`online`: the key view is clean; `both` (the reference code's): the key view gets its own draw."""
    trainer = make_trainer(tiny_encoder, tmp_path, method=method, feature_cutoff=0.5, augmentation_views=views,
                           encoder_dropout=0.0, head_dropout=0.0, fgsm_mode="off")
    model = trainer.model.train()
    inputs = next(iter(trainer.get_train_dataloader()))
    plain = model(**inputs)  # no augmentation
    _, augmented = trainer.compute_loss(model, inputs, return_outputs=True)
    assert not torch.equal(augmented.query, plain.query)
    assert torch.equal(augmented.key, plain.key) == (views == "online")
    if method == "simcse":  # without dropout the two views differ only by their augmentation draws
        assert torch.equal(plain.key, plain.query) and not torch.equal(augmented.key, augmented.query)


def test_augmentations_never_reach_evaluation(tiny_encoder, tmp_path):
    from datasets import Dataset

    pairs = Dataset.from_dict({"sentence1": ["a cat sits on the mat", "the sky is blue", "he plays the guitar"],
                               "sentence2": ["a cat is on a mat", "grass is green", "someone plays music"],
                               "score": [4.5, 1.0, 3.5]})
    augmented = make_trainer(tiny_encoder, tmp_path / "a", token_shuffle=True, token_cutoff=0.3, feature_cutoff=0.3,
                             augmentation_views="both", fgsm_mode="off")
    clean = make_trainer(tiny_encoder, tmp_path / "c", fgsm_mode="off")
    clean.model.load_state_dict(augmented.model.state_dict())
    augmented.model.train()  # even a model left in training mode embeds its sentences unaugmented
    def scores(trainer):  # the STS scores; evaluate() also reports runtimes, which differ run to run
        return {k: v for k, v in trainer.evaluate(pairs).items() if "stsb" in k}

    assert scores(augmented) == scores(clean)


def test_bad_augmentation_views(tmp_path):
    with pytest.raises(ValueError, match="augmentation_views 'target'"):
        tiny_training_args(tmp_path, token_shuffle=True, augmentation_views="target")


# ----------------------------------------------------------------------------- UNA
UNA_ARGS = dict(hard_negatives="una", una_window=0.5, una_frequency=2, fgsm_mode="off")


def _spy_on_info_nce(monkeypatch):
    """Records (queries, candidate keys, positive_index, extra negatives) of every InfoNCE the trainer computes."""
    import hf_mocose.models.objective as objective_module

    calls, original = [], objective_module.info_nce_loss

    def spy(queries, keys, temperature, positive_index=None, extra_negatives=None, extra_negative_weights=None):
        calls.append((queries.shape[0], keys.shape[0], positive_index,
                      0 if extra_negatives is None else extra_negatives.shape[0]))
        return original(queries, keys, temperature, positive_index, extra_negatives, extra_negative_weights)

    monkeypatch.setattr(objective_module, "info_nce_loss", spy)
    return calls


def test_una_negatives_every_f_steps(tiny_encoder, tmp_path, monkeypatch):
    trainer = make_trainer(tiny_encoder, tmp_path, keep_text=True, max_steps=4, una_usage="negative", **UNA_ARGS)
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["negative_input_ids"].shape[0] == batch["input_ids"].shape[0]
    calls = _spy_on_info_nce(monkeypatch)
    trainer.train()
    # queue of 10 always; the batch's 4 UNA negatives on steps 0 and 2 only, as extra negatives (never anchors)
    assert [c[3] for c in calls] == [14, 10, 14, 10]
    assert [c[:2] for c in calls] == [(4, 4)] * 4


@pytest.mark.parametrize("method", ["mocose", "simcse"])
def test_una_as_in_its_paper_trains_on_the_augmented_sentences_as_anchors(tiny_encoder, tmp_path, monkeypatch, method):
    trainer = make_trainer(tiny_encoder, tmp_path, keep_text=True, max_steps=4, method=method, **UNA_ARGS)
    assert trainer.args.una_usage == "paper"  # the default: what the UNA paper and its code do
    if method == "mocose":  # the queue takes the anchors' keys only, as on steps without UNA
        queue = trainer.model.queue
        pointer = int(queue.queue_ptr)
        trainer.compute_loss(trainer.model.train(), next(iter(trainer.get_train_dataloader()))).backward()
        assert (int(queue.queue_ptr) - pointer) % queue.capacity == 4  # enqueued after the backward
    calls = _spy_on_info_nce(monkeypatch)
    trainer.train()
    queue = 10 if method == "mocose" else 0
    # UNA steps (0, 2): 4 anchors + their 4 UNA sentences are queries; each UNA sentence's positive is its own
    # key (rows 4..7 of the candidates), and every query sees all 8 keys: the UNA keys are in every denominator.
    for step, (queries, candidates, positive_index, extra) in enumerate(calls):
        una_step = step % 2 == 0
        assert (queries, candidates, extra) == ((8, 8, queue) if una_step else (4, 4, queue))
        assert positive_index.tolist() == list(range(8 if una_step else 4))


def test_una_sentences_as_anchors_go_through_the_query_branch(tiny_encoder):
    from hf_mocose import MoCoSEModel

    model = MoCoSEModel.from_pretrained(tiny_encoder, queue_size=8, queue_init_size=0, encoder_dropout=0.0,
                                        head_dropout=0.0).train()
    ids, negative = torch.randint(1000, 2000, (3, 7)), torch.randint(1000, 2000, (3, 6))
    ones = torch.ones_like
    out = model(input_ids=ids, attention_mask=ones(ids), negative_input_ids=negative,
                negative_attention_mask=ones(negative), negatives_as_anchors=True)
    alone = model(input_ids=negative, attention_mask=ones(negative))
    assert torch.allclose(out.negative_queries, alone.query, atol=1e-6)  # online branch + predictor, with gradient
    assert torch.allclose(out.negative_keys, alone.key, atol=1e-6) and out.negative_queries.requires_grad
    plain = model(input_ids=ids, attention_mask=ones(ids), negative_input_ids=negative,
                  negative_attention_mask=ones(negative))
    assert plain.negative_queries is None


def test_una_statistics_count_the_given_paraphrases_too(tiny_encoder, tmp_path):
    """As the UNA reference with paraphrasing: one TF-IDF document per sentence and one per paraphrase."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from hf_mocose import MoCoSEModel
    from hf_mocose.data.corpus import tokenize_sentences
    from hf_mocose.trainer.mocose_trainer import MoCoSETrainer

    args = tiny_training_args(tmp_path, **UNA_ARGS)
    tokenizer = AutoTokenizer.from_pretrained(tiny_encoder)
    texts = [f"sentence {i} about cats" for i in range(8)]
    paraphrases = [f"zebra paraphrase number {i}" for i in range(8)]
    dataset = tokenize_sentences(Dataset.from_dict({"text": texts, "positive_text": paraphrases}), tokenizer, 16,
                                 keep_text=True)
    trainer = MoCoSETrainer(model=MoCoSEModel.from_pretrained(tiny_encoder, **args.model_config_kwargs()), args=args,
                            train_dataset=dataset, processing_class=tokenizer)
    statistics = trainer.data_collator.una_augmenter.statistics
    assert statistics.n_documents == 16 and "zebra" in statistics.word_to_id
    batch = next(iter(trainer.get_train_dataloader()))
    assert {"positive_input_ids", "negative_input_ids"} <= set(batch) and "positive_text" not in batch
    trainer.compute_loss(trainer.model.train(), batch)


def test_una_paper_usage_needs_in_batch_negatives(tmp_path):
    with pytest.raises(ValueError, match="una_usage='paper' .* in_batch_negatives=True"):
        tiny_training_args(tmp_path, method="ifcl", in_batch_negatives=False, **UNA_ARGS)
    tiny_training_args(tmp_path, method="ifcl", in_batch_negatives=False, una_usage="negative", **UNA_ARGS)
    with pytest.raises(ValueError, match="una_usage 'both'"):
        tiny_training_args(tmp_path, una_usage="both", **UNA_ARGS)


def test_una_collator_is_deterministic(tiny_encoder, tmp_path):
    first = make_trainer(tiny_encoder, tmp_path / "a", keep_text=True, **UNA_ARGS)
    second = make_trainer(tiny_encoder, tmp_path / "b", keep_text=True, **UNA_ARGS)
    one, two = (next(iter(t.get_train_dataloader())) for t in (first, second))
    assert torch.equal(one["negative_input_ids"], two["negative_input_ids"])
    assert not torch.equal(one["negative_input_ids"], one["input_ids"])


def test_una_needs_text_and_valid_settings(tiny_encoder, tmp_path):
    with pytest.raises(ValueError, match="`text` column"):
        make_trainer(tiny_encoder, tmp_path, **UNA_ARGS)
    for kwargs, match in (({"una_alpha": 0.0}, "alpha"), ({"una_window": 0.0}, "window"),
                          ({"una_frequency": 0}, "frequency"), ({"hard_negatives": "tfidf"}, "hard_negatives")):
        with pytest.raises(ValueError, match=match):
            tiny_training_args(tmp_path, **{**UNA_ARGS, **kwargs})


# ----------------------------------------------------------------------------- every method learns
@needs_corpus
@pytest.mark.parametrize(
    "method_kwargs",
    [
        {"method": "ifcl", "ifcl_forgetting": 0.2},
        {"method": "mocose", "hard_negatives": "una", "una_window": 0.1, "una_frequency": 1},
        {"method": "simcse", "hard_negatives": "una", "una_window": 0.1, "una_frequency": 1},
        {"method": "mocose", "token_shuffle": True, "token_cutoff": 0.1, "feature_cutoff": 0.1, "queue_slice": "0:8"},
    ],
    ids=["ifcl", "mocose-una", "simcse-una", "mocose-augmented"],
)
def test_each_method_trains_and_loss_goes_down(tiny_encoder, tmp_path, method_kwargs):
    sentences = CORPUS_FILE.read_text().splitlines()[:960]
    trainer = make_trainer(tiny_encoder, tmp_path, sentences=sentences, keep_text=True, per_device_train_batch_size=16,
                           max_steps=40, logging_steps=5, learning_rate=5e-4, queue_size=16, queue_init_size=0,
                           **method_kwargs)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.05, losses


def test_collapse_ablation_runs_and_logs_signal(tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path, predictor_layers=0, ema_decay_start=0.0, ema_decay_end=0.0,
                           max_steps=6, learning_rate=1e-2)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 6 and all(0.0 <= h["key_cos"] <= 1.0 for h in logs)
    assert all(math.isfinite(h["loss"]) for h in logs)
    assert logs[-1]["ema_decay"] == 0.0


# ----------------------------------------------------------------------------- given positives
@pytest.mark.parametrize("method", ["mocose", "simcse"])
def test_given_positive_replaces_the_key(tiny_encoder, method):
    from hf_mocose import MoCoSEModel

    model = MoCoSEModel.from_pretrained(tiny_encoder, method=method, queue_size=8, queue_init_size=0,
                                        encoder_dropout=0.0, head_dropout=0.0).train()
    ids, positive = torch.randint(1000, 2000, (3, 7)), torch.randint(1000, 2000, (3, 5))
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), positive_input_ids=positive,
                positive_attention_mask=torch.ones_like(positive))
    expected = model(input_ids=positive, attention_mask=torch.ones_like(positive)).key
    assert torch.allclose(out.key, expected, atol=1e-6)


def test_positive_column_end_to_end(tiny_encoder, tmp_path):
    from hf_mocose.commands.train import main

    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(f'{{"text": "sentence {i} here", "para": "a paraphrase of sentence {i}"}}\n' for i in range(24)))
    main(["--model_name_or_path", tiny_encoder, "--train_file", str(path), "--positive_column", "para",
          "--per_device_train_batch_size", "8", "--max_steps", "2", "--queue_size", "16", "--queue_init_size", "0",
          "--output_dir", str(tmp_path / "out"), "--use_cpu", "true", "--eval_strategy", "no", "--save_strategy", "no",
          "--disable_tqdm", "true", "--export_sentence_transformers", "false"])
    from hf_mocose.data.corpus import load_sentences

    with pytest.raises(ValueError, match="positive_column 'para2' is not in"):
        load_sentences(str(path), positive_column="para2")

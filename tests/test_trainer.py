"""MoCoSETrainer end to end on tiny encoders: learning, logging, queue feeding, evaluation, exact resume."""


import pytest
import torch
from conftest import CORPUS_FILE, make_trainer, needs_corpus


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_queue_receives_every_micro_batch(tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path, gradient_accumulation_steps=2, max_steps=2, queue_size=40)
    trainer.train()
    queue = trainer.model.queue
    assert int(queue.queue_fill) == 3 + 4 * 2 * 2  # K_s + batch x micro-batches
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert {"pos_cos", "neg_cos", "ema_decay", "d_trace", "queue_fill"} <= history[-1].keys()
    assert history[-1]["queue_fill"] == 19


def test_queued_keys_are_the_targets_keys(tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path, max_steps=1, encoder_dropout=0.0, head_dropout=0.0, fgsm_mode="off")
    model = trainer.model
    inputs = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        expected = torch.nn.functional.normalize(model(**inputs).key, dim=1)
    model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by train(); we call one step directly
    trainer.training_step(model, inputs)
    assert torch.allclose(model.queue.newest_first()[:4], expected.flip(0), atol=1e-6)


@needs_corpus
@pytest.mark.parametrize("method", ["mocose", "simcse"])
def test_short_run_on_corpus_lowers_loss(tiny_encoder, tmp_path, method):
    # K = B and K_s = 0: the queue holds real keys from the first step on, so the number and
    # hardness of negatives stay put and the loss is comparable from window to window.
    sentences = CORPUS_FILE.read_text().splitlines()[:960]
    trainer = make_trainer(
        tiny_encoder, tmp_path, sentences=sentences, method=method, per_device_train_batch_size=16,
        max_steps=40, logging_steps=5, learning_rate=5e-4, queue_size=16, queue_init_size=0,
    )
    trainer.train()
    losses = _losses(trainer)
    assert len(losses) == 8
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.1, losses


def test_evaluate_stsb_dev(tiny_encoder, tmp_path):
    rows = [
        ("main-captions", "MSRvid", "2012test", "0001", "5.0", "A man is playing a guitar.", "A man plays the guitar."),
        ("main-captions", "MSRvid", "2012test", "0002", "0.5", "A woman is slicing an onion.", "A dog runs in a field."),
        ("main-captions", "MSRvid", "2012test", "0003", "3.2", "Kids play in the park.", "Children are playing outside."),
        ("main-captions", "MSRvid", "2012test", "0004", "1.0", "The stock market fell.", "A cat sleeps on the sofa."),
    ]
    dev = tmp_path / "sts-dev.csv"
    dev.write_text("\n".join("\t".join(r) for r in rows) + "\n")
    trainer = make_trainer(
        tiny_encoder, tmp_path / "out", stsb_dev_file=str(dev), eval_strategy="steps", eval_steps=2, max_steps=2
    )
    trainer.train()
    evals = [h for h in trainer.state.log_history if "eval_stsb_spearman" in h]
    assert len(evals) == 1 and -100 <= evals[0]["eval_stsb_spearman"] <= 100
    metrics = trainer.evaluate()
    assert {"eval_stsb_spearman", "eval_stsb_pearson", "eval_runtime"} <= set(metrics)


def test_final_evaluate_with_evaluation_off_during_training(tiny_encoder, tmp_path):
    dev = tmp_path / "sts-dev.csv"
    dev.write_text("g\tf\t2012\t1\t5.0\tA man plays.\tA man is playing.\n"
                   "g\tf\t2012\t2\t0.0\tA cat sleeps.\tStocks fell today.\n"
                   "g\tf\t2012\t3\t2.5\tKids run.\tChildren play.\n")
    trainer = make_trainer(tiny_encoder, tmp_path / "out", stsb_dev_file=str(dev), eval_strategy="no", max_steps=1)
    trainer.train()
    assert {"eval_stsb_spearman", "eval_stsb_pearson"} <= set(trainer.evaluate())


def test_resume_gives_same_next_losses(tiny_encoder, tmp_path):
    common = dict(max_steps=6, save_strategy="steps", save_steps=3, fgsm_epsilon=1e-2)
    full = make_trainer(tiny_encoder, tmp_path / "full", **common)
    full.train()
    assert (tmp_path / "full" / "checkpoint-3" / "fgsm_rank0.pt").is_file()

    resumed = make_trainer(tiny_encoder, tmp_path / "resumed", **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    assert _losses(resumed)[-3:] == pytest.approx(_losses(full)[-3:], abs=1e-5)
    for name, tensor in full.model.state_dict().items():
        assert torch.allclose(tensor, resumed.model.state_dict()[name], atol=1e-5), name


def test_gradient_accumulation_matches_big_batch(tiny_encoder, tmp_path, monkeypatch):
    """Loss scaling: 2 x 4 accumulated equals one batch of 8.

    With a frozen queue and no in-batch negatives each example's loss is independent of its
    batch-mates, so any wrong scaling of accumulated losses (sum instead of mean) shows.
    """
    from hf_mocose.models.queue import KeyQueue

    monkeypatch.setattr(KeyQueue, "enqueue", lambda self, keys: None)
    settings = dict(encoder_dropout=0.0, head_dropout=0.0, fgsm_mode="off", in_batch_negatives=False,
                    queue_init_size=64, queue_size=64, learning_rate=1e-2, max_steps=1, max_grad_norm=0.0, optim="sgd")
    big = make_trainer(tiny_encoder, tmp_path / "big", per_device_train_batch_size=8, **settings)
    accumulated = make_trainer(tiny_encoder, tmp_path / "acc", gradient_accumulation_steps=2, **settings)
    big.train()
    accumulated.train()
    assert _losses(big)[0] == pytest.approx(_losses(accumulated)[0], abs=1e-5)
    assert torch.allclose(big.model.online_pooler.weight, accumulated.model.online_pooler.weight, atol=1e-6)


def test_bf16_autocast_keeps_queue_and_ema_in_fp32(tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path, bf16=True, max_steps=2)
    trainer.train()
    model = trainer.model
    assert model.queue.keys.dtype == torch.float32
    assert all(p.dtype == torch.float32 for m in model.target_modules() for p in m.parameters())
    losses = _losses(trainer)
    assert len(losses) == 2 and all(loss == loss for loss in losses)  # finite, not NaN
    assert int(model.queue.queue_fill) == 10  # K_s 3 + 2 steps x 4 keys, capped at K = 10


def test_in_batch_only_methods_need_two_sentences_per_step(tiny_encoder, tmp_path):
    with pytest.raises(ValueError, match="global batch is 1 .*per_device_train_batch_size=1 x 1 processes"):
        make_trainer(tiny_encoder, tmp_path, method="simcse", per_device_train_batch_size=1)


def test_model_config_wins_over_differing_arguments(tiny_encoder, tmp_path, caplog):
    from conftest import tiny_training_args

    from hf_mocose import MoCoSEModel
    from hf_mocose.trainer.mocose_trainer import MoCoSETrainer

    model = MoCoSEModel.from_pretrained(tiny_encoder, queue_size=10, queue_init_size=3, max_seq_length=16)
    MoCoSETrainer(model=model, args=tiny_training_args(tmp_path, queue_size=12))
    assert "'queue_size': (12, 10)" in caplog.text


def test_head_learning_rate_puts_heads_in_their_own_groups(tiny_encoder, tmp_path):
    trainer = make_trainer(tiny_encoder, tmp_path, head_learning_rate=0.5, learning_rate=1e-3, max_steps=2)
    trainer.train()
    model = trainer.model
    heads = {id(p) for p in model.head_parameters()}
    assert heads and len(heads) == sum(p.numel() > 0 for p in model.head_parameters())
    groups = trainer.optimizer.param_groups
    for group in groups:
        ids = {id(p) for p in group["params"]}
        assert ids <= heads or not ids & heads  # no group mixes heads and encoder
        expected = 0.5 if ids & heads else 1e-3
        assert group["initial_lr"] == expected
    covered = {id(p) for g in groups for p in g["params"]}
    assert heads <= covered and id(model.online_encoder.embeddings.word_embeddings.weight) in covered
    assert all(id(p) not in covered for m in model.target_modules() for p in m.parameters())


def test_head_learning_rate_must_be_positive(tmp_path):
    from conftest import tiny_training_args

    with pytest.raises(ValueError, match="head_learning_rate"):
        tiny_training_args(tmp_path, head_learning_rate=0.0)

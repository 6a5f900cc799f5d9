"""STS scoring inside `Trainer.evaluate`: the MoCoSE sentence embedding, scored by sentence-transformers.

`MoCoSETrainer` keeps `transformers.Trainer.evaluate` and replaces only the steps that assume a loss over batches
(`get_eval_dataloader`, `evaluation_loop`, `get_test_dataloader` for `predict`). STS-B dev is reported as
`{prefix}_stsb_spearman` / `{prefix}_stsb_pearson` x100 (as `hf-mocose evaluate`; the `MoCoSELoss` front end reports
[-1, 1]). Sentences are encoded whole unless `eval_max_seq_length` is set. With `matryoshka_dims`, the same
embeddings cut to each smaller width d are scored too: `{prefix}_stsb_spearman_dim{d}` / `{prefix}_stsb_pearson_dim{d}`
(`metric_for_best_model` may name one; the default stays the full width's).
A core module: `hf_mocose.evaluation` is never imported here.
"""

from __future__ import annotations

import os

import numpy as np
from datasets import Dataset
from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator
from torch.utils.data import DataLoader
from transformers.trainer_utils import EvalLoopOutput, EvalPrediction, denumpify_detensorize

from ..data.sts_files import read_sts_benchmark
from ..models.encoding import encode_with_model, resolve_max_length
from ..launch.checkpoints import weights_fingerprint

STS_COLUMNS = ("sentence1", "sentence2", "score")
STS_EVALUATOR_NAME = "stsb"  # metrics are `{prefix}_stsb_spearman` / `{prefix}_stsb_pearson`


def stsb_dev_dataset(path: str | os.PathLike) -> Dataset:
    """STS-B dev pairs (`sentence1`, `sentence2`, `score`) as a `Dataset`, read from SentEval's `sts-dev.csv`."""
    pairs = read_sts_benchmark(path)  # scores already floats
    return Dataset.from_dict({"sentence1": pairs.sentences1, "sentence2": pairs.sentences2, "score": pairs.scores})


def check_sts_dataset(dataset) -> None:
    """Raises a `ValueError` naming what is wrong when `dataset` is not STS pairs with gold scores."""
    if (columns := getattr(dataset, "column_names", None)) is None:
        raise ValueError(f"The STS evaluation dataset must be a datasets.Dataset, got {type(dataset).__name__}.")
    if missing := [c for c in STS_COLUMNS if c not in columns]:
        raise ValueError(f"The STS evaluation dataset needs the columns {', '.join(STS_COLUMNS)}; missing "
                         f"{', '.join(missing)} (it has {', '.join(columns) or 'no columns'}).")
    if len(dataset) < 2:
        raise ValueError(f"The STS evaluation dataset has {len(dataset)} pair(s); a correlation needs at least 2.")


def eval_max_length(model, tokenizer, requested: int | None = None) -> int:
    """Evaluation truncation: `requested` (at most the encoder's limit), else that limit (whole sentences)."""
    limit = resolve_max_length(tokenizer, getattr(model, "online_encoder", model).config)
    if requested is None:
        return limit
    if not 2 <= requested <= limit:
        raise ValueError(f"eval_max_seq_length must be between 2 and the encoder's limit {limit}, got {requested!r}.")
    return int(requested)


class MoCoSESimilarityEvaluator(EmbeddingSimilarityEvaluator):
    """sentence-transformers' `EmbeddingSimilarityEvaluator` on a `MoCoSEModel`'s sentence embedding.

    Only `embed_inputs` is MoCoSE's: `MoCoSEModel.embed` through `encode_with_model` with `tokenizer`, truncating at
    `max_length` tokens (None: the encoder's own limit). `name` prefixes the metrics (`{name}_spearman_cosine`,
    correlations in [-1, 1]); the other arguments are `EmbeddingSimilarityEvaluator`'s."""

    def __init__(self, sentences1, sentences2, scores, tokenizer, max_length: int | None = None,
                 batch_size: int = 64, name: str = STS_EVALUATOR_NAME, write_csv: bool = True):
        super().__init__(list(sentences1), list(sentences2), [float(s) for s in scores], batch_size=batch_size,
                         main_similarity="cosine", name=name, write_csv=write_csv)
        self.tokenizer, self.max_length = tokenizer, max_length
        self.embeddings: list[np.ndarray] = []  # of the last call: sentences1's, then sentences2's

    def embed_inputs(self, model, sentences, **kwargs) -> np.ndarray:
        """`(len(sentences), hidden)` float32 embeddings from `MoCoSEModel.embed`."""
        # Not `model.encode` (the evaluator's default): the model under training is no SentenceTransformer.
        embeddings = encode_with_model(model, self.tokenizer, list(sentences), batch_size=self.batch_size,
                                       max_length=self.max_length).numpy()
        self.embeddings = [*self.embeddings[-1:], embeddings]
        return embeddings

    def pair_similarities(self, dim: int | None = None) -> np.ndarray:
        """`(N,)` cosine similarity of each pair at the last call (what the correlations were computed on), or of
        the embeddings' first `dim` entries (a Matryoshka width)."""
        from sentence_transformers.util import pairwise_cos_sim
        first, second = (embeddings[:, :dim] for embeddings in self.embeddings)
        return pairwise_cos_sim(first, second).detach().cpu().numpy()

    def correlations_at(self, dim: int) -> tuple[float, float]:
        """Spearman and Pearson in [-1, 1] of the last call's pairs at the embeddings' first `dim` entries."""
        from scipy.stats import pearsonr, spearmanr
        similarities = self.pair_similarities(dim)
        return float(spearmanr(self.scores, similarities)[0]), float(pearsonr(self.scores, similarities)[0])

    def store_metrics_in_model_card_data(self, model, metrics, epoch=0, step=0) -> None:
        # Only a SentenceTransformer carries model-card data; the export's card reads the metrics instead.
        if hasattr(model, "model_card_data"):
            super().store_metrics_in_model_card_data(model, metrics, epoch, step)


class STSEvaluationMixin:
    """`Trainer` hooks that make `Trainer.evaluate` score STS pairs (see the module docstring)."""

    def check_eval_datasets(self) -> None:
        """Fails before training when an `eval_dataset` (or one of a dict of them) is not STS pairs."""
        datasets = self.eval_dataset.values() if isinstance(self.eval_dataset, dict) else [self.eval_dataset]
        for dataset in datasets:
            if dataset is not None:
                check_sts_dataset(dataset)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """`Trainer.evaluate`; after training, the scores of the same weights, STS pairs and length (the last step's,
        the best one's) are returned again, not recomputed nor logged twice (FSDP: not fingerprinted, recomputed)."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        key = None if self.is_fsdp_enabled else (metric_key_prefix, id(dataset), self.args.eval_max_seq_length, bytes(
            weights_fingerprint(self.accelerator.unwrap_model(self.model)).numpy()))
        scored = self.__dict__.setdefault("_scores_by_weights", {})
        if key is None or key not in scored or self.is_in_train:
            scored[key] = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        return dict(scored[key])

    def get_eval_dataloader(self, eval_dataset=None) -> DataLoader:
        """The STS pairs as they are (no tokenisation, no column removal): `evaluation_loop` reads `.dataset`."""
        if isinstance(eval_dataset, str):  # Trainer.evaluate recursing over a dict of eval datasets
            eval_dataset = self.eval_dataset[eval_dataset]
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None and self.args.stsb_dev_file:  # evaluation off during training, asked for at the end
            dataset = self.eval_dataset = stsb_dev_dataset(self.args.stsb_dev_file)
        if dataset is None:
            raise ValueError("No STS pairs to evaluate: pass eval_dataset or set stsb_dev_file.")
        check_sts_dataset(dataset)
        return DataLoader(dataset, batch_size=self.args.eval_batch_size, collate_fn=list)

    def get_test_dataloader(self, test_dataset) -> DataLoader:
        """For `predict`: STS pairs, or sentences in a `text` column, as they are (`evaluation_loop` reads them)."""
        columns = getattr(test_dataset, "column_names", None)
        if columns is None or not ("text" in columns or all(c in columns for c in STS_COLUMNS)):
            got = ", ".join(columns or []) or type(test_dataset).__name__
            raise ValueError("predict() takes STS pairs (columns sentence1, sentence2, score: their similarities and "
                             f"scores) or sentences (a text column: their embeddings); got {got}.")
        if "text" not in columns:
            check_sts_dataset(test_dataset)
        return DataLoader(test_dataset, batch_size=self.args.eval_batch_size, collate_fn=list)

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix: str = "eval") -> EvalLoopOutput:
        """Scores STS pairs with `MoCoSESimilarityEvaluator`; no loss. STS pairs: `predictions` are the cosine
        similarities `(N,)`, `label_ids` the gold scores `(N,)`. A `text` column (from `predict`): `predictions`
        are the sentence embeddings `(N, D)` float32."""
        dataset = dataloader.dataset
        model = self.accelerator.unwrap_model(self.model)
        max_length = eval_max_length(model, self.processing_class, self.args.eval_max_seq_length)
        if "text" in dataset.column_names and not all(c in dataset.column_names for c in STS_COLUMNS):
            embeddings = encode_with_model(model, self.processing_class, list(dataset["text"]),
                                           batch_size=self.args.per_device_eval_batch_size, max_length=max_length)
            return EvalLoopOutput(predictions=embeddings.numpy(), label_ids=None, metrics={}, num_samples=len(dataset))
        evaluator = MoCoSESimilarityEvaluator(dataset["sentence1"], dataset["sentence2"], dataset["score"],
                                              tokenizer=self.processing_class, max_length=max_length,
                                              batch_size=self.args.per_device_eval_batch_size)
        output_path = os.path.join(self.args.output_dir, "eval") if self.is_world_process_zero() else None
        epoch = self.state.epoch if self.state.epoch is not None else -1
        scores = evaluator(model, output_path=output_path, epoch=epoch, steps=self.state.global_step)
        name = STS_EVALUATOR_NAME
        metrics = {f"{metric_key_prefix}_{name}_spearman": 100 * float(scores[f"{name}_spearman_cosine"]),
                   f"{metric_key_prefix}_{name}_pearson": 100 * float(scores[f"{name}_pearson_cosine"])}
        for dim in (self.args.matryoshka_dims or [])[1:]:  # the same embeddings, cut to each smaller width
            spearman, pearson = evaluator.correlations_at(dim)
            metrics.update({f"{metric_key_prefix}_{name}_spearman_dim{dim}": 100 * spearman,
                            f"{metric_key_prefix}_{name}_pearson_dim{dim}": 100 * pearson})
        similarities, gold = evaluator.pair_similarities(), np.asarray(evaluator.scores)
        if self.compute_metrics is not None:  # as Trainer.evaluation_loop: the user's metrics, prefixed
            prediction = EvalPrediction(predictions=similarities, label_ids=gold)
            extra = denumpify_detensorize(self.compute_metrics(prediction))
            metrics.update({k if k.startswith(f"{metric_key_prefix}_") else f"{metric_key_prefix}_{k}": v
                            for k, v in extra.items()})
        return EvalLoopOutput(predictions=similarities, label_ids=gold, metrics=metrics, num_samples=len(dataset))


__all__ = ["STS_COLUMNS", "STS_EVALUATOR_NAME", "MoCoSESimilarityEvaluator", "STSEvaluationMixin", "check_sts_dataset",
           "eval_max_length", "stsb_dev_dataset"]

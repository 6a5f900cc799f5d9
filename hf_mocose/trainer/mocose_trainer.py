"""`MoCoSETrainer`: a `Trainer` that computes the contrastive loss, feeds the queue and scores STS-B dev.

The training loop is `transformers.Trainer`'s own; `__init__` first turns what it is given into what it trains
(`trainer.inputs`, as TRL's trainers). Overrides: `compute_loss` (`ContrastiveObjective`'s step, as `MoCoSELoss`'s),
`log` (the method's running metrics at logging steps, no host sync in between), evaluation (`STSEvaluationMixin`:
STS-B dev, so `load_best_model_at_end` works), `train` (preflight and resume first; a finished run trains nothing),
the checkpoint hooks (FGSM's "previous" gradient, `card_facts.json` beside every saved model, FSDP2 sharded saves
completed) and Hub publishing (`HubPublishingMixin`). The EMA target update is a callback (`EMATargetCallback`).
"""

from __future__ import annotations

import logging
import os
from functools import partial
from pathlib import Path

import torch
from accelerate.utils import is_compiled_module
from datasets import Dataset
from transformers import PreTrainedModel, Trainer, TrainerState
from transformers.trainer import TRAINER_STATE_NAME, TRAINING_ARGS_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput, has_length

from ..compat import planned_max_steps
from ..data.corpus import ContrastiveCollator
from ..augmentation.views import EmbeddingAugmentation, repeat_words
from ..models.mtd import active_queue_window
from ..models.ema import EMATargetCallback, ema_decay_at
from ..models.modeling import MoCoSEModel
from ..models.objective import ContrastiveObjective, FGSMPerturbation
from ..publishing.hub import HubPublishingMixin
from ..publishing.card_facts import save_card_facts
from ..models.configuration import MODEL_CONFIG_FIELDS
from ..launch.checkpoints import (RecordTrainBatchSize, check_planned_length, checkpoint_step, prepare_resume,
                                 resumed_step)
from ..launch.preflight import check_run, preflight
from ..launch.run_folder import check_room_for_a_save, failed_save_sentence, release_run_folder, tensor_bytes
from ..launch.sharding import configure_sharding
from ..launch.stop_request import StopOnRequestCallback, refuse_jit_checkpoint
from .inputs import prepare_trainer_inputs
from .sts_evaluation import STSEvaluationMixin, stsb_dev_dataset
from .checks import check_trainer_switches
from .training_args import MoCoSETrainingArguments

OLDER_FGSM_STATE_FILE = "fgsm_state_rank{rank}.pt"  # checkpoints of 0.1 still load
logger = logging.getLogger(__name__)
# Training a checkpoint's model further (its target, queue and heads) on a new schedule.
NEW_RUN_HINT = "--model_name_or_path {} and a fresh --output_dir"
NEGATIVE_INPUTS = ("negative_input_ids", "negative_attention_mask", "negative_token_type_ids")


def complete_sharded_save(trainer, output_dir: str) -> None:
    """After `Trainer.save_model(output_dir)` under FSDP with `SHARDED_STATE_DICT`, which writes nothing: in the
    checkpoint being written, config.json, tokenizer, training_args.bin and card_facts.json beside accelerate's DCP
    folder (so resume recognises it); in any other folder (what export and push read) the full weights, gathered
    from all ranks. Runs on every process (the gather is collective); a no-op for other set-ups."""
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None) if trainer.is_fsdp_enabled else None
    if plugin is None or "SHARDED_STATE_DICT" not in str(plugin.state_dict_type):
        return
    if Path(output_dir).name == f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}":
        if trainer.args.should_save:
            os.makedirs(output_dir, exist_ok=True)
            trainer.accelerator.unwrap_model(trainer.model).config.save_pretrained(output_dir)
            if trainer.processing_class is not None:
                trainer.processing_class.save_pretrained(output_dir)
            torch.save(trainer.args, os.path.join(output_dir, TRAINING_ARGS_NAME))
            save_card_facts(output_dir, trainer)
        return
    trainer._save(output_dir, state_dict=trainer.accelerator.get_state_dict(trainer.model))


class MoCoSETrainer(STSEvaluationMixin, HubPublishingMixin, Trainer):
    """Trains a [`MoCoSEModel`] with [`MoCoSETrainingArguments`].

    ```python
    trainer = MoCoSETrainer(model="sentence-transformers/all-MiniLM-L6-v2",  # or a folder, or a loaded model
                            args=MoCoSETrainingArguments(output_dir="out", hub_model_id="me/m"),
                            train_dataset=Dataset.from_dict({"text": sentences}))
    ```

    Args:
        model: a `MoCoSEModel`; a model id or folder (`str`: a MoCoSE checkpoint, or an encoder a fresh MoCoSE
            model is built around with the *(model)* fields of `args`, loaded with `args.model_init_kwargs`);
            `builtin:all-MiniLM-L6-v2`; or a loaded `PreTrainedModel` encoder (see `hf_mocose.trainer.inputs`).
        train_dataset: raw sentences in a `text` column (optional `positive_text`), or tokenised ones (`input_ids`,
            `attention_mask`, ...; plus `text`, and any `positive_text`, for UNA).
        eval_dataset: STS pairs with `sentence1`, `sentence2`, `score`; defaults to `args.stsb_dev_file`.
        processing_class: the tokenizer; loaded with `AutoTokenizer` from where the model came from when omitted.
        **kwargs: `Trainer`'s other arguments; `compute_metrics` is called at each evaluation with
            `EvalPrediction(predictions=cosine similarities (N,), label_ids=gold scores (N,))` of the STS pairs, its
            metrics added with the key prefix.
    """

    def __init__(self, model: MoCoSEModel | PreTrainedModel | str, args: MoCoSETrainingArguments,
                 train_dataset: Dataset | None = None, eval_dataset: Dataset | None = None, processing_class=None,
                 data_collator=None, **kwargs):
        refuse_jit_checkpoint(args)  # before the model loads; its SIGTERM handler is installed by Trainer.__init__
        model, processing_class, train_dataset, self.training_data = prepare_trainer_inputs(
            model, args, train_dataset, processing_class, eval_dataset)  # training_data: for the card (_save)
        config = model.config
        una = self._build_una(args, train_dataset) if args.hard_negatives == "una" else None
        fraternal = train_dataset is not None and "fraternal_input_ids" in train_dataset.column_names
        if fraternal and config.method != "ifcl":
            raise ValueError(f"A fraternal view is IFCL's: set method='ifcl' (got {config.method!r}).")
        if data_collator is None:
            # The fraternal view is fused position by position: anchors padded to the same fixed length.
            repeat = partial(repeat_words, rate=args.word_repetition_rate) if args.word_repetition_rate else None
            data_collator = ContrastiveCollator(processing_class, config.max_seq_length, args.pad_to_max_length or
                                                fraternal, una_augmenter=una, seed=args.seed, repeat_positives=repeat)
        if eval_dataset is None and args.stsb_dev_file and args.eval_strategy != "no":
            eval_dataset = stsb_dev_dataset(args.stsb_dev_file)
        super().__init__(model=model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                         processing_class=processing_class, data_collator=data_collator, **kwargs)
        # Settings that depend on the world size, checked before any step (`launch.preflight`).
        check_run({**vars(args), **{name: getattr(config, name) for name in MODEL_CONFIG_FIELDS}},
                  self.keys_per_enqueue, args.gradient_accumulation_steps, target_mtd=args.target_mtd,
                  max_steps=args.max_steps, batch_source=f"per_device_train_batch_size="
                  f"{args.per_device_train_batch_size} x {args.world_size} processes")
        configure_sharding(self, config)  # FSDP2 set-up; refuses what the EMA target cannot follow
        self.check_eval_datasets()
        check_trainer_switches(self)  # switches that cannot work (NEFTune, fp16 on CPU, ...): refused before training
        differing = {k: (v, getattr(config, k)) for k, v in args.model_config_kwargs().items() if getattr(config, k) != v}
        if differing:
            logger.warning("The model's config wins over these training arguments (argument, model): %s", differing)
        self.objective = ContrastiveObjective.from_settings(config, vars(args), queue_age_slices=args.queue_age_slices,
                                                            queue_window=self.queue_window, key_dim=config.key_dim,
                                                            embedding_dim=config.hidden_size)
        self.embedding_augmentation = EmbeddingAugmentation(args.token_shuffle, args.token_cutoff, args.feature_cutoff,
                                                            views=args.augmentation_views)
        self.add_callback(RecordTrainBatchSize())  # trainer_state.json: the batch size of a resume at another one
        self.stop_on_request = StopOnRequestCallback()  # SIGTERM/SIGUSR1/SIGINT: a checkpoint, then exit status 75
        self.add_callback(self.stop_on_request)
        self.ema_callback, self.finished_at_step = None, None
        if config.uses_target:
            self.ema_callback = EMATargetCallback(model, args.ema_decay_start, args.ema_decay_end, args.ema_decay_horizon)
            self.add_callback(self.ema_callback)

    @staticmethod
    def _build_una(args: MoCoSETrainingArguments, train_dataset: Dataset | None):
        from ..augmentation.una import UNAAugmenter, UNAStatistics

        if train_dataset is None or "text" not in train_dataset.column_names:
            raise ValueError("hard_negatives='una' needs the training sentences: keep a `text` column in train_dataset.")
        # As the UNA reference: one document per training sentence, plus one per given positive (paraphrase).
        paraphrases = train_dataset["positive_text"] if "positive_text" in train_dataset.column_names else []
        corpus = [*train_dataset["text"], *paraphrases]
        statistics = UNAStatistics.from_corpus(corpus, cache_dir=Path(args.output_dir) / "una_statistics")
        return UNAAugmenter(statistics, alpha=args.una_alpha, window=args.una_window_value, seed=args.seed)

    # ----------------------------------------------------------------- optimizer
    def create_optimizer(self, model=None):
        """The Trainer's optimizer; with `head_learning_rate` set, the heads get their own groups at it."""
        fresh = self.optimizer is None
        optimizer = super().create_optimizer(*([model] if model is not None else []))  # transformers < 5 takes none
        if fresh and self.args.head_learning_rate is not None:
            heads = {id(p) for p in self.accelerator.unwrap_model(self.model).head_parameters()}
            for group in list(optimizer.param_groups):
                if head_params := [p for p in group["params"] if id(p) in heads]:
                    group["params"] = [p for p in group["params"] if id(p) not in heads]
                    settings = {k: v for k, v in group.items() if k != "params"}
                    optimizer.add_param_group({**settings, "params": head_params, "lr": self.args.head_learning_rate})
        return optimizer

    # ----------------------------------------------------------------- loss
    @property
    def global_batch_size(self) -> int:
        """Sentences per optimizer step over all processes (B in d_trace = 1/(1-eta) + K/B)."""
        return self.keys_per_enqueue * self.args.gradient_accumulation_steps

    @property
    def keys_per_enqueue(self) -> int:
        """Keys enqueued per micro-batch: the batch of every process (the one `auto_find_batch_size` settled on)."""
        return self._train_batch_size * self.args.world_size

    def queue_window(self, decay: float | None = None) -> int | None:
        """Newest queue entries used while `target_mtd` fixes d_trace, at `decay` (default eta(step)); None: all."""
        args = self.args
        if args.target_mtd is None:
            return None
        if decay is None:
            decay = ema_decay_at(self.state.global_step, self.state.max_steps, args.ema_decay_start,
                                 args.ema_decay_end, args.ema_decay_horizon)
        return active_queue_window(args.target_mtd, decay, self.global_batch_size,
                                   self.accelerator.unwrap_model(self.model).config.queue_size)

    @property
    def fgsm(self) -> FGSMPerturbation:
        """FGSM's settings and its "previous" gradient sign (checkpointed per process)."""
        return self.objective.fgsm

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The step of `ContrastiveObjective` on `MoCoSEModel.forward`, with the data's hard negatives (every step) or
        UNA's (when due)."""
        unwrapped = self.accelerator.unwrap_model(model)
        hard = {name: inputs.pop(name) for name in NEGATIVE_INPUTS if name in inputs}
        if hard and self.args.hard_negatives is None:  # given by the data: encoded like keys
            inputs = {**inputs, **hard}
        elif model.training and self.state.global_step % self.args.una_frequency == 0 and hard:
            inputs = {**inputs, **hard, "negatives_as_anchors": self.args.una_usage == "paper"}
        if self.fgsm.mode != "off" and is_compiled_module(model):  # torch_compile, or accelerate's dynamo_backend
            # FGSM needs the gradient w.r.t. the word embeddings, which a compiled model gives only to its inputs.
            # (Not otherwise: under FSDP2 they are a sharded unit that must run inside the root module's forward.)
            inputs = {**inputs, "inputs_embeds": unwrapped.get_input_embeddings()(inputs["input_ids"])}
        inputs = {**inputs, **self.embedding_augmentation.forward_kwargs()}
        queue, training = getattr(unwrapped, "queue", None), model.training
        perturbation = None
        if training and self.fgsm.mode != "off":
            probe = unwrapped(**inputs) if self.fgsm.mode == "exact" else None  # unwrapped: no DDP hooks for it
            shape = torch.Size((*inputs["input_ids"].shape, unwrapped.config.hidden_size))
            perturbation = self.objective.perturbation(shape, probe, queue)
        outputs = model(**inputs, embedding_perturbation=perturbation, perturb_target=self.fgsm.perturb_target)
        result = self.objective(outputs, queue, training)
        return (result.loss, outputs) if return_outputs else result.loss

    # ----------------------------------------------------------------- logging
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:  # a training logging step: the method's step metrics (`ContrastiveObjective`)
            model = self.accelerator.unwrap_model(self.model)
            decay = None if self.ema_callback is None else self.ema_callback.last_decay
            logs.update(self.objective.logged_metrics(getattr(model, "queue", None), decay,
                                                      self.args.gradient_accumulation_steps))
        super().log(logs, start_time)

    # ----------------------------------------------------------------- checkpoints
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """`Trainer.save_model`; under FSDP `SHARDED_STATE_DICT` also what it leaves out (`complete_sharded_save`);
        a write that fails is one line (`failed_save_sentence`)."""
        folder = output_dir or self.args.output_dir  # a checkpoint's (the state), or the final model's (its tensors)
        size = self.state_bytes if checkpoint_step(folder) is not None else tensor_bytes(self.accelerator.unwrap_model(self.model))
        with failed_save_sentence(folder, self.args.output_dir, size):
            super().save_model(output_dir, _internal_call)
            complete_sharded_save(self, output_dir or self.args.output_dir)

    def _save_checkpoint(self, model, trial) -> None:
        folder = Path(self._get_output_dir(trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        with failed_save_sentence(folder, folder.parent, self.state_bytes):
            super()._save_checkpoint(model, trial)

    @property
    def state_bytes(self) -> int:
        """Bytes of a checkpoint before one shows it: the model's tensors and AdamW's two moments."""
        return tensor_bytes(self.accelerator.unwrap_model(self.model), optimizer_moments=2)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """`Trainer.train` after `launch.preflight` and `prepare_resume` ("last" = newest complete). A checkpoint
        at `max_steps` is loaded as its run ended (best model if loaded at the end), not trained: `finished_at_step`.
        A run stopped on request (`launch.stop_request`) raises `StopRequested` (exit status 75) once saved."""
        rows = len(self.train_dataset) if has_length(self.train_dataset) else None
        preflight(self.args, resume_from_checkpoint, rows)  # takes output_dir's lock, given back when train ends
        try:
            output = self._train_holding_folder(resume_from_checkpoint, *args, **kwargs)
        finally:
            release_run_folder(self.args.output_dir)
            self.stop_on_request.release()
        self.stop_on_request.end_run(self.args)
        return output

    def _train_holding_folder(self, resume_from_checkpoint, *args, **kwargs):
        resume = prepare_resume(resume_from_checkpoint, self.args, self.accelerator.unwrap_model(self.model))
        max_steps = self.args.max_steps if resume is None or self.args.max_steps > 0 else \
            planned_max_steps(self, self.get_train_dataloader())
        if resume is not None:
            check_planned_length(resume, max_steps, onward=NEW_RUN_HINT.format(resume))
        if self.args.save_strategy != "no" and self.args.should_save:
            check_room_for_a_save(self.args.output_dir, self.state_bytes)
        step = resumed_step(resume)
        self.finished_at_step = step if resume and 0 < max_steps <= step else None
        if self.finished_at_step is None:
            return super().train(resume, *args, **kwargs)
        self.state = TrainerState.load_from_json(os.path.join(resume, TRAINER_STATE_NAME))
        best = self.state.best_model_checkpoint if self.args.load_best_model_at_end else None
        self._load_from_checkpoint(best if best and os.path.isdir(best) else resume)
        logger.warning("This run finished at step %d (%s, max_steps %d): nothing trained, the model loaded as it "
                       "ended. To train further, start a new run from its model: %s.", step, resume, max_steps,
                       NEW_RUN_HINT.format(resume))
        return TrainOutput(step, float("nan"), {})

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """`Trainer._save`, plus `card_facts.json`, the run's facts a model card is written from later, offline."""
        super()._save(output_dir, state_dict)
        if self.args.should_save:
            save_card_facts(output_dir if output_dir is not None else self.args.output_dir, self)

    def _save_rng_state(self, output_dir):
        """Also saves FGSM's "previous" gradient, per process; then waits for every process: rank 0's
        trainer_state.json marks the checkpoint complete, so it must not precede another process's RNG state."""
        super()._save_rng_state(output_dir)
        self.fgsm.save(output_dir, self.args.process_index)
        self.accelerator.wait_for_everyone()

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        self.fgsm.load(resume_from_checkpoint, self.args.process_index, self.args.device, OLDER_FGSM_STATE_FILE)

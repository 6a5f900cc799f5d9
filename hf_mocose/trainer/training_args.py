"""`MoCoSETrainingArguments`: every method hyper-parameter as a documented `TrainingArguments` field."""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass

import torch
from transformers import TrainingArguments
from transformers.utils import is_torch_xla_available

from ..augmentation.views import AUGMENTATION_VIEWS, EmbeddingAugmentation
from ..models.configuration import MODEL_CONFIG_FIELDS
from ..models.queue import format_queue_slices, parse_queue_slices
from ..models.settings import ARGS_SETTINGS, describe, take_settings

UNA_USAGES = ("paper", "negative")


# The method settings as dataclass fields, from their one description (`hf_mocose.models.settings`); the
# `(model)` ones are `MoCoSEConfig` fields too. No repr/eq of its own: TrainingArguments' repr masks the token.
MethodSettingsArguments = make_dataclass("MethodSettingsArguments", [
    (s.name, s.type, field(default=s.default, metadata={"help": f"{'(model) ' if s.model else ''}{s.help}"}))
    for s in ARGS_SETTINGS
], repr=False, eq=False, namespace={"__module__": __name__})


@dataclass(repr=False)  # keep TrainingArguments.__repr__, which masks the Hub token
class MoCoSETrainingArguments(MethodSettingsArguments, TrainingArguments):
    r"""Configuration for [`MoCoSETrainer`].

    The defaults are the MoCoSE paper's BERT-base setting (lr 3e-5, batch 64, K 512, K_s 128, eta 0.75 ->
    0.95 over the run, FGSM 5e-9, tau 0.05) except the heads: identity-initialised (`head_init="identity"`)
    and trained at `head_learning_rate=1e-3`, where the paper starts them random and trains them at
    `learning_rate` (docs/quality.md has why). The paper's setting is the recipe
    `training_args/mocose-bert-base.yaml` (`head_init: random`, `head_learning_rate: null`); its ablation
    tables are the grids in `training_args/ablations/` (docs/methods.md).

    Only the parameters specific to MoCoSE are listed here; see [`~transformers.TrainingArguments`]
    for the rest. Fields marked *(model)* are copied into the `MoCoSEConfig` of a freshly built model
    (see `model_config_kwargs`); a MoCoSE checkpoint keeps its own.

    > Parameters that control the output folder

    overwrite_output_dir (`bool`, defaults to `False`): train afresh in an `output_dir` holding another run's
        `checkpoint-N` folders, deleting them first (transformers 5 has no such field; refused without it).

    > Parameters that control how a model id or folder is loaded

    model_init_kwargs (`dict` or `None`, defaults to `None`): keyword arguments for `from_pretrained` when
        `MoCoSETrainer` is given a model id or folder (`dtype`, `revision`, `attn_implementation`,
        `trust_remote_code`...), as TRL's `model_init_kwargs`; `dtype` defaults to float32.

    > Method settings (declared once in `hf_mocose.models.settings`; `MoCoSELoss` takes the same names)

{method_settings}

    > Parameters that control padding

    pad_to_max_length (`bool` or `None`, defaults to `None`): pad every batch to `max_seq_length`;
        None = only when `fgsm_mode="previous"` needs equal shapes.

    > Parameters for ablations and the method family (see docs/methods.md)

    queue_slice (`str` or `None`): queue entries used as negatives, by age (0 = newest): `"start:end"`,
        several comma-separated (`"0:256,768:1024"`); a YAML list `[start, end]` or `[[s1, e1], [s2, e2]]` works too.
    target_mtd (`float` or `None`): hold d_trace = 1/(1-eta) + K_active/B at this value by choosing the active
        queue window each step.
    token_shuffle (`bool`), token_cutoff (`float`), feature_cutoff (`float`): embedding-layer augmentations
        (position shuffle, zeroed tokens, zeroed embedding dimensions), in training only.
    augmentation_views (`str`, defaults to `"both"`): which views those augment: `both` (online and key view,
        independent draws, as the reference code) or `online`.
    hard_negatives (`str` or `None`): `"una"` adds each anchor's TF-IDF hard negative every `una_frequency` steps.
    una_usage (`str`, defaults to `"paper"`): how UNA sentences are trained on: `paper` (also anchors with their
        own positive, and in every anchor's denominator, as the UNA paper; needs in-batch negatives) or
        `negative` (weight-1 extra negatives only).
    una_alpha (`float`, defaults to `0.5`), una_window (`float`, defaults to `4000`), una_frequency (`int`,
        defaults to `5`): UNA's replacement rate, sampling window (>= 1: ranks; in (0, 1): vocabulary fraction)
        and step frequency.

    > Parameters that control evaluation

    stsb_dev_file (`str` or `None`): SentEval-layout `sts-dev.csv` scored during training as `eval_stsb_spearman`.
    eval_max_seq_length (`int` or `None`, defaults to `None`): tokens per sentence when `evaluate()` encodes STS
        pairs; None = the encoder's own limit (whole sentences, as SentEval); training keeps `max_seq_length`.
    skip_missing_stsb_dev (`bool`, defaults to `False`): a missing `stsb_dev_file` only disables evaluation."""

    __doc__ = __doc__.format(method_settings=describe(ARGS_SETTINGS, indent=4, mark_model=True))
    # Fields that take a dict, or a JSON string of one on the command line (TrainingArguments parses them).
    _VALID_DICT_FIELDS = [*TrainingArguments._VALID_DICT_FIELDS, "model_init_kwargs"]

    # --- Paper defaults for inherited fields (lr 3e-5, batch 64, weight decay 1e-6, 1 epoch, eval every 100) ---
    learning_rate: float = field(default=3e-5, metadata={"help": "Initial AdamW learning rate (paper: 3e-5)."})
    per_device_train_batch_size: int = field(default=64, metadata={"help": "Batch size per device (paper: 64)."})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "Sentences per forward when encoding STS pairs."})
    weight_decay: float = field(default=1e-6, metadata={"help": "AdamW weight decay (paper: 1e-6)."})
    num_train_epochs: float = field(default=1.0, metadata={"help": "Training epochs (paper: 1)."})
    logging_steps: float = field(default=10, metadata={"help": "Log every X optimizer steps."})
    eval_strategy: str = field(default="steps", metadata={"help": "When to score STS-B dev: `no`, `steps`, `epoch`."})
    eval_steps: float | None = field(default=100, metadata={"help": "Score STS-B dev every X steps (paper: 100)."})
    save_steps: float = field(default=100, metadata={"help": "Save a resumable checkpoint every X steps."})
    save_total_limit: int | None = field(default=2, metadata={"help": "Keep at most this many checkpoints."})
    metric_for_best_model: str | None = field(default="stsb_spearman", metadata={
        "help": "Metric for `load_best_model_at_end` (STS-B dev Spearman)."})
    ddp_find_unused_parameters: bool | None = field(default=False, metadata={
        "help": "Every trainable parameter is used each step; False avoids DDP's unused-parameter scan."})
    ddp_broadcast_buffers: bool | None = field(default=False, metadata={
        "help": "False: do not broadcast the queue and buffers at every forward (they stay equal anyway)."})
    overwrite_output_dir: bool = field(default=False, metadata={  # transformers 4's field; 5 has none
        "help": "Train afresh in an output_dir that holds another run's checkpoint-N folders, deleting them first; "
                "without it such a folder is refused unless resume_from_checkpoint continues that run."})

    # --- Model loading (MoCoSETrainer(model="id or folder")) ---
    model_init_kwargs: dict | str | None = field(default=None, metadata={
        "help": "Keyword arguments for from_pretrained when MoCoSETrainer is given a model id or folder "
                "(e.g. {\"dtype\": \"bfloat16\", \"revision\": \"main\", \"attn_implementation\": \"sdpa\"}); "
                "dtype defaults to float32. A JSON string works on the command line."})

    # --- Method settings: the `MethodSettingsArguments` fields; then what only the Trainer front end takes ---
    pad_to_max_length: bool | None = field(default=None, metadata={
        "help": "Pad batches to max_seq_length; default: only for fgsm_mode=previous."})

    # --- Ablations and the method family ---
    queue_slice: str | None = field(default=None, metadata={
        "help": "Negatives by queue age (0 = newest): 'start:end', comma-separated for a union."})
    target_mtd: float | None = field(default=None, metadata={
        "help": "Hold the maximum traceable distance at this value (MoCoSE only)."})
    token_shuffle: bool = field(default=False, metadata={
        "help": "Shuffle token positions of the views that augmentation_views names."})
    token_cutoff: float = field(default=0.0, metadata={"help": "Rate of whole token embeddings zeroed, in [0, 1)."})
    feature_cutoff: float = field(default=0.0, metadata={"help": "Rate of embedding dimensions zeroed, in [0, 1)."})
    augmentation_views: str = field(default="both", metadata={
        "help": f"Views token_shuffle/token_cutoff/feature_cutoff augment: {', '.join(AUGMENTATION_VIEWS)} "
                "(both = online and key view, each its own draw, as the reference code); never at evaluation."})
    hard_negatives: str | None = field(default=None, metadata={"help": "Hard negatives: 'una' (TF-IDF replacement)."})
    una_alpha: float = field(default=0.5, metadata={"help": "UNA replacement-rate alpha > 0."})
    una_window: float = field(default=4000, metadata={
        "help": "UNA sampling window r: ranks if >= 1, a vocabulary fraction if in (0, 1)."})
    una_frequency: int = field(default=5, metadata={"help": "Add UNA negatives every f-th optimizer step (f >= 1)."})
    una_usage: str = field(default="paper", metadata={
        "help": f"How UNA sentences are used: {', '.join(UNA_USAGES)}. paper: also anchors with their own "
                "positive and in every denominator (the UNA paper; needs in_batch_negatives); negative: weight-1 "
                "extra negatives only."})

    # --- Evaluation ---
    stsb_dev_file: str | None = field(default=None, metadata={
        "help": "Path of a SentEval-layout STS-B `sts-dev.csv` scored during training."})
    skip_missing_stsb_dev: bool = field(default=False, metadata={
        "help": "If stsb_dev_file does not exist, train without evaluation instead of failing."})
    eval_max_seq_length: int | None = field(default=None, metadata={
        "help": "Tokens per sentence when scoring STS pairs in evaluate(); default: the encoder's own limit "
                "(whole sentences, as SentEval). Training keeps max_seq_length."})

    def __post_init__(self):
        self._validate_sizes()
        settings = take_settings({s.name: getattr(self, s.name) for s in ARGS_SETTINGS}, ARGS_SETTINGS)
        # None resolved: queue_init_size min(128, queue_size), word_repetition_rate by the method
        self.queue_init_size, self.word_repetition_rate = settings["queue_init_size"], settings["word_repetition_rate"]
        self._validate_family_settings()
        if self.eval_max_seq_length is not None and self.eval_max_seq_length < 2:
            raise ValueError(f"eval_max_seq_length must be >= 2 (or None for the encoder's limit), "
                             f"got {self.eval_max_seq_length!r}.")
        if self.pad_to_max_length is None:
            self.pad_to_max_length = self.method == "mocose" and self.fgsm_mode == "previous"
        if (self.bf16 or self.bf16_full_eval) and not (torch.accelerator.is_available() or is_torch_xla_available()):
            self.use_cpu = True  # training runs on the CPU anyway; transformers allows CPU bf16 only with use_cpu
        super().__post_init__()

    def _validate_sizes(self) -> None:
        """Batch sizes, step counts and rates that cannot work, refused before anything is loaded."""
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        if self.dataloader_num_workers < 0:
            raise ValueError(f"dataloader_num_workers must be >= 0 (0 = load in the main process), "
                             f"got {self.dataloader_num_workers!r}.")
        if self.max_steps <= 0 and not self.num_train_epochs > 0:
            raise ValueError(f"num_train_epochs must be > 0 when max_steps is not set, got {self.num_train_epochs!r}.")
        for name, strategy in (("save_steps", self.save_strategy), ("eval_steps", self.eval_strategy)):
            value = getattr(self, name)
            if strategy == "steps" and value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 with {name[:4]}_strategy='steps', got {value!r}.")
        if not self.learning_rate >= 0:
            raise ValueError(f"learning_rate must be >= 0, got {self.learning_rate!r}.")

    def _validate_family_settings(self) -> None:
        from ..augmentation.una import validate_una_alpha, validate_una_frequency, validate_una_window
        self.queue_slice = format_queue_slices(parse_queue_slices(self.queue_slice, self.queue_size))
        EmbeddingAugmentation(self.token_shuffle, self.token_cutoff, self.feature_cutoff,
                              views=self.augmentation_views)  # validates the rates and views
        if self.target_mtd is not None:
            if self.method != "mocose":
                raise ValueError(f"target_mtd needs method='mocose' (an EMA target), got method={self.method!r}.")
            if self.queue_slice:
                raise ValueError("target_mtd chooses the queue window itself: do not combine it with queue_slice.")
        if self.hard_negatives not in (None, "una"):
            raise ValueError(f"Unknown hard_negatives {self.hard_negatives!r}; the only kind is 'una'.")
        validate_una_alpha(self.una_alpha)
        validate_una_window(self.una_window_value)
        validate_una_frequency(self.una_frequency)
        if self.una_usage not in UNA_USAGES:
            raise ValueError(f"Unknown una_usage {self.una_usage!r}; choose one of {', '.join(UNA_USAGES)}.")
        if self.hard_negatives and self.una_usage == "paper" and not self.in_batch_negatives:
            raise ValueError("una_usage='paper' trains on each UNA sentence as an anchor whose denominator is the "
                             "global batch: it needs in_batch_negatives=True (or use una_usage='negative').")
        if self.hard_negatives:
            self.remove_unused_columns = False  # the collator needs each sentence's text

    def __getstate__(self) -> dict:
        """What pickling (and `copy`) keeps: every field except secrets (`hub_token`, any other `*_token`), saved as
        None, since `training_args.bin` is saved in every checkpoint and may be uploaded. The live object keeps its
        token (`to_dict` and `repr` already mask it, as in `TrainingArguments`)."""
        return {name: None if name.endswith("_token") else value for name, value in self.__dict__.items()}

    @property
    def una_window_value(self) -> int | float:
        """`una_window` as UNA takes it: an int rank radius, or a float vocabulary fraction."""
        return int(self.una_window) if self.una_window >= 1 else float(self.una_window)

    @property
    def queue_age_slices(self) -> list[tuple[int, int]] | None:
        """`queue_slice` as `[(start, end), ...]` age ranges, or None for the whole queue."""
        return parse_queue_slices(self.queue_slice, self.queue_size)

    def model_config_kwargs(self) -> dict:
        """The `MoCoSEConfig` fields these arguments set, for building a fresh model."""
        return {name: getattr(self, name) for name in MODEL_CONFIG_FIELDS}


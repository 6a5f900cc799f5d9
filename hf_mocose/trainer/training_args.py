"""`MoCoSETrainingArguments`: every method hyper-parameter as a documented `TrainingArguments` field."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments

from ..methods.augmentation import AUGMENTATION_VIEWS, FGSM_EPSILON_UNITS, FGSM_MODES, FGSM_VIEWS, FGSMPerturbation
from ..models.configuration import (METHOD_DEFAULTS, METHODS, MODEL_CONFIG_FIELDS, SHARED_EMBEDDINGS,
                                    resolve_queue_init_size, validate_method_hparams)
from ..models.ema import validate_ema_decay
from ..models.heads import HEAD_INITS
from ..models.pooling import SENTENCE_POOLING_MODES
from ..models.queue import format_queue_slices, parse_queue_slices

UNA_USAGES = ("paper", "negative")


@dataclass(repr=False)  # keep TrainingArguments.__repr__, which masks the Hub token
class MoCoSETrainingArguments(TrainingArguments):
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

    > Parameters that control how a model id or folder is loaded

    model_init_kwargs (`dict` or `None`, defaults to `None`): keyword arguments for `from_pretrained` when
        `MoCoSETrainer` is given a model id or folder (`dtype`, `revision`, `attn_implementation`,
        `trust_remote_code`...), as TRL's `model_init_kwargs`; `dtype` defaults to float32.

    > Parameters that control the method

    method (`str`, defaults to `"mocose"`): *(model)* `"mocose"` or `"simcse"` (in-batch negatives, no target).
    contrastive_temperature (`float`, defaults to `0.05`): *(model)* InfoNCE temperature tau.
    in_batch_negatives (`bool`, defaults to `True`): *(model)* other keys of the global batch are negatives too.

    > Parameters that control the model

    sentence_pooling (`str`, defaults to `"cls"`): *(model)* embedding trained, evaluated and exported: `cls`,
        `cls_dense`, `mean` (the heads read the [CLS] state, or the token mean for `mean`).
    projection_layers (`int`, defaults to `1`): *(model)* Linear+LayerNorm+Dropout blocks after the pooler.
    predictor_layers (`int`, defaults to `2`): *(model)* predictor depth (last block Linear+Tanh); 0 = none.
    predictor_dim (`int` or `None`, defaults to `None`): *(model)* predictor width; None = the key width.
    projection_dim (`int` or `None`, defaults to `None`): *(model)* output width of the projection, and so of
        the keys, queries and queue (the reference code's `out_size`, the paper's Table 6a); None = hidden size.
    head_dropout (`float`, defaults to `0.1`): *(model)* dropout in projection/predictor blocks.
    head_init (`str`, defaults to `"identity"`): *(model)* `identity` (the query starts at the key) or `random`
        (the paper's) head Linears.
    head_learning_rate (`float` or `None`, defaults to `1e-3`): learning rate of the online heads (pooler,
        projection, predictor); None = `learning_rate` (the paper's).
    encoder_dropout (`float` or `None`, defaults to `0.1`): *(model)* encoder dropout (the dropout view).
    target_dropout (`bool`, defaults to `True`): *(model)* target branch runs with dropout in training.
    shared_embeddings (`str`, defaults to `"word"`): *(model)* what the target shares with the online encoder:
        `word` (word embeddings only) or `module` (the whole embedding module, copied each step: the paper's
        Figure 2 and the reference code; the paper recipes set it).
    max_seq_length (`int`, defaults to `32`): *(model)* tokens per sentence in training (longer ones are truncated);
        the sentence-transformers export uses the encoder's inference length instead (`export_max_seq_length`).

    > Parameters that control the queue and the target

    queue_size (`int`, defaults to `512`): *(model)* K, the queue capacity.
    queue_init_size (`int` or `None`, defaults to `None`): *(model)* K_s, random unit vectors the queue starts
        with; None = min(128, queue_size) (the paper's 128, never more than the queue holds).
    ema_decay_start (`float`, defaults to `0.75`): eta at the first optimizer step.
    ema_decay_end (`float`, defaults to `0.95`): eta at the end of the cosine ramp.
    ema_decay_horizon (`int` or `None`, defaults to `None`): optimizer steps the ramp takes; None = the run
        length (the paper's setting). The reference code's schedule is start 0.75, end 1.0, horizon 15000.

    > Parameters that control FGSM

    fgsm_mode (`str`, defaults to `"previous"`): `previous`, `exact` or `off`.
    fgsm_epsilon (`float`, defaults to `5e-9`): FGSM step size, in `fgsm_epsilon_unit`s.
    fgsm_epsilon_unit (`str`, defaults to `"absolute"`): `absolute` (the paper's) or `embedding_rms` (a fraction of
        the root-mean-square word-embedding entry of the batch).
    fgsm_views (`str`, defaults to `"both"`): perturb `both` branches or the `online` one only.
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
    ifcl_forgetting (`float`, defaults to `0.1`): IFCL's lambda; entry m of the hippocampus queue weighs
        1 - lambda * ceil(m / N).
    fraternal_fusion (`float`, defaults to `0.5`): *(model)* IFCL's fusion rate epsilon of the fraternal view.
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
    skip_missing_stsb_dev (`bool`, defaults to `False`): a missing `stsb_dev_file` only disables evaluation.
    """

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
    metric_for_best_model: str | None = field(
        default="stsb_spearman", metadata={"help": "Metric for `load_best_model_at_end` (STS-B dev Spearman)."}
    )
    ddp_find_unused_parameters: bool | None = field(
        default=False,
        metadata={"help": "Every trainable parameter is used each step; False avoids DDP's unused-parameter scan."},
    )
    ddp_broadcast_buffers: bool | None = field(
        default=False,
        metadata={"help": "False: do not broadcast the queue and buffers at every forward (they stay equal anyway)."},
    )

    # --- Model loading (MoCoSETrainer(model="id or folder")) ---
    model_init_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments for from_pretrained when MoCoSETrainer is given a model id or folder "
                  "(e.g. {\"dtype\": \"bfloat16\", \"revision\": \"main\", \"attn_implementation\": \"sdpa\"}); "
                  "dtype defaults to float32. A JSON string works on the command line."},
    )

    # --- Method ---
    method: str = field(default="mocose", metadata={"help": f"(model) Training method: {', '.join(METHODS)}."})
    contrastive_temperature: float = field(
        default=METHOD_DEFAULTS["contrastive_temperature"], metadata={"help": "(model) InfoNCE temperature tau > 0."}
    )
    in_batch_negatives: bool = field(
        default=METHOD_DEFAULTS["in_batch_negatives"],
        metadata={"help": "(model) Use the other keys of the global batch as negatives too."}
    )

    # --- Model ---
    sentence_pooling: str = field(
        default="cls",
        metadata={"help": f"(model) Sentence embedding trained, evaluated and exported: {', '.join(SENTENCE_POOLING_MODES)} "
                          "(the heads read the [CLS] state, or the token mean for mean)."},
    )
    projection_layers: int = field(
        default=METHOD_DEFAULTS["projection_layers"],
        metadata={"help": "(model) Projection blocks (Linear+LayerNorm+Dropout)."}
    )
    predictor_layers: int = field(
        default=METHOD_DEFAULTS["predictor_layers"],
        metadata={"help": "(model) Predictor depth; last block Linear+Tanh; 0 = none."}
    )
    predictor_dim: int | None = field(
        default=METHOD_DEFAULTS["predictor_dim"], metadata={"help": "(model) Predictor width; default the key width."}
    )
    projection_dim: int | None = field(
        default=None,
        metadata={"help": "(model) Output width of the projection = width of keys, queries and queue (the reference "
                  "code's out_size, the paper's Table 6a); default hidden size; needs projection_layers >= 1."},
    )
    head_dropout: float = field(
        default=METHOD_DEFAULTS["head_dropout"],
        metadata={"help": "(model) Dropout in projection and predictor blocks."}
    )
    head_init: str = field(
        default=METHOD_DEFAULTS["head_init"],
        metadata={"help": f"(model) Head Linear initialisation: {', '.join(HEAD_INITS)} (random = the paper's)."},
    )
    head_learning_rate: float | None = field(
        default=METHOD_DEFAULTS["head_learning_rate"],
        metadata={"help": "Learning rate of the online heads (pooler, projection, predictor); null = learning_rate "
                          "(the paper's)."},
    )
    encoder_dropout: float | None = field(
        default=0.1, metadata={"help": "(model) Encoder dropout rate (the dropout augmentation); None keeps the checkpoint's."}
    )
    target_dropout: bool = field(
        default=METHOD_DEFAULTS["target_dropout"],
        metadata={"help": "(model) Run the target branch with dropout in training."}
    )
    shared_embeddings: str = field(
        default="word",
        metadata={"help": f"(model) What the EMA target shares with the online encoder: {', '.join(SHARED_EMBEDDINGS)} "
                  "(word = word embeddings only; module = the whole embedding module, copied after every step, as "
                  "the paper's Figure 2 and the reference code). MoCoSE only."},
    )
    max_seq_length: int = field(
        default=32,
        metadata={"help": "(model) Tokens per sentence in training; longer ones are truncated. The sentence-transformers "
                  "export truncates at the encoder's inference length instead (see export_max_seq_length)."},
    )

    # --- Queue and EMA target ---
    queue_size: int = field(
        default=METHOD_DEFAULTS["queue_size"], metadata={"help": "(model) K: capacity of the negative-key queue."}
    )
    queue_init_size: int | None = field(default=METHOD_DEFAULTS["queue_init_size"], metadata={
        "help": "(model) K_s: random unit vectors the queue starts with; default min(128, queue_size)."})
    ema_decay_start: float = field(
        default=METHOD_DEFAULTS["ema_decay_start"],
        metadata={"help": "EMA decay eta at the first optimizer step, in [0, 1]."}
    )
    ema_decay_end: float = field(
        default=METHOD_DEFAULTS["ema_decay_end"],
        metadata={"help": "EMA decay eta at the end of the cosine ramp, in [0, 1]."}
    )
    ema_decay_horizon: int | None = field(
        default=METHOD_DEFAULTS["ema_decay_horizon"],
        metadata={"help": "Optimizer steps the cosine ramp takes, eta staying at ema_decay_end after; default: the "
                  "run length. The reference code's schedule: start 0.75, end 1.0, horizon 15000."},
    )

    # --- FGSM ---
    fgsm_mode: str = field(
        default=METHOD_DEFAULTS["fgsm_mode"], metadata={"help": f"FGSM on word embeddings: {', '.join(FGSM_MODES)}."}
    )
    fgsm_epsilon: float = field(
        default=METHOD_DEFAULTS["fgsm_epsilon"], metadata={"help": "FGSM step size epsilon >= 0, in fgsm_epsilon_unit."}
    )
    fgsm_epsilon_unit: str = field(
        default=METHOD_DEFAULTS["fgsm_epsilon_unit"],
        metadata={"help": f"Unit of fgsm_epsilon: {', '.join(FGSM_EPSILON_UNITS)} (a fraction of the batch's "
                  "root-mean-square word-embedding entry); absolute = the paper's."},
    )
    fgsm_views: str = field(
        default=METHOD_DEFAULTS["fgsm_views"],
        metadata={"help": f"Which branches see the perturbation: {', '.join(FGSM_VIEWS)}."}
    )
    pad_to_max_length: bool | None = field(
        default=None, metadata={"help": "Pad batches to max_seq_length; default: only for fgsm_mode=previous."}
    )

    # --- Ablations and the method family ---
    queue_slice: str | None = field(
        default=None,
        metadata={"help": "Negatives by queue age (0 = newest): 'start:end', comma-separated for a union."},
    )
    target_mtd: float | None = field(
        default=None, metadata={"help": "Hold the maximum traceable distance at this value (MoCoSE only)."}
    )
    token_shuffle: bool = field(
        default=False, metadata={"help": "Shuffle token positions of the views that augmentation_views names."}
    )
    token_cutoff: float = field(default=0.0, metadata={"help": "Rate of whole token embeddings zeroed, in [0, 1)."})
    feature_cutoff: float = field(default=0.0, metadata={"help": "Rate of embedding dimensions zeroed, in [0, 1)."})
    augmentation_views: str = field(
        default="both",
        metadata={"help": f"Views token_shuffle/token_cutoff/feature_cutoff augment: {', '.join(AUGMENTATION_VIEWS)} "
                  "(both = online and key view, each its own draw, as the reference code); never at evaluation."},
    )
    ifcl_forgetting: float = field(
        default=0.1, metadata={"help": "IFCL lambda: queue entry m weighs 1 - lambda * ceil(m / batch); in [0, 1)."}
    )
    fraternal_fusion: float = field(
        default=0.5, metadata={"help": "(model) IFCL fusion rate epsilon: epsilon*y + (1-epsilon)*y_fraternal, in [0, 1]."}
    )
    hard_negatives: str | None = field(default=None, metadata={"help": "Hard negatives: 'una' (TF-IDF replacement)."})
    una_alpha: float = field(default=0.5, metadata={"help": "UNA replacement-rate alpha > 0."})
    una_window: float = field(
        default=4000, metadata={"help": "UNA sampling window r: ranks if >= 1, a vocabulary fraction if in (0, 1)."}
    )
    una_frequency: int = field(default=5, metadata={"help": "Add UNA negatives every f-th optimizer step (f >= 1)."})
    una_usage: str = field(
        default="paper",
        metadata={"help": f"How UNA sentences are used: {', '.join(UNA_USAGES)}. paper: also anchors with their own "
                  "positive and in every denominator (the UNA paper; needs in_batch_negatives); negative: weight-1 "
                  "extra negatives only."},
    )

    # --- Evaluation ---
    stsb_dev_file: str | None = field(
        default=None, metadata={"help": "Path of a SentEval-layout STS-B `sts-dev.csv` scored during training."}
    )
    skip_missing_stsb_dev: bool = field(
        default=False, metadata={"help": "If stsb_dev_file does not exist, train without evaluation instead of failing."}
    )
    eval_max_seq_length: int | None = field(
        default=None,
        metadata={"help": "Tokens per sentence when scoring STS pairs in evaluate(); default: the encoder's own limit "
                  "(whole sentences, as SentEval). Training keeps max_seq_length."},
    )

    def __post_init__(self):
        self._validate_sizes()
        self.queue_init_size = resolve_queue_init_size(self.queue_init_size, self.queue_size)
        validate_method_hparams(self.model_config_kwargs())
        validate_ema_decay(self.ema_decay_start, self.ema_decay_end, self.ema_decay_horizon)
        FGSMPerturbation(self.fgsm_mode, self.fgsm_epsilon, self.fgsm_views, self.fgsm_epsilon_unit)  # validates
        if self.head_learning_rate is not None and not self.head_learning_rate > 0:
            raise ValueError(f"head_learning_rate must be > 0 (or None for learning_rate), got {self.head_learning_rate!r}.")
        if self.method == "simcse" and not self.in_batch_negatives:
            raise ValueError("method='simcse' has no queue: it needs in_batch_negatives=True.")
        self._validate_family_settings()
        if self.eval_max_seq_length is not None and self.eval_max_seq_length < 2:
            raise ValueError(
                f"eval_max_seq_length must be >= 2 (or None for the encoder's limit), got {self.eval_max_seq_length!r}."
            )
        if self.pad_to_max_length is None:
            self.pad_to_max_length = self.method == "mocose" and self.fgsm_mode == "previous"
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
            if str(getattr(strategy, "value", strategy)) == "steps" and value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 with {name[:4]}_strategy='steps', got {value!r}.")
        if not self.learning_rate >= 0:
            raise ValueError(f"learning_rate must be >= 0, got {self.learning_rate!r}.")

    def _validate_family_settings(self) -> None:
        from ..methods.augmentation import EmbeddingAugmentation
        from ..methods.una import validate_una_alpha, validate_una_frequency, validate_una_window

        self.queue_slice = format_queue_slices(parse_queue_slices(self.queue_slice, self.queue_size))
        EmbeddingAugmentation(self.token_shuffle, self.token_cutoff, self.feature_cutoff,
                              views=self.augmentation_views)  # validates the rates and views
        if self.target_mtd is not None:
            if self.method != "mocose":
                raise ValueError(f"target_mtd needs method='mocose' (an EMA target), got method={self.method!r}.")
            if self.queue_slice:
                raise ValueError("target_mtd chooses the queue window itself: do not combine it with queue_slice.")
        if not 0.0 <= self.ifcl_forgetting < 1.0:
            raise ValueError(f"ifcl_forgetting (lambda) must be in [0, 1), got {self.ifcl_forgetting!r}.")
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
        """What pickling keeps: every field except secrets (`hub_token`, any other `*_token`), saved as None.

        The Trainer pickles its arguments into `training_args.bin` in every checkpoint and saved
        model, and those folders are uploaded with `push_to_hub`; copies (`copy.copy`,
        `copy.deepcopy`) go through here too. The live object keeps its token, which travels only
        in the Authorization header of Hub requests. (`to_dict`, `to_json_string` and `repr`
        already mask it, as in `TrainingArguments`.)
        """
        state = dict(self.__dict__)
        for name in state:
            if name.endswith("_token"):
                state[name] = None
        return state

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


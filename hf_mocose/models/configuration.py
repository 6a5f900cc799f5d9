"""`MoCoSEConfig`: what a MoCoSE model *is* (its encoder, heads, queue and loss).

Training-time schedules (EMA decay, FGSM, optimiser) live in `MoCoSETrainingArguments`;
`MODEL_CONFIG_FIELDS` names the hyper-parameters both share, so a training run copies them
from its arguments into the model config in one place (`MoCoSETrainingArguments.model_config_kwargs`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import MappingProxyType
from typing import Any

from transformers import AutoConfig, PretrainedConfig

from .heads import HEAD_INITS
from .pooling import check_sentence_pooling

METHODS = ("mocose", "simcse", "ifcl")
# What the EMA target shares with the online encoder: its word embeddings only (hf-mocose's default), or
# its whole embedding module (word, position and token-type embeddings and their LayerNorm: the paper's
# Figure 2 and the reference code, whose target reads the online embedding layer's output).
SHARED_EMBEDDINGS = ("word", "module")

# One vocabulary: the method settings that both front ends take, `MoCoSETrainingArguments` (fields) and
# `MoCoSELoss` (keyword arguments), under one name with one default; `MoCoSEConfig` takes the model's own
# among them with the same defaults. Defined here once; tests/test_st_loss.py fails on any drift.
METHOD_DEFAULTS: MappingProxyType = MappingProxyType({
    "contrastive_temperature": 0.05,
    "in_batch_negatives": True,
    "projection_layers": 1,
    "predictor_layers": 2,
    "predictor_dim": None,
    "head_dropout": 0.1,
    "head_init": "identity",
    "head_learning_rate": 1e-3,
    "target_dropout": True,
    "queue_size": 512,
    "queue_init_size": None,  # None: min(DEFAULT_QUEUE_INIT_SIZE, queue_size) (`resolve_queue_init_size`)
    "ema_decay_start": 0.75,
    "ema_decay_end": 0.95,
    "ema_decay_horizon": None,
    "fgsm_mode": "previous",
    "fgsm_epsilon": 5e-9,
    "fgsm_epsilon_unit": "absolute",
    "fgsm_views": "both",
})

# K_s when none is given: the paper's 128 (of K = 512), capped at the queue the user chose, so that
# `queue_size=64` alone is a valid setting (the queue then starts full of random keys). Every paper
# recipe and ablation grid sets `queue_init_size` itself.
DEFAULT_QUEUE_INIT_SIZE = 128


def resolve_queue_init_size(queue_init_size: int | None, queue_size: int) -> int:
    """K_s: `queue_init_size`, or when it is None `min(128, queue_size)` (never more than the queue holds)."""
    return min(DEFAULT_QUEUE_INIT_SIZE, max(queue_size, 0)) if queue_init_size is None else queue_init_size


# Hyper-parameters that shape the model or its loss; training arguments carry the same names.
MODEL_CONFIG_FIELDS = (
    "method",
    "sentence_pooling",
    "projection_layers",
    "predictor_layers",
    "predictor_dim",
    "projection_dim",
    "head_dropout",
    "head_init",
    "contrastive_temperature",
    "queue_size",
    "queue_init_size",
    "in_batch_negatives",
    "target_dropout",
    "max_seq_length",
    "encoder_dropout",
    "fraternal_fusion",
    "shared_embeddings",
)


def validate_method_hparams(values: dict[str, Any]) -> None:
    """Raises a `ValueError` naming the offending value for any impossible method setting.

    Shared by `MoCoSEConfig` and `MoCoSETrainingArguments` so both reject the same things with
    the same words, before any model is built or any step is taken.
    """
    method = values.get("method", "mocose")
    if method not in METHODS:
        raise ValueError(f"Unknown method {method!r}; choose one of {', '.join(METHODS)}.")
    check_sentence_pooling(values.get("sentence_pooling", "cls"))
    temperature = values.get("contrastive_temperature", METHOD_DEFAULTS["contrastive_temperature"])
    if not temperature > 0:
        raise ValueError(f"contrastive_temperature (tau) must be > 0, got {temperature!r}.")
    queue_size = values.get("queue_size", METHOD_DEFAULTS["queue_size"])
    init_size = resolve_queue_init_size(values.get("queue_init_size"), queue_size)
    if method in ("mocose", "ifcl"):
        if queue_size < 1:
            raise ValueError(f"queue_size (K) must be >= 1, got {queue_size!r}.")
        if not 0 <= init_size <= queue_size:
            raise ValueError(
                f"queue_init_size (K_s) must be between 0 and queue_size={queue_size}, got {init_size!r}."
            )
    for name in ("projection_layers", "predictor_layers"):
        if values.get(name, 0) < 0:
            raise ValueError(f"{name} must be >= 0, got {values[name]!r}.")
    predictor_dim = values.get("predictor_dim")
    if predictor_dim is not None and predictor_dim < 1:
        raise ValueError(f"predictor_dim must be >= 1 (or None for the hidden size), got {predictor_dim!r}.")
    projection_dim = values.get("projection_dim")
    if projection_dim is not None:
        if isinstance(projection_dim, bool) or not isinstance(projection_dim, int) or projection_dim < 1:
            raise ValueError(f"projection_dim must be a whole number >= 1 (or None for the hidden size), "
                             f"got {projection_dim!r}.")
        if values.get("projection_layers", 1) == 0:
            raise ValueError(f"projection_dim={projection_dim} needs projection_layers >= 1: the last projection "
                             "Linear sets the key width (with no projection the keys keep the encoder's width).")
    shared = values.get("shared_embeddings", "word")
    if shared not in SHARED_EMBEDDINGS:
        raise ValueError(f"Unknown shared_embeddings {shared!r}; choose one of {', '.join(SHARED_EMBEDDINGS)}.")
    if shared != "word" and method != "mocose":
        raise ValueError(f"shared_embeddings={shared!r} concerns the EMA target branch, which only method='mocose' "
                         f"has (got method={method!r}).")
    head_init = values.get("head_init", METHOD_DEFAULTS["head_init"])
    if head_init not in HEAD_INITS:
        raise ValueError(f"Unknown head_init {head_init!r}; choose one of {', '.join(HEAD_INITS)}.")
    if not 0 <= values.get("head_dropout", METHOD_DEFAULTS["head_dropout"]) < 1:
        raise ValueError(f"head_dropout must be in [0, 1), got {values['head_dropout']!r}.")
    encoder_dropout = values.get("encoder_dropout")
    if encoder_dropout is not None and not 0 <= encoder_dropout < 1:
        raise ValueError(f"encoder_dropout must be in [0, 1), got {encoder_dropout!r}.")
    fusion = values.get("fraternal_fusion", 0.5)
    if not 0.0 <= fusion <= 1.0:
        raise ValueError(f"fraternal_fusion (epsilon) must be in [0, 1], got {fusion!r}.")
    max_len = values.get("max_seq_length", 32)
    if max_len is not None and max_len < 2:
        raise ValueError(f"max_seq_length must be >= 2, got {max_len!r}.")


def base_model_id(name_or_path: str | os.PathLike) -> str:
    """What can be known of a starting encoder's Hub id: `name_or_path` itself when it is not a local
    folder, the id in a Hugging Face cache path (`.../models--namespace--name/snapshots/<sha>`), else
    the local folder (which no model card names as `base_model`)."""
    value = str(name_or_path)
    path = Path(value).expanduser()
    if not path.exists():
        return value
    match = re.search(r"models--([^/]+?)--([^/]+)/snapshots/[^/]+/?$", path.resolve().as_posix())
    return f"{match.group(1)}/{match.group(2)}" if match else str(path.resolve())


class MoCoSEConfig(PretrainedConfig):
    r"""Configuration of a [`MoCoSEModel`].

    Args:
        encoder_config (`dict` or `PretrainedConfig`):
            Configuration of the wrapped encoder (any `AutoModel` encoder: BERT, RoBERTa, DistilBERT, MiniLM...).
        method (`str`, defaults to `"mocose"`):
            `"mocose"`: online branch vs EMA target branch with a negative queue. `"simcse"`: two dropout
            views of the online encoder, in-batch negatives, no target, no queue, no predictor. `"ifcl"`:
            SimCSE's two views plus a "hippocampus" queue of past online anchors weighted by forgetting
            coefficients (no target, no predictor).
        sentence_pooling (`str`, defaults to `"cls"`):
            Sentence embedding used for evaluation and export: `"cls"` (last-layer [CLS] state before the
            pooler Linear, what the paper evaluates), `"cls_dense"` (after it) or `"mean"`. Training reads the
            same state: the heads start from the [CLS] state for `"cls"`/`"cls_dense"` and from the masked
            mean of the token states for `"mean"` (for encoders deployed with mean pooling).
        projection_layers (`int`, defaults to 1):
            Number of Linear(d, d) + LayerNorm + Dropout blocks after the pooler; 0 = none.
        predictor_layers (`int`, defaults to 2):
            (n-1) Linear + LayerNorm + Dropout blocks, then Linear + Tanh, on the online branch only; 0 = none.
        predictor_dim (`int`, *optional*):
            Width of the predictor's hidden blocks; defaults to the key width (`projection_dim`).
        projection_dim (`int`, *optional*):
            Output width of the last projection Linear, and so of the keys, the queries (the predictor maps
            back to it) and the queue: the reference code's `out_size` (the paper's Table 6a). Defaults to the
            encoder's hidden size; needs `projection_layers >= 1`. The sentence embedding (`sentence_pooling`)
            is read before the heads and keeps the hidden size.
        head_dropout (`float`, defaults to 0.1):
            Dropout in the projection and predictor blocks.
        head_init (`str`, defaults to `"identity"`):
            Initialisation of the head Linears the checkpoint does not provide (projection, predictor, and the
            pooler when the encoder has no pooler dense layer). `"random"`: normal(0, initializer_range), as the
            paper and its reference code. `"identity"`: identity matrices and zero biases, so that at step 0 the
            query is tanh(LayerNorm(key)) up to dropout instead of a random function of it (see docs/quality.md).
        contrastive_temperature (`float`, defaults to 0.05):
            InfoNCE temperature tau (named so that `generation_config` checks leave it alone).
        queue_size (`int`, defaults to 512):
            Capacity K of the negative-key queue.
        queue_init_size (`int`, *optional*):
            Number K_s of random unit vectors the queue starts with; None (the default) = min(128, `queue_size`).
        in_batch_negatives (`bool`, defaults to `True`):
            Whether the other keys of the (global) batch are negatives too.
        target_dropout (`bool`, defaults to `True`):
            Whether the target branch runs with dropout while training (the reference code does).
        max_seq_length (`int`, defaults to 32):
            Token length used in training. The export truncates at the inference length instead (see
            `base_max_seq_length` and `hf_mocose.models.sequence_length`).
        encoder_dropout (`float`, *optional*, defaults to 0.1):
            Dropout probability set on the encoder (hidden and attention); `None` keeps the checkpoint's.
        fraternal_vocab_size (`int`, *optional*):
            IFCL: vocabulary size of the fraternal (second-language) embedding table; None = no fraternal view.
        fraternal_fusion (`float`, defaults to 0.5):
            IFCL: fusion rate epsilon of the fraternal view's input, epsilon * y + (1 - epsilon) * y_fraternal.
        shared_embeddings (`str`, defaults to `"word"`):
            What the EMA target branch shares with the online encoder (method "mocose"): `"word"`, the word
            embeddings only (the target's position/token-type embeddings and embedding LayerNorm follow the
            EMA like the rest of it), or `"module"`, the whole embedding module (the paper's Figure 2 and the
            reference code: those tensors are copied from the online encoder after every optimizer step
            instead of averaged, so the target always reads the online embedding layer).
        base_max_seq_length (`int`, *optional*):
            The base encoder's own sentence-transformers `max_seq_length` (256 for all-MiniLM-L6-v2), recorded
            by `MoCoSEModel.from_encoder` so the export can use it without the base model folder; None when the
            base model has none (the export then uses the encoder's position limit).
        base_model_name_or_path (`str`, *optional*):
            The encoder training started from: its Hub id when known (the model card's `base_model`), else
            its local folder. Set by `from_encoder` (see `base_model_id`) and kept by every checkpoint.
    """

    model_type = "mocose"
    sub_configs = {"encoder_config": AutoConfig}

    def __init__(
        self,
        encoder_config: dict | PretrainedConfig | None = None,
        method: str = "mocose",
        sentence_pooling: str = "cls",
        projection_layers: int = METHOD_DEFAULTS["projection_layers"],
        predictor_layers: int = METHOD_DEFAULTS["predictor_layers"],
        predictor_dim: int | None = METHOD_DEFAULTS["predictor_dim"],
        projection_dim: int | None = None,
        head_dropout: float = METHOD_DEFAULTS["head_dropout"],
        head_init: str = METHOD_DEFAULTS["head_init"],
        contrastive_temperature: float = METHOD_DEFAULTS["contrastive_temperature"],
        queue_size: int = METHOD_DEFAULTS["queue_size"],
        queue_init_size: int | None = METHOD_DEFAULTS["queue_init_size"],
        in_batch_negatives: bool = METHOD_DEFAULTS["in_batch_negatives"],
        target_dropout: bool = METHOD_DEFAULTS["target_dropout"],
        max_seq_length: int = 32,
        encoder_dropout: float | None = 0.1,
        fraternal_vocab_size: int | None = None,
        fraternal_fusion: float = 0.5,
        shared_embeddings: str = "word",
        base_max_seq_length: int | None = None,
        base_model_name_or_path: str | None = None,
        **kwargs,
    ):
        if isinstance(encoder_config, dict):
            encoder_config = dict(encoder_config)
            encoder_config = AutoConfig.for_model(encoder_config.pop("model_type", "bert"), **encoder_config)
        self.encoder_config = encoder_config
        self.method = method
        self.sentence_pooling = sentence_pooling
        self.projection_layers = projection_layers
        self.predictor_layers = predictor_layers
        self.predictor_dim = predictor_dim
        self.projection_dim = projection_dim
        self.head_dropout = head_dropout
        self.head_init = head_init
        self.contrastive_temperature = contrastive_temperature
        self.queue_size = queue_size
        self.queue_init_size = resolve_queue_init_size(queue_init_size, queue_size)
        self.in_batch_negatives = in_batch_negatives
        self.target_dropout = target_dropout
        self.max_seq_length = max_seq_length
        self.encoder_dropout = encoder_dropout
        self.fraternal_vocab_size = fraternal_vocab_size
        self.fraternal_fusion = fraternal_fusion
        self.shared_embeddings = shared_embeddings
        self.base_max_seq_length = base_max_seq_length
        self.base_model_name_or_path = base_model_name_or_path
        validate_method_hparams({name: getattr(self, name) for name in MODEL_CONFIG_FIELDS})
        super().__init__(**kwargs)

    @property
    def hidden_size(self) -> int:
        """Width of the encoder's token states (and of the pooler, projection, keys and queries)."""
        config = self.encoder_config
        return getattr(config, "hidden_size", None) or getattr(config, "dim")

    @property
    def key_dim(self) -> int:
        """Width of the keys, the queries and the queue: `projection_dim`, or the hidden size."""
        return self.projection_dim or self.hidden_size

    @property
    def uses_target(self) -> bool:
        """Whether this method has an EMA target branch (and a predictor on the online one)."""
        return self.method == "mocose"

    @property
    def uses_queue(self) -> bool:
        """Whether this method keeps a queue of past keys (MoCoSE) or anchors (IFCL) as negatives."""
        return self.method in ("mocose", "ifcl")


AutoConfig.register(MoCoSEConfig.model_type, MoCoSEConfig, exist_ok=True)  # AutoConfig.from_pretrained(checkpoint)

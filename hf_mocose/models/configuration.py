"""`MoCoSEConfig`: what a MoCoSE model *is* (its encoder, heads, queue and loss).

Training-time schedules (EMA decay, FGSM, optimiser) live in `MoCoSETrainingArguments`;
`MODEL_CONFIG_FIELDS` names the hyper-parameters both share, so a training run copies them
from its arguments into the model config in one place (`MoCoSETrainingArguments.model_config_kwargs`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig

from .settings import MODEL_SETTINGS, describe, take_settings, with_keywords

MODEL_CONFIG_FIELDS = tuple(setting.name for setting in MODEL_SETTINGS)


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
{settings}
        fraternal_vocab_size (`int`, *optional*):
            IFCL: vocabulary size of the fraternal (second-language) embedding table; None = no fraternal view.
        base_max_seq_length (`int`, *optional*):
            The base encoder's own sentence-transformers `max_seq_length` (256 for all-MiniLM-L6-v2), recorded
            by `MoCoSEModel.from_encoder` so the export can use it without the base model folder; None when the
            base model has none (the export then uses the encoder's position limit).
        base_model_name_or_path (`str`, *optional*):
            The encoder training started from: its Hub id when known (the model card's `base_model`), else
            its local folder. Set by `from_encoder` (see `base_model_id`) and kept by every checkpoint.

    Every argument but `encoder_config`, `fraternal_vocab_size` and the `base_*` two is a method setting,
    keyword-only, declared once in `hf_mocose.models.settings.METHOD_SETTINGS` (name, default, help)."""

    model_type = "mocose"
    sub_configs = {"encoder_config": AutoConfig}

    @with_keywords(MODEL_SETTINGS)
    def __init__(self, encoder_config: dict | PretrainedConfig | None = None, *, fraternal_vocab_size: int | None = None,
                 base_max_seq_length: int | None = None, base_model_name_or_path: str | None = None, **kwargs):
        if isinstance(encoder_config, dict):
            encoder_config = AutoConfig.for_model(**{"model_type": "bert", **encoder_config})
        self.encoder_config = encoder_config
        for name, value in take_settings(kwargs, MODEL_SETTINGS).items():  # the method settings, validated
            setattr(self, name, value)
        self.fraternal_vocab_size = fraternal_vocab_size
        self.base_max_seq_length = base_max_seq_length
        self.base_model_name_or_path = base_model_name_or_path
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
        """Whether this method has an EMA target encoder (MoCoSE; ESimCSE's momentum encoder)."""
        return self.method in ("mocose", "esimcse")

    @property
    def keys_from_target(self) -> bool:
        """Whether the keys (positives, in-batch negatives) come from the EMA target, with target heads and a
        predictor on the online branch (MoCoSE); otherwise they are a second online view, with gradient."""
        return self.method == "mocose"

    @property
    def queues_target_embeddings(self) -> bool:
        """Whether the queue holds the EMA target's embeddings of the anchors (ESimCSE's momentum encoder)."""
        return self.uses_target and not self.keys_from_target

    @property
    def uses_queue(self) -> bool:
        """Whether this method keeps a queue of past keys (MoCoSE), anchors (IFCL) or momentum embeddings (ESimCSE)."""
        return self.method in ("mocose", "ifcl", "esimcse")


MoCoSEConfig.__doc__ = MoCoSEConfig.__doc__.format(settings=describe(MODEL_SETTINGS, indent=8))
AutoConfig.register(MoCoSEConfig.model_type, MoCoSEConfig, exist_ok=True)  # AutoConfig.from_pretrained(checkpoint)

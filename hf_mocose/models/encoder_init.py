"""The pretrained encoder a `MoCoSEModel` is built around: checks, loading, and copying it into both branches.

`MoCoSEModel.from_encoder` / `from_pretrained` use these; the model itself (branches, heads, queue,
forward) is `hf_mocose.models.modeling`.
"""

from __future__ import annotations

import copy

from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

from .configuration import base_model_id
from .encoding import sentence_transformers_max_seq_length

# `from_pretrained` keywords that say where config.json is (the rest are for loading weights).
CONFIG_LOCATION_KWARGS = ("subfolder", "revision", "cache_dir", "token", "local_files_only", "trust_remote_code",
                          "force_download", "proxies")
# Attribute names that hold dropout probabilities in the common encoder configs.
_DROPOUT_ATTRIBUTES = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout")


def check_is_encoder(config: PretrainedConfig, name: str = "") -> None:
    """Raises a `ValueError` unless `config` describes a bidirectional (masked-LM style) encoder."""
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES or any(
            getattr(config, flag, False) for flag in ("is_encoder_decoder", "is_decoder")):
        raise ValueError(f"{name or 'The model'} (model_type={model_type!r}) is not a bidirectional encoder. MoCoSE "
                         "needs an encoder such as BERT, RoBERTa, DistilBERT or MiniLM (a model type with a masked-LM "
                         "head, not a decoder or an encoder-decoder).")


def set_encoder_dropout(config: PretrainedConfig, rate: float | None) -> None:
    """Sets every dropout probability the encoder config has to `rate` (None leaves them alone)."""
    if rate is None:
        return
    for attribute in _DROPOUT_ATTRIBUTES:
        if isinstance(getattr(config, attribute, None), float):
            setattr(config, attribute, rate)


def build_encoder(config: PretrainedConfig) -> PreTrainedModel:
    """A randomly initialised encoder of `config`, without the checkpoint's own pooler."""
    encoder = AutoModel.from_config(config)
    # The MoCoSE pooler replaces the checkpoint's own (Linear + tanh) pooler; an unused pooler would
    # also break DDP with find_unused_parameters=False.
    if getattr(encoder, "pooler", None) is not None:
        del encoder.pooler  # then None as a plain attribute, not a module slot: accelerate's regional compilation
        encoder.pooler = None  # rebuilds the module tree from its children and would lose the slot
    return encoder


def load_pretrained_encoder(encoder: str | PreTrainedModel) -> tuple[PreTrainedModel, PretrainedConfig, str]:
    """`(encoder model, a copy of its config, its name or path)` for a folder / Hub id or a loaded model (its
    `base_model` when it has a task head); refuses anything that is not a bidirectional encoder."""
    if isinstance(encoder, PreTrainedModel):
        pretrained = encoder.base_model
        name = getattr(pretrained.config, "_name_or_path", "") or ""
        config = copy.deepcopy(pretrained.config)  # the caller's model keeps its own config
        check_is_encoder(config, name or type(encoder).__name__)
        return pretrained, config, name
    name = str(encoder)
    config = AutoConfig.from_pretrained(encoder)
    check_is_encoder(config, name)
    return AutoModel.from_pretrained(encoder), config, name


def start_from_pretrained(model, pretrained: PreTrainedModel, name: str, match_dtype: bool = False) -> None:
    """Makes the fresh MoCoSE `model` start as `pretrained`: both encoders its weights, the pooler Linear its
    pooler dense weights when it has them, and with `match_dtype` (a model the caller loaded) its dtype (the
    queue stays fp32); records where it came from."""
    pooler_dense = getattr(getattr(pretrained, "pooler", None), "dense", None)
    if isinstance(pooler_dense, nn.Linear):
        model.online_pooler.load_state_dict(pooler_dense.state_dict())
    state = {k: v for k, v in pretrained.state_dict().items() if not k.startswith("pooler.")}
    model.online_encoder.load_state_dict(state, strict=True)
    model.copy_online_to_target()  # nothing without a target
    dtype = next(pretrained.parameters()).dtype  # as loaded (e.g. `dtype=torch.bfloat16`), heads included
    if match_dtype and any(p.dtype != dtype for p in model.parameters()):
        model.to(dtype).keep_queue_in_fp32()
    model.config.encoder_config._name_or_path = name
    # The export's inference length; recorded now because the base folder may be gone at export time.
    model.config.base_max_seq_length = sentence_transformers_max_seq_length(name)
    if model.config.base_model_name_or_path is None and name:  # named in every export's card (model_card.py)
        model.config.base_model_name_or_path = base_model_id(name)

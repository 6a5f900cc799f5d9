"""Sentence pooling: how a sentence embedding is read off an encoder's hidden states.

One function serves the MoCoSE model (training and export) and the evaluation code for
plain encoders, so "cls", "cls_dense" and "mean" mean exactly the same thing everywhere.
The token pooling itself is sentence-transformers' `Pooling`, the module the export writes.
"""

from __future__ import annotations

import torch
from torch import nn

SENTENCE_POOLING_MODES = ("cls", "cls_dense", "mean")


def check_sentence_pooling(mode: str) -> str:
    """Returns `mode` if it is a known pooling mode, else raises a `ValueError` naming it."""
    if mode not in SENTENCE_POOLING_MODES:
        raise ValueError(f"Unknown sentence_pooling {mode!r}; choose one of {', '.join(SENTENCE_POOLING_MODES)}.")
    return mode


_TOKEN_POOLINGS: dict[str, nn.Module] = {}  # a dict, not functools.cache, whose calls torch.compile warns about


def _token_pooling(mode: str) -> nn.Module:
    """Sentence-transformers' `Pooling` of mode "cls" or "mean" (no weights), one per mode."""
    if mode not in _TOKEN_POOLINGS:
        # Imported here: the config imports this module, and `import hf_mocose` must stay light.
        from sentence_transformers.sentence_transformer.modules import Pooling

        _TOKEN_POOLINGS[mode] = Pooling(0, pooling_mode=mode)  # the dimension only feeds its repr and config
    return _TOKEN_POOLINGS[mode]


def pool_sentence_embedding(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor, mode: str,
                            dense: nn.Linear | None = None) -> torch.Tensor:
    """`(batch, hidden)` sentence embeddings from `last_hidden_state` `(batch, seq_len, hidden)` and
    `attention_mask` `(batch, seq_len)` (1 = real token). `mode`: `"cls"` (the first token's state), `"cls_dense"`
    (that state through `dense`, a Linear with no activation: the MoCoSE pooler) or `"mean"` (masked mean).

    In float32 (training and evaluation, autocast included) bit-identical to the masked mean / first token computed
    by hand; half-precision states are averaged in float32 (sentence-transformers' rule), then cast back."""
    check_sentence_pooling(mode)
    if mode == "cls_dense" and dense is None:
        raise ValueError("sentence_pooling='cls_dense' needs the pooler's dense layer, and none was given.")
    features = {"token_embeddings": last_hidden_state, "attention_mask": attention_mask}
    pooled = _token_pooling("mean" if mode == "mean" else "cls")(features)["sentence_embedding"]
    return dense(pooled) if mode == "cls_dense" else pooled

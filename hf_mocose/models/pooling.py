"""Sentence pooling: how a sentence embedding is read off an encoder's hidden states.

One function serves the MoCoSE model (training and export) and the evaluation code for
plain encoders, so "cls", "cls_dense" and "mean" mean exactly the same thing everywhere.
"""

from __future__ import annotations

import torch
from torch import nn

SENTENCE_POOLING_MODES = ("cls", "cls_dense", "mean")


def check_sentence_pooling(mode: str) -> str:
    """Returns `mode` if it is a known pooling mode, else raises a `ValueError` naming it."""
    if mode not in SENTENCE_POOLING_MODES:
        raise ValueError(
            f"Unknown sentence_pooling {mode!r}; choose one of {', '.join(SENTENCE_POOLING_MODES)}."
        )
    return mode


def pool_sentence_embedding(
    last_hidden_state: torch.Tensor,
    attention_mask: torch.Tensor,
    mode: str,
    dense: nn.Linear | None = None,
) -> torch.Tensor:
    """Pools token states into one vector per sentence.

    Args:
        last_hidden_state: `(batch, seq_len, hidden)` last-layer token states.
        attention_mask: `(batch, seq_len)`, 1 for real tokens, 0 for padding.
        mode: `"cls"` (the first token's state), `"cls_dense"` (that state through `dense`,
            a Linear with no activation: the MoCoSE pooler) or `"mean"` (masked mean of all tokens).
        dense: the Linear used by `"cls_dense"`.

    Returns:
        `(batch, hidden)` sentence embeddings.
    """
    check_sentence_pooling(mode)
    if mode == "mean":
        mask = attention_mask.unsqueeze(-1).to(last_hidden_state.dtype)
        return (last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    cls = last_hidden_state[:, 0]
    if mode == "cls_dense":
        if dense is None:
            raise ValueError("sentence_pooling='cls_dense' needs the pooler's dense layer, and none was given.")
        return dense(cls)
    return cls

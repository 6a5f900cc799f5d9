"""Sentence encoding in batches: the MoCoSE sentence embedding of a list of sentences.

Used by the trainer's STS evaluation, the export's verification and the SentEval evaluation
(`hf_mocose.evaluation`, which imports it from here: the core never imports `evaluation/`).
Every encoder is driven the same way: length-sorted batches, fp32, ``model.eval()`` and
``torch.no_grad()``, so that numbers do not depend on dropout or on the order sentences arrive in.
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch import nn

from .pooling import pool_sentence_embedding

# (input_ids, attention_mask, token_type_ids or None) -> (batch, hidden)
EmbedFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def length_sorted_order(sentences: list[str]) -> list[int]:
    """Indices of `sentences`, longest first: batches of similar length waste little padding,
    and the longest (most memory-hungry) batch comes first so an out-of-memory error shows at once."""
    return sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))


def resolve_max_length(tokenizer, config=None, max_length: int | None = None) -> int:
    """Truncation length: `max_length` if given, else the tokenizer's limit, capped by the model's
    position embeddings (tokenizers often report a huge sentinel value)."""
    if max_length:
        return int(max_length)
    limit = getattr(tokenizer, "model_max_length", None) or 512
    limit = 512 if limit > 100_000 else int(limit)
    positions = getattr(config, "max_position_embeddings", None)
    if positions:
        # RoBERTa-style models reserve padding_idx + 1 positions.
        offset = 2 if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert") else 0
        limit = min(limit, int(positions) - offset)
    return limit


@torch.no_grad()
def encode_batches(
    embed: EmbedFn,
    tokenizer,
    sentences: list[str],
    device: torch.device,
    batch_size: int = 64,
    max_length: int = 512,
    show_progress: bool = False,
    desc: str = "encoding",
) -> torch.Tensor:
    """Encodes `sentences` with `embed` in length-sorted batches.

    Returns:
        `(len(sentences), hidden)` float32 CPU tensor, rows in the order of `sentences`.
    """
    from tqdm.auto import tqdm

    if not sentences:
        raise ValueError("nothing to encode: the sentence list is empty")
    order = length_sorted_order(sentences)
    out: list[torch.Tensor] = [None] * len(sentences)  # type: ignore[list-item]
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc=desc, disable=not show_progress, unit="batch"):
        idx = order[start : start + batch_size]
        batch = tokenizer(
            [sentences[i] for i in idx], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        )
        token_type_ids = batch.get("token_type_ids")
        emb = embed(
            batch["input_ids"].to(device),
            batch["attention_mask"].to(device),
            None if token_type_ids is None else token_type_ids.to(device),
        )
        emb = emb.float().cpu()
        for row, i in enumerate(idx):
            out[i] = emb[row]
    return torch.stack(out)


def accepts_token_types(encoder: nn.Module) -> bool:
    """DistilBERT-style encoders take no token_type_ids even when the tokenizer returns them."""
    return "token_type_ids" in inspect.signature(encoder.forward).parameters


def mocose_embed(model) -> EmbedFn:
    """Embedding function of a `MoCoSEModel`: `model.embed` (online encoder + its `sentence_pooling`)."""
    keep_tt = accepts_token_types(getattr(model, "online_encoder", model))
    return lambda ids, mask, tt: model.embed(ids, mask, token_type_ids=tt if keep_tt else None)


def _device_of(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def encode_with_model(
    model,
    tokenizer,
    sentences: list[str],
    batch_size: int = 64,
    max_length: int | None = None,
    show_progress: bool = False,
) -> torch.Tensor:
    """Sentence embeddings from a MoCoSE model (``model.embed``: online encoder + its sentence_pooling).

    Sentences are truncated at `max_length`, by default the encoder's own limit (whole sentences, as
    SentEval encodes them), not the training `max_seq_length`. The model stays on its device; its
    train/eval mode is restored afterwards, so the trainer can call this mid-training.

    Returns:
        `(len(sentences), hidden)` float32 CPU tensor.
    """
    was_training = model.training
    model.eval()
    try:
        max_length = resolve_max_length(tokenizer, getattr(model, "online_encoder", model).config, max_length)
        return encode_batches(
            mocose_embed(model),
            tokenizer,
            sentences,
            _device_of(model),
            batch_size=batch_size,
            max_length=max_length,
            show_progress=show_progress,
        )
    finally:
        model.train(was_training)


def pooled_embed(encoder: nn.Module, pooling: str, dense: nn.Linear | None) -> EmbedFn:
    """Embedding function: `encoder`'s last hidden state pooled with the shared pooling code."""
    takes_token_types = accepts_token_types(encoder)

    def embed(ids, mask, token_type_ids):
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if token_type_ids is not None and takes_token_types:
            kwargs["token_type_ids"] = token_type_ids
        hidden = encoder(**kwargs).last_hidden_state  # (batch, seq, hidden)
        return pool_sentence_embedding(hidden, mask, pooling, dense=dense)

    return embed


__all__ = [
    "EmbedFn",
    "accepts_token_types",
    "encode_batches",
    "encode_with_model",
    "length_sorted_order",
    "mocose_embed",
    "pooled_embed",
    "resolve_max_length",
]

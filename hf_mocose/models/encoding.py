"""The sentence embedding of a loaded `MoCoSEModel`, in batches, and the length sentences are cut at.

`hf-mocose evaluate` encodes with `SentenceTransformer.encode` (`evaluation/runner.py`). This module
serves the callers that hold a model object rather than a folder: the trainer's STS evaluation (mid-training)
and the export's check against `MoCoSEModel.embed`. Like sentence-transformers: length-sorted batches,
``model.eval()``, no gradient; the embeddings come back in float32.
"""

from __future__ import annotations

import torch


def resolve_max_length(tokenizer, config=None, max_length: int | None = None) -> int:
    """Truncation length: `max_length` if given, else the tokenizer's limit, capped by the model's
    position embeddings (tokenizers often report a huge sentinel value)."""
    # Ours, not the Transformer module's `max_seq_length`: that caps by `max_position_embeddings` without
    # RoBERTa's padding offset (inputs one or two tokens too long), and not at all for a MoCoSE config.
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
def encode_with_model(model, tokenizer, sentences: list[str], batch_size: int = 64,
                      max_length: int | None = None) -> torch.Tensor:
    """Sentence embeddings from a MoCoSE model (``model.embed``: online encoder + its sentence_pooling).

    Sentences are truncated at `max_length`, by default the encoder's own limit (whole sentences, as
    SentEval encodes them), not the training `max_seq_length`. The model stays on its device; its
    train/eval mode is restored afterwards, so the trainer can call this mid-training.

    Returns:
        `(len(sentences), hidden)` float32 CPU tensor, rows in the order of `sentences`.
    """
    # Ours, not `SentenceTransformer.encode`: its Transformer module loads a model from a folder; it cannot
    # take the live model the trainer is training (on its device, unwrapped, its train mode given back).
    if not sentences:
        raise ValueError("nothing to encode: the sentence list is empty")
    max_length = resolve_max_length(tokenizer, getattr(model, "online_encoder", model).config, max_length)
    device = next(model.parameters()).device
    order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))  # longest first, as sentence-transformers
    out: list[torch.Tensor] = [None] * len(sentences)  # type: ignore[list-item]
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = tokenizer([sentences[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                              return_tensors="pt").to(device)
            embeddings = model.embed(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
            for row, i in zip(embeddings.float().cpu(), idx):
                out[i] = row
    finally:
        model.train(was_training)
    return torch.stack(out)


__all__ = ["encode_with_model", "resolve_max_length"]

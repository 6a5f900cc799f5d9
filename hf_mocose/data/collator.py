"""Batching for contrastive training: padding, plus each anchor's hard negative (UNA) when asked for."""

from __future__ import annotations

import zlib

import numpy as np
import torch
from transformers import DataCollatorWithPadding

# Raw sentences kept beside the tokens for UNA (the anchors, and given positives for its statistics).
TEXT_COLUMNS = ("text", "positive_text")


class ContrastiveCollator:
    """Pads tokenised sentences; with a UNA augmenter, also tokenises each sentence's hard negative.

    Features are dicts with `input_ids`, `attention_mask` (...), `text` when hard negatives
    are on, IFCL's `fraternal_input_ids` / `fraternal_attention_mask` (already padded to
    `max_length`, stacked as they are), and given positives' `positive_input_ids` (...), padded apart. The negatives come out as `negative_input_ids`, `negative_attention_mask` (and
    `negative_token_type_ids`) `(B, L)`. Their randomness is seeded by `seed` and the batch's
    own text, so it is the same in every dataloader worker, after a resume, and on every rank.

    Args:
        tokenizer: the model's tokenizer.
        max_length: truncation length (`max_seq_length`).
        pad_to_max_length: pad every batch to `max_length` (FGSM "previous" needs fixed shapes).
        una_augmenter: a `hf_mocose.methods.una.UNAAugmenter`, or None for no hard negatives.
        seed: base seed of the hard-negative draws.
    """

    def __init__(self, tokenizer, max_length: int, pad_to_max_length: bool = False, una_augmenter=None, seed: int = 0):
        self.tokenizer, self.max_length = tokenizer, max_length
        self.padding = "max_length" if pad_to_max_length else "longest"
        self.padder = DataCollatorWithPadding(
            tokenizer, padding=self.padding, max_length=max_length if pad_to_max_length else None
        )
        self.una_augmenter, self.seed = una_augmenter, seed

    def __call__(self, features: list[dict]) -> dict:
        texts = [feature["text"] for feature in features] if "text" in features[0] else None
        tokens = [k for k in features[0] if k not in TEXT_COLUMNS]
        fixed = [k for k in tokens if k.startswith("fraternal_")]  # already padded to max_length
        positive = [k for k in tokens if k.startswith("positive_")]  # padded on their own
        own = [k for k in tokens if k not in fixed and k not in positive]
        batch = self.padder([{k: f[k] for k in own} for f in features])
        for name in fixed:
            batch[name] = torch.tensor([feature[name] for feature in features])
        if positive:
            padded = self.padder([{k[len("positive_"):]: f[k] for k in positive} for f in features])
            batch.update({f"positive_{name}": tensor for name, tensor in padded.items()})
        if self.una_augmenter is not None:
            if texts is None:
                raise ValueError("Hard negatives need the sentences' text: keep the `text` column in the dataset.")
            rng = np.random.default_rng([self.seed, zlib.crc32("\n".join(texts).encode())])
            negatives = self.tokenizer(
                self.una_augmenter.augment(texts, rng=rng), truncation=True, max_length=self.max_length,
                padding=self.padding, return_tensors="pt",
            )
            for name, tensor in negatives.items():
                batch[f"negative_{name}"] = tensor
        return batch
